"""The script workload when a study is parsed: its cells, their identity, and every hostile
setting refused before anything of the script runs, naming the key."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from dlscale.study import script_patterns, script_workload
from dlscale.study.cell import Cell, parse_cell_path
from dlscale.study.config import ConfigError, load_schema, load_yaml, validate_config
from dlscale.study.hardware import validate_hardware
from dlscale.study.matrix import build_matrix

from helpers.checkout import ROOT

# The script writes this file when it runs: no refusal below may run it.
CANARY = "ran.txt"
SCRIPT_TEXT = f"open({CANARY!r}, 'w').write('ran')\nprint('throughput: 1.5 samples/s')\n"
PATTERN = "throughput: (?P<value>[0-9.]+) samples/s"


def _study(checkout, script: dict, **top) -> dict:
    return {
        "study": "scripts",
        "workloads": ["script"],
        "axes": {"hardware": ["cpu"], "nodes": [1, 2], "policy": ["weak"]},
        "repetitions": 1,
        **top,
        "script": {"scripts": {"mine": script}},
    }


def _script(**changes) -> dict:
    return {
        "script": "train/train.py",
        "command": ["{python}", "{script}", "--batch", "{per_rank_batch}", "--out", "{output_dir}"],
        "throughput": {"pattern": PATTERN},
        **changes,
    }


def _build(checkout, config: dict):
    schema = load_schema(ROOT / "config" / "schemas" / "config.schema.json")
    hardware = validate_hardware(
        load_yaml(ROOT / "config" / "hardware.yaml"),
        load_schema(ROOT / "config" / "schemas" / "hardware.schema.json"),
    )
    return build_matrix(validate_config(config, schema), hardware, workflow_dir=checkout)


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout holding a script (train/train.py, with a helper module beside it) and, outside
    it, another script."""
    root = tmp_path / "checkout"
    (root / "train").mkdir(parents=True)
    (root / "train" / "train.py").write_text(SCRIPT_TEXT)
    (root / "train" / "helper.py").write_text("WIDTH = 8\n")
    (tmp_path / "outside.py").write_text(SCRIPT_TEXT)
    (root / "train" / "link.py").symlink_to(tmp_path / "outside.py")
    monkeypatch.chdir(root)  # a script that ran would leave the canary here
    return root


def test_script_cells_carry_the_script_and_its_content_hash(checkout):
    study = _build(checkout, _study(checkout, _script()))
    assert [c.path for c in study.cells] == [
        f"results/scripts/script/cpu/mine/script/weak/fp32/eager/n{n}/r1/metrics.jsonl"
        for n in (1, 2)
    ]
    cell = study.cells[1]
    script = dict(cell.script)
    assert (cell.workload, cell.framework, cell.model, cell.world_size) == (
        "script",
        "mine",
        "script",
        2,
    )
    assert script["command"][0] == "{python}" and script["source"] == "pattern"
    assert script["files"] == 3  # the script, its helper and the link's target: its folder
    assert parse_cell_path(cell.path)["workload"] == "script"
    assert Cell.from_json(cell.to_json()) == cell
    # the script's folder is hashed with it: editing the helper changes the identity
    (checkout / "train" / "helper.py").write_text("WIDTH = 16\n")
    again = _build(checkout, _study(checkout, _script())).cells[1]
    assert dict(again.script)["sha256"] != script["sha256"]
    assert again.config_hash != cell.config_hash
    assert not (checkout / CANARY).exists()


def test_an_edited_script_re_measures_but_another_command_stops(checkout):
    """Only the content hash moved: re-measured unasked (split_script_edits); the argv changed:
    a changed cell like any other, which stops the run unless remeasure=True."""
    cell = _build(checkout, _study(checkout, _script())).cells[0]
    edited = dataclasses.replace(cell, script={**dict(cell.script), "sha256": "0" * 64})
    argv = dataclasses.replace(cell, script={**dict(cell.script), "command": ["{python}", "x"]})
    changed = [
        (c, {"script": (cell.identity()["script"], c.identity()["script"])}) for c in (edited, argv)
    ]
    auto, rest = script_workload.split_script_edits(changed)
    assert [c for c, _ in auto] == [edited] and [c for c, _ in rest] == [argv]
    assert "script mine changed (sha256" in script_workload.edits_notice(auto)


def test_a_study_without_scripts_keeps_its_hash(root):
    """The script section's defaults enter no study's hash unless it lists the workload."""
    from dlscale.study.matrix import load_study

    with open(root / "tests" / "fixtures" / "tiny.yaml") as fh:
        tiny = yaml.safe_load(fh)
    plain = load_study(copy.deepcopy(tiny), root)
    with_section = load_study({**copy.deepcopy(tiny), "script": {"seed": 7}}, root)
    assert plain.config_hash == with_section.config_hash
    assert [c.to_json() for c in plain.cells] == [c.to_json() for c in with_section.cells]


def _json(**changes) -> dict:
    return {"json": "steps.jsonl", **changes}


# (what is wrong, the script's settings, study keys, the key the refusal names, its words)
HOSTILE = [
    (
        "a shell line",
        _script(command="python train.py && rm -rf ~"),
        {},
        "command",
        "must be a list",
    ),
    (
        "shell operators in an item",
        _script(command=["{python}", "{script}", "--out", "x; rm -rf ~"]),
        {},
        "command[3]",
        "shell syntax",
    ),
    (
        "a shell as program",
        _script(command=["bash", "-c", "python x.py"]),
        {},
        "command[0]",
        "shell",
    ),
    ("a variable", _script(command=["{python}", "$HOME/x.py"]), {}, "command[1]", "shell"),
    ("backticks", _script(command=["{python}", "`id`"]), {}, "command[1]", "shell"),
    (
        "an unknown placeholder",
        _script(command=["{python}", "{batch}"]),
        {},
        "command[1]",
        "unknown placeholder {batch}",
    ),
    (
        "an attribute",
        _script(command=["{python.__class__}"]),
        {},
        "command[0]",
        "not a placeholder",
    ),
    (
        "a format spec",
        _script(command=["{python}", "{steps:099999999}"]),
        {},
        "command[1]",
        "not a placeholder",
    ),
    ("unbalanced braces", _script(command=["{python}", "{steps"]), {}, "command[1]", "unbalanced"),
    (
        "{seq_len} without one",
        _script(command=["{python}", "{seq_len}"]),
        {},
        "command[1]",
        "needs a sequence length",
    ),
    ("a missing script", _script(script="train/missing.py"), {}, "script", "does not exist"),
    (
        "a relative path out of the checkout",
        _script(script="../outside.py"),
        {},
        "script",
        "outside the checkout",
    ),
    (
        "a link out of the checkout",
        _script(script="train/link.py"),
        {},
        "script",
        "outside the checkout",
    ),
    (
        "files out of the checkout",
        _script(files=["../outside.py"]),
        {},
        "files[0]",
        "outside the checkout",
    ),
    (
        "a pattern that does not compile",
        _script(throughput={"pattern": "(?P<value>[0-9"}),
        {},
        "throughput.pattern",
        "does not compile",
    ),
    (
        "a nested quantifier",
        _script(throughput={"pattern": "(?P<value>(\\d+)+)"}),
        {},
        "throughput.pattern",
        "nested",
    ),
    (
        "a nested quantifier in a group",
        _script(throughput={"pattern": "(?:x+\\s?)*(?P<value>1)"}),
        {},
        "throughput.pattern",
        "nested",
    ),
    (
        "a back reference",
        _script(throughput={"pattern": "(?P<value>\\d)(?P=value)"}),
        {},
        "throughput.pattern",
        "refers back",
    ),
    (
        "a pattern without its group",
        _script(throughput={"pattern": "throughput: ([0-9.]+)"}),
        {},
        "throughput.pattern",
        "named groups",
    ),
    (
        "a pattern too long",
        _script(throughput={"pattern": "(?P<value>1)" + "x" * 600}),
        {},
        "throughput.pattern",
        "512",
    ),
    (
        "both sources",
        _script(throughput={"pattern": PATTERN, "json": "s.jsonl"}),
        {},
        "throughput",
        "exactly one",
    ),
    (
        "a JSON file out of its folder",
        _script(throughput=_json(json="../steps.jsonl")),
        {},
        "throughput.json",
        "file name",
    ),
    (
        "per-rank JSON without {rank}",
        _script(throughput=_json(scope="rank")),
        {},
        "throughput.json",
        "{rank}",
    ),
    (
        "per-rank output under torchrun",
        _script(launch="torchrun", throughput={"pattern": PATTERN, "scope": "rank"}),
        {},
        "throughput.scope",
        "torchrun",
    ),
    ("a label that is a framework", None, {}, "pytorch", "framework of dlscale"),
    ("a model of the registry", _script(model="resnet50"), {}, "model", "registry"),
    (
        "an unknown script in the axes",
        _script(),
        {"axes": {"framework": ["other"]}},
        "script.axes.framework[0]",
        "not a script",
    ),
]


@pytest.mark.parametrize(
    "script,extra,key,words", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_settings_are_refused_before_anything_runs(checkout, script, extra, key, words):
    config = _study(checkout, script or _script())
    if script is None:  # the label itself
        config["script"]["scripts"] = {"pytorch": _script()}
    config["script"].update(extra)
    with pytest.raises(ConfigError) as refused:
        _build(checkout, config)
    message = str(refused.value)
    assert key in message and words in message, message
    assert not (checkout / CANARY).exists()


def test_pattern_check_accepts_the_usual_patterns():
    for pattern in (
        PATTERN,
        r"step (?P<count>\d+) samples in (?P<seconds>[0-9.e-]+) s",
        r"^\s*tokens/s[:=]\s*(?P<value>\d+(?:\.\d+)?)",
        r"(?P<value>[0-9]+(?:\.[0-9]*)?) img/s",
    ):
        assert script_patterns.pattern_problem("p", pattern) is None, pattern
