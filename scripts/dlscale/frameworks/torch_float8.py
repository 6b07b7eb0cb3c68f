"""Precision float8 of a PyTorch cell: torchao's float8 linears (convert_to_float8_training,
dynamic tensor-wise scaling, as torchtitan's `float8` converter), the output head excluded, and
under fully_shard the float8 all-gather of the sharded weights
(Float8LinearConfig.enable_fsdp_float8_all_gather, with the scales precomputed for the next
step after each optimizer step: precompute_float8_dynamic_scale_for_fsdp). The rest of the step
runs in bf16 (autocast or FSDP2's MixedPrecisionPolicy, as a bf16 cell).

torchao is no dependency of the driver's environment (envs/pytorch.txt is in every PyTorch
cell's identity): a float8 cell runs in `<environment>-float8` (envs/pytorch-cuda-float8.txt:
the CUDA environment's pins and torchao), which is its identity. The study refuses float8 where
it cannot run (dlscale.study.matrix_checks.llm_step_problems)."""

from __future__ import annotations

from torch import nn

FLOAT8_METHOD = (
    "torchao.float8.convert_to_float8_training (dynamic tensor-wise scaling, e4m3 forward, "
    "e5m2 gradients) of every Linear but the output head and those whose sizes are not "
    "multiples of 16"
)


def convertible(module: nn.Module, name: str, vocab_size: int | None) -> bool:
    """Whether a Linear is converted: not the output head (its out_features the vocabulary, as
    torchtitan leaves `output` alone) and both sizes multiples of 16 (float8 matrix products)."""
    if not isinstance(module, nn.Linear):
        return False
    if vocab_size is not None and module.out_features == vocab_size:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert(model: nn.Module, vocab_size: int | None, sharded: bool) -> dict:
    """Convert the model's Linear layers in place (on any device, meta included: the module
    classes change, the parameters stay); returns what was done, as the rank records it."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    converted, kept = [], []
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, module in linears:
        (converted if convertible(module, name, vocab_size) else kept).append(name)
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=sharded)
    convert_to_float8_training(
        model,
        config=config,
        module_filter_fn=lambda module, fqn: convertible(module, fqn, vocab_size),
    )
    import torchao

    return {
        "method": FLOAT8_METHOD,
        "torchao": torchao.__version__,
        "converted": converted,
        "kept_in_bf16": kept,
        "fsdp_float8_all_gather": sharded,
    }


def scale_precompute_hook(model: nn.Module):
    """An optimizer step post-hook that precomputes the float8 scales of the sharded weights
    for the next all-gather (torchao's precompute_float8_dynamic_scale_for_fsdp), as torchtitan
    does after each optimizer step."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    def hook(optimizer, args, kwargs):
        precompute_float8_dynamic_scale_for_fsdp(model)

    return hook
