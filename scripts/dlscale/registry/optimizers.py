"""What an optimizer is: one `Optimizer` record each (config `optimizer.name`), and the rule
that picks one per model where the study says `auto` (the default).

The optimizer is a study choice. `auto` trains each model the way its field trains it: AdamW
with gradient-norm clipping for the decoder-only language models (GPT-2, Llama: what torchtitan
and Megatron-LM train them with), SGD with momentum for every other model (the vision models
and the encoder, as every cell was trained before the choice existed). A study may name one
optimizer for all of its cells instead (`optimizer.name: sgd` or `adamw`).

Identity (docs/pages/decisions/changed-defaults.md): the cell field `optimizer` defaults to
"sgd", the optimizer of every cell measured before the choice existed, so a cell that trains
with SGD keeps its path, identity and hash. Under `auto` the decoder models' cells train with
AdamW, a new identity, and a study measured with SGD re-measures them only when asked
(dlscale.store.measurements.changed_cells flags them). Of the shipped studies these are the
gpt2_tiny throughput cells of the demo (config/config.yaml: 8 cells) and of the parallelism
study (config/studies/parallelism.yaml: 10 cells); every other shipped cell is unchanged.

AdamW runs in PyTorch only: a framework record names the optimizers its adapter builds
(dlscale.registry.frameworks, `optimizers`), and a cell with another is refused before any job
(Horovod's DistributedOptimizer would average the gradients inside its own step, after a
clipping hook would have read them; TensorFlow, Keras and MXNet build no decoder model). Their
cells keep SGD, which `auto` gives every model they build.

Standard library only (the ground floor, dlscale.registry)."""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"  # config optimizer.name: each model its field's optimizer (optimizer_for)
DEFAULT_OPTIMIZER = "sgd"  # every cell measured before the choice existed (Cell.optimizer)


@dataclass(frozen=True)
class Optimizer:
    """One optimizer.

    - name: its value in config `optimizer.name` and a cell's `optimizer` field;
    - state: the tensors it keeps per parameter, float32 each (PyTorch allocates them like
      the parameter at the first step);
    - state_bytes_per_param: their bytes per parameter (4 per float32 tensor); SGD's momentum
      buffer exists only where momentum > 0 (state_bytes);
    - torch: the PyTorch class the adapter builds;
    - settings: the config keys (under `optimizer`) it reads besides learning_rate.
    """

    name: str
    state: tuple[str, ...]
    state_bytes_per_param: int
    torch: str
    settings: tuple[str, ...]

    def state_bytes(self, params: int, momentum: float | None = None) -> int:
        """Bytes of its state for `params` parameters (float32): SGD without momentum keeps
        none (torch.optim.SGD allocates no momentum_buffer)."""
        if self.name == "sgd" and not momentum:
            return 0
        return self.state_bytes_per_param * int(params)


OPTIMIZERS = {
    o.name: o
    for o in (
        Optimizer("sgd", ("momentum_buffer",), 4, "torch.optim.SGD", ("momentum",)),
        Optimizer(
            "adamw",
            ("exp_avg", "exp_avg_sq"),
            8,
            "torch.optim.AdamW",
            ("betas", "eps", "weight_decay", "grad_clip_norm"),
        ),
    )
}

# The model family whose field trains it with AdamW (dlscale.models.DECODER): `auto`'s rule.
ADAMW_FAMILIES = ("decoder",)


def optimizer_for(name: str, family: str) -> str:
    """The optimizer a cell of a model of `family` trains with under config `optimizer.name`
    `name`: the name itself, or for `auto` AdamW for the decoder models and SGD otherwise."""
    if name == AUTO:
        return "adamw" if family in ADAMW_FAMILIES else "sgd"
    if name not in OPTIMIZERS:
        raise ValueError(
            f"optimizer.name: {name!r} is not an optimizer; allowed: {', '.join(names())}"
        )
    return name


def names() -> list[str]:
    """The values of config `optimizer.name`: auto, then every optimizer."""
    return [AUTO, *OPTIMIZERS]
