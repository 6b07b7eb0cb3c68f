"""The complete tensor-parallel plan as data (embedding, sequence-parallel norms, output head
under loss_parallel), activation checkpointing (none, selective, full) and per-block
compilation as cell fields with their identity, refused early where they cannot run. On real
gloo ranks, in test_torch_parallel_ranks (one run of llama3_debug's ranks for every strategy,
to save interpreter starts): the complete plan's losses and 1/t state (llama3_debug under tp and
fsdp+tp, gpt2_tiny's tied head), under AdamW and, in the same processes, plain SGD (no
momentum, no clipping: a check that sees a wrong gradient scale, such as the replicated norm
weights' partial gradients averaged instead of summed), and activation checkpointing's losses
and the activations it keeps against the predicted ones."""

from __future__ import annotations

import copy

import pytest

from dlscale.study.cell import Cell
from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study

from .test_torch_parallel import parallel_config


# ---- the plan as data ---------------------------------------------------------------------------
def test_a_plan_names_only_known_styles_and_one_loss_parallel_head():
    from dlscale.registry.strategies import TP_STYLES, ParallelPlan, RegistryError

    with pytest.raises(RegistryError, match="'diagonal'.*allowed styles: " + ", ".join(TP_STYLES)):
        ParallelPlan(tp_complete={"blocks.*.fc": "diagonal"})
    with pytest.raises(RegistryError, match="allowed styles of the blocks plan: colwise, rowwise"):
        ParallelPlan(tp={"norm": "sequence_parallel"})
    with pytest.raises(RegistryError, match="one output head"):
        ParallelPlan(tp_complete={"a": "output_loss_parallel", "b": "output_loss_parallel"})
    plan = ParallelPlan(tp={"fc": "colwise"})
    assert plan.best_tp_plan == "blocks" and not plan.loss_parallel
    with pytest.raises(ValueError, match="no complete tensor-parallel plan"):
        plan.tp_plan("complete")
    with pytest.raises(ValueError, match="'half'; allowed values: blocks, complete"):
        plan.tp_plan("half")


def test_the_decoders_offer_the_complete_plan_and_transformer_small_keeps_its_own():
    from dlscale.models.parallelize import plan_for

    for arch, head in (("llama", "output"), ("gpt", "head")):
        plan = plan_for(arch)
        assert plan.best_tp_plan == "complete" and plan.loss_parallel and plan.sequence_parallel
        assert plan.tp_complete[head] == "output_loss_parallel"
    assert plan_for("transformer").best_tp_plan == "blocks"  # fused in_proj: kept as it was


# ---- the study: fields, identity, refusals -------------------------------------------------------
def test_tp_cells_of_the_decoders_get_the_complete_plan_a_new_identity(root, base_config):
    config = parallel_config(
        base_config,
        model=["transformer_small", "gpt2_tiny", "llama3_debug"],
        parallelism=["ddp", "tp", "fsdp+tp"],
        mode=["eager", "compiled"],
    )
    cells = load_study(config, root).cells
    for cell in cells:
        complete = cell.parallelism != "ddp" and cell.model != "transformer_small"
        assert cell.tp_plan == ("complete" if complete else "blocks")
        assert ("tp_plan" in cell.identity()) is complete  # "blocks": every cell before
        block = cell.mode == "compiled"  # each model here names its blocks
        assert cell.compile_scope == ("block" if block else "model")
        assert ("compile_scope" in cell.identity()) is block
        assert cell.activation_checkpointing == "none"
        assert "activation_checkpointing" not in cell.identity()
        assert Cell.from_json(cell.to_json()) == cell


def test_activation_checkpointing_is_a_study_key_in_its_cells_identity(root, base_config):
    plain = load_study(parallel_config(base_config, parallelism=["ddp"]), root)
    stated = load_study(
        parallel_config(base_config, parallelism=["ddp"], activation_checkpointing="none"), root
    )
    assert [c.to_json() for c in stated.cells] == [c.to_json() for c in plain.cells]
    assert stated.config_hash == plain.config_hash
    full = load_study(
        parallel_config(base_config, parallelism=["ddp"], activation_checkpointing="full"), root
    )
    assert full.config_hash != plain.config_hash
    for old, new in zip(plain.cells, full.cells, strict=True):
        assert new.activation_checkpointing == "full"
        assert new.identity() == {**old.identity(), "activation_checkpointing": "full"}


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"activation_checkpointing": "half"},
            "activation_checkpointing: 'half' is not allowed; allowed values: none, selective, "
            "full",
        ),
        (
            {"activation_checkpointing": "full", "model": ["cnn_small"], "parallelism": ["ddp"]},
            "activation_checkpointing: 'full' checkpoints a model's blocks, and model "
            "'cnn_small' names none .*allowed values for a study with cnn_small: none",
        ),
        (
            {
                "activation_checkpointing": "selective",
                "framework": ["pytorch", "tensorflow"],
                "parallelism": ["ddp"],
            },
            "activation_checkpointing: 'selective' is run by framework\\(s\\) pytorch, not "
            "'tensorflow'; allowed values for a study with tensorflow: none",
        ),
        (
            {"activation_checkpointing": "full", "parallelism": ["ddp", "pp"]},
            "activation_checkpointing: 'full' with parallelism 'pp': the pipeline runs its "
            "stages without checkpointing; allowed values for a study with pp: none",
        ),
        (
            {"model": ["gpt2_tiny"], "seq_len": 31, "parallelism": ["tp"]},
            "splits the sequence \\(31 tokens\\) over tensor-parallel degree 2 .*allowed "
            "tp_degree: a divisor of 31, or seq_len: a multiple of 2",
        ),
    ],
)
def test_what_cannot_run_is_refused_before_any_job(root, base_config, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_study(parallel_config(base_config, **changes), root)


# ---- per-block compilation ----------------------------------------------------------------------
def test_compiled_cells_compile_each_block_before_any_wrapper(monkeypatch):
    """compile_blocks (torchtitan's per-block compile): each block's call compiled in place
    (nn.Module.compile: its parameter names kept, so fully_shard and the seeded materialisation
    find them), the root not; the step's forward is then the module itself. torch.compile is
    recorded, not run: importing torch._dynamo alone takes seconds and inductor on CPUs longer
    than this test may (a compiled llama3_debug cell runs in the GPU check)."""
    import torch

    from dlscale.frameworks.torch_model import TorchModel
    from dlscale.frameworks.torch_parallel import compile_blocks
    from dlscale.models.torch import build

    compiled = []

    def record(fn, *args, **kwargs):
        compiled.append(getattr(fn, "__self__", fn))
        return fn

    monkeypatch.setattr(torch, "compile", record)
    model = build("llama3_debug")
    names = [n for n, _ in model.named_parameters()]
    assert compile_blocks(model, "llama") == ["layers.0", "layers.1"]
    assert compiled == list(model.layers)  # each block, nothing else
    assert all(block._compiled_call_impl is not None for block in model.layers)
    assert model._compiled_call_impl is None
    assert [n for n, _ in model.named_parameters()] == names

    class AdapterPart:  # the part of an adapter compile_forward reads
        compiled = True
        compiles_blocks = TorchModel.compiles_blocks
        compile_forward = TorchModel.compile_forward

        class spec:
            compile_scope = "block"

    compiled.clear()
    assert AdapterPart().compile_forward(model) is model and compiled == []
    AdapterPart.spec.compile_scope = "model"
    AdapterPart().compile_forward(model)
    assert compiled == [model]


def test_a_study_with_activation_checkpointing_runs_its_cells_with_it(root, base_config):
    """The cell's field reaches the ranks: TrainSpec.from_cell carries it (and the plan and the
    compile scope)."""
    from dlscale.frameworks.train_spec import TrainSpec

    config = copy.deepcopy(
        parallel_config(
            base_config,
            model=["llama3_debug"],
            parallelism=["fsdp+tp"],
            activation_checkpointing="selective",
        )
    )
    cell = load_study(config, root).cells[0]
    spec = TrainSpec.from_cell(cell)
    assert (spec.activation_checkpointing, spec.tp_plan, spec.compile_scope) == (
        "selective",
        "complete",
        "model",
    )


def test_a_tp_cell_measured_with_the_blocks_plan_is_flagged_when_the_complete_plan_is_planned(
    tmp_path, monkeypatch
):
    """A tp cell's metrics without tp_plan ran the blocks plan (its LATER_FIELDS value), so
    the planned complete-plan cell differs (dlscale.store.measurements.changed_cells) and is
    never taken for measured; a compiled cell likewise for compile_scope."""

    from dlscale.store.measurements import changed_cells

    from helpers.cells import cell_dict, measured_before

    monkeypatch.chdir(tmp_path)
    old = Cell.from_dict(
        cell_dict(model="llama3_debug", seq_len=64, parallelism="tp", tp_degree=2, mode="compiled")
    )
    measured_before(tmp_path, old)
    assert "tp_plan" not in old.as_dict() and "compile_scope" not in old.as_dict()
    assert changed_cells([old]) == []
    planned = Cell.from_dict({**old.as_dict(), "tp_plan": "complete", "compile_scope": "block"})
    ((cell, diff),) = changed_cells([planned])
    assert cell == planned
    assert diff == {"tp_plan": ("blocks", "complete"), "compile_scope": ("model", "block")}
