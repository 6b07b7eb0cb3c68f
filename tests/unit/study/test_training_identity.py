"""The changed defaults and the identity rule (docs/pages/decisions/changed-defaults.md): the
optimizer is a study choice whose default (`auto`) trains the decoders with AdamW, bf16/fp16
cells under fully_shard take FSDP2's mixed precision, pp cells run 1F1B and tp cells of a model
with a complete plan run it. Every shipped cell that still trains as before keeps its path,
config hash and Cell.to_json byte for byte; a changed cell differs in exactly the changed
default's fields; a framework without AdamW is refused before any job.

tests/fixtures/shipped_identities.json holds the shipped studies' cells as they were before the
first changed default, the optimizer (commit a795eb5; written by loading each study with
dlscale.study.matrix.load_workflow_study there: per path the config hash and the SHA-256 of
Cell.to_json, the decoder cells' JSON in full)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

import pytest

from dlscale.study.cell import Cell
from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study, load_workflow_study

STUDY_FILES = {
    "config/config.yaml": None,
    "config/studies/frameworks.yaml": "config/studies/frameworks.yaml",
    "config/studies/parallelism.yaml": "config/studies/parallelism.yaml",
    "tests/fixtures/tiny.yaml": "tests/fixtures/tiny.yaml",
}
ADAMW_FIELDS = {
    "optimizer": "adamw",
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "adam_eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip_norm": 1.0,
}
# The changed default tp_plan: a tp or fsdp+tp cell of a model with a complete tensor-parallel
# plan (the decoders) runs it, a new identity; the shipped ones are the parallelism study's
# gpt2_tiny cells (already re-measured for AdamW) and its llama3_debug cells (gained after the
# fixture) of tp and fsdp+tp at 1 and 2 nodes.
COMPLETE_TP = {"tp_plan": "complete"}
COMPLETE_TP_STRATEGIES = ("tp", "fsdp+tp")


def without_complete_tp(cell: Cell, fields: dict) -> dict:
    """A cell's JSON fields without tp_plan, which only its tp and fsdp+tp cells of a model
    with a complete plan have."""
    has = {k: fields[k] for k in COMPLETE_TP if k in fields}
    assert has == (COMPLETE_TP if cell.parallelism in COMPLETE_TP_STRATEGIES else {}), cell.path
    return {k: v for k, v in fields.items() if k not in COMPLETE_TP}


# The shipped cells `auto` re-measures (AdamW, a new identity): the demo's gpt2_tiny throughput
# cells (2 node counts x 2 policies x 2 repetitions) and the parallelism study's (5 strategies
# x 2 node counts; pp excludes the decoder).
REMEASURED = {"config/config.yaml": 8, "config/studies/parallelism.yaml": 10}
# The changed defaults pp_schedule and microbatches: a pp cell runs 1F1B over at least twice
# its stages' micro-batches (GPipe over as many as stages at the fields' defaults). The
# parallelism study's transformer_small pp cells (1 and 2 nodes) re-measure; only these two
# fields differ.
REMEASURED_PIPELINES = {"config/studies/parallelism.yaml": 2}


@pytest.fixture
def before(root):
    return json.loads((root / "tests" / "fixtures" / "shipped_identities.json").read_text())


def shipped(root, name: str, **cli):
    study_file = STUDY_FILES[name]
    return load_workflow_study({**({"study_file": study_file} if study_file else {}), **cli}, root)


# the parallelism study gained the llama3_debug cells (the Llama family): new cells, the
# measured ones planned as they were
GAINED_CELLS = {"config/studies/parallelism.yaml": "llama3_debug"}


@pytest.mark.parametrize("name", list(STUDY_FILES))
def test_shipped_cells_keep_their_identity_but_the_decoders_optimizer(root, before, name):
    old = before["studies"][name]
    study = shipped(root, name)
    if name in GAINED_CELLS:  # a study file that gained cells: its summary hash moved
        assert study.config_hash != old["config_hash"]
        models = study.config["axes"]["model"]
        assert GAINED_CELLS[name] in models
    else:
        assert study.config_hash == old["config_hash"]
    cells = {c.path: c for c in study.cells}
    assert set(old["cells"]) <= set(cells)  # every cell measured before is still planned
    remeasured, pipelines = [], []
    for path, was in old["cells"].items():
        cell = cells[path]
        text = cell.to_json()
        if cell.pp_degree > 1:  # a pp cell: its schedule and micro-batches, a new identity
            pipelines.append(path)
            assert (cell.pp_schedule, cell.microbatches) == ("1f1b", 2 * cell.pp_degree)
            # at the old values (GPipe, as many micro-batches as stages, as many stages as
            # ranks: the study's pp_degree was null, 2 since the combinations) it is the cell
            # measured before, byte for byte
            stages = cell.world_size
            then = dataclasses.replace(
                cell, pp_schedule="gpipe", microbatches=stages, pp_degree=stages
            )
            assert hashlib.sha256(then.to_json().encode()).hexdigest() == was["to_json_sha256"]
            assert then.config_hash == was["config_hash"]
            assert cell.config_hash != was["config_hash"] and cell.path == path
            continue
        if (
            "to_json" not in was
            or hashlib.sha256(text.encode()).hexdigest() == (was["to_json_sha256"])
        ):
            assert hashlib.sha256(text.encode()).hexdigest() == was["to_json_sha256"], path
            assert cell.config_hash == was["config_hash"], path
            continue
        # a decoder cell: AdamW (with its settings) is all that differs (and, under tp and
        # fsdp+tp, the complete plan), and so its hash
        remeasured.append(path)
        now, then = without_complete_tp(cell, json.loads(text)), json.loads(was["to_json"])
        assert {k: now[k] for k in ADAMW_FIELDS} == ADAMW_FIELDS
        for d in (now, then):
            d.pop("config_hash")
        assert {k: v for k, v in now.items() if k not in ADAMW_FIELDS} == then
        assert cell.config_hash != was["config_hash"]
        assert cell.model == "gpt2_tiny" and cell.path == path
    print(
        f"{name}: {len(remeasured)} decoder cells and {len(pipelines)} pp cells re-measured, "
        f"{len(old['cells'])} cells"
    )
    assert len(remeasured) == REMEASURED.get(name, 0)
    assert len(pipelines) == REMEASURED_PIPELINES.get(name, 0)


def test_optimizer_sgd_keeps_every_shipped_cell(root, before):
    """A study that names SGD trains its decoders as before: every cell, decoders included,
    byte-identical (but the pp cells, whose schedule and micro-batches changed)."""
    for name in ("config/config.yaml", "config/studies/parallelism.yaml"):
        study = shipped(root, name, optimizer={"name": "sgd"})
        old = before["studies"][name]["cells"]
        for cell in study.cells:
            if cell.path not in old or cell.pp_degree > 1:
                continue
            if cell.tp_plan == "complete":  # the complete plan: a new identity
                then = json.loads(old[cell.path]["to_json"])
                now = without_complete_tp(cell, json.loads(cell.to_json()))
                assert {k: v for k, v in now.items() if k != "config_hash"} == {
                    k: v for k, v in then.items() if k != "config_hash"
                }
                assert cell.config_hash != old[cell.path]["config_hash"]
                continue
            assert cell.to_json() == old[cell.path].get("to_json", cell.to_json())
            assert cell.config_hash == old[cell.path]["config_hash"]


def test_the_optimizer_settings_enter_only_adamw_cells(root, base_config):
    config = copy.deepcopy(base_config)
    stated = copy.deepcopy(config)
    stated["optimizer"] = {"name": "auto", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    plain, defaults = load_study(config, root), load_study(stated, root)
    assert [c.to_json() for c in plain.cells] == [c.to_json() for c in defaults.cells]
    assert plain.config_hash == defaults.config_hash
    stated["optimizer"]["betas"] = [0.9, 0.99]
    changed = load_study(stated, root)
    assert changed.config_hash != plain.config_hash
    for old, new in zip(plain.cells, changed.cells, strict=True):
        if old.optimizer == "adamw":
            assert new.adam_beta2 == 0.99 and new.config_hash != old.config_hash
        else:  # SGD cells read no AdamW setting
            assert new.to_json() == old.to_json()
    stated["optimizer"]["grad_clip_norm"] = None  # no clipping
    unclipped = load_study(stated, root)
    adamw = [c for c in unclipped.cells if c.optimizer == "adamw"]
    assert adamw and {c.grad_clip_norm for c in adamw} == {None}
    assert Cell.from_json(adamw[0].to_json()) == adamw[0]


def test_fsdp_mixed_precision_is_a_new_identity_only_for_bf16_cells_under_fully_shard(
    root, base_config
):
    config = copy.deepcopy(base_config)
    config["workloads"] = ["throughput"]
    config["axes"].update(
        model=["gpt2_tiny"], precision=["fp32", "bf16"], parallelism=["ddp", "fsdp", "hsdp"]
    )
    config["ranks_per_node"] = 2
    cells = load_study(config, root).cells
    for cell in cells:
        expected = cell.precision == "bf16" and cell.parallelism in ("fsdp", "hsdp")
        assert cell.fsdp_mixed_precision is expected
        assert ("fsdp_mixed_precision" in cell.identity()) is expected
        assert Cell.from_json(cell.to_json()) == cell


def test_a_framework_without_adamw_is_refused_before_any_job(root, base_config):
    config = copy.deepcopy(base_config)
    config["workloads"] = ["throughput"]
    config["axes"].update(framework=["pytorch", "horovod"], model=["cnn_small", "gpt2_tiny"])
    with pytest.raises(ConfigError) as info:
        load_study(copy.deepcopy(config), root)
    message = str(info.value)
    assert (
        "optimizer.name: 'auto' (auto: adamw for the decoder models) trains model 'gpt2_tiny' "
        "with adamw, which framework 'horovod' does not run (it runs: sgd); frameworks that "
        "run adamw: pytorch (or set optimizer.name: sgd, or exclude {framework: horovod, "
        "model: gpt2_tiny})"
    ) in message
    assert "cnn_small" not in message  # SGD for the vision model: horovod runs it
    excluded = copy.deepcopy(config)
    excluded["exclude"] = [{"framework": "horovod", "model": "gpt2_tiny"}]
    assert {c.optimizer for c in load_study(excluded, root).cells} == {"sgd", "adamw"}
    sgd = copy.deepcopy(config)
    sgd["optimizer"] = {"name": "sgd"}
    assert {c.optimizer for c in load_study(sgd, root).cells} == {"sgd"}
    explicit = copy.deepcopy(config)
    explicit["optimizer"] = {"name": "adamw"}
    with pytest.raises(ConfigError, match="trains model 'cnn_small' with adamw, which framework"):
        load_study(explicit, root)
    bad = copy.deepcopy(config)
    bad["optimizer"] = {"name": "lamb"}
    with pytest.raises(ConfigError, match="optimizer.name.*'lamb'.*auto.*sgd.*adamw"):
        load_study(bad, root)


def test_a_decoder_cell_measured_with_sgd_is_flagged_when_auto_plans_adamw(tmp_path, monkeypatch):
    """A metrics file written before the choice has no optimizer field: it was SGD, so the
    planned AdamW cell differs (and the other way round); another later field the file lacks
    is still not compared."""
    from dlscale.store.measurements import changed_cells

    from helpers.cells import cell_dict, measured_before

    monkeypatch.chdir(tmp_path)
    old = Cell.from_dict(cell_dict(model="gpt2_tiny", seq_len=32))
    measured_before(tmp_path, old)
    assert "optimizer" not in old.as_dict()
    assert changed_cells([old]) == []
    # a later field that is no changed default: not compared where the file lacks it
    assert changed_cells([Cell.from_dict({**old.as_dict(), "srun_options": ["-v"]})]) == []
    planned = Cell.from_dict({**old.as_dict(), **ADAMW_FIELDS})
    ((cell, diff),) = changed_cells([planned])
    assert cell == planned and diff["optimizer"] == ("sgd", "adamw")
    measured_before(tmp_path, planned)  # the other way round
    ((_, diff),) = changed_cells([old])
    assert diff == {"optimizer": ("adamw", "sgd")}
