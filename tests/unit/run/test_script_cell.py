"""A script cell on the launcher's side: its command filled without a shell, torchrun's
environment, the throughput read from what the script wrote (bounded), a cell without one
failed with the pattern and its log's tail, and the documented example run for real: the DDP
script of the tests on 2 local ranks, its throughput the number it printed, to the digit."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

from dlscale.rank.rank_context import RankContext
from dlscale.run import launch, script_cell, script_rank
from dlscale.store.metrics import read_metrics
from dlscale.study.cell import FAILURE_FILE, MEASUREMENTS_DIR

from helpers.cells import small_cell
from helpers.checkout import ROOT

PAGE = ROOT / "docs" / "pages" / "your-model.md"
PATTERN = "throughput: (?P<value>[0-9.]+) samples/s"


def _script(**changes) -> dict:
    return {
        "command": ["{python}", "{script}", "--out", "{output_dir}", "--b", "{per_rank_batch}"],
        "environment": "pytorch",
        "files": 1,
        "launch": "ranks",
        "read": PATTERN,
        "scope": "global",
        "script": "train.py",
        "seed": 3,
        "sha256": "0" * 64,
        "source": "pattern",
        "unit": "samples",
        "warmup": 0,
        **changes,
    }


def script_cell_of(**changes):
    script = _script(**changes.pop("script", {}))
    return small_cell(workload="script", framework="mine", model="script", script=script, **changes)


def test_the_command_is_filled_item_by_item_without_a_shell(tmp_path):
    cell = script_cell_of(script={"command": ["{python}", "a b; {seed}", "{{x}}"]})
    argv = script_cell.fill_command(cell, "/env/bin/python", tmp_path)
    assert argv == ["/env/bin/python", "a b; 3", "{x}"]


def test_torchrun_environment_and_command():
    ctx = RankContext(3, 4, 1, 2, 1, "n2", "n1", 12345, "srun")
    env = script_rank.torchrun_environment(ctx, nodes=2)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert (env["GROUP_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "n1", "12345")
    argv = script_rank.torchrun_argv("py", ["py", "t.py"], 2, 2, ctx)
    assert argv[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--node-rank=1" in argv and argv[-3:] == ["--no-python", "py", "t.py"]


def test_matching_is_bounded_per_line_and_by_length():
    """A pattern that backtracks without end stops at its line's timeout (the study's check
    refuses nested quantifiers first; the timeout bounds any other); a line is cut at
    MAX_LINE characters before it is matched."""
    started = time.monotonic()
    with pytest.raises(script_cell.PatternTimeout, match="line 2"):
        script_cell.match_lines(r"^(a+)+$", ["aaa", "a" * 40 + "b"], line_timeout_s=0.3)
    assert time.monotonic() - started < 5
    far = "x" * script_cell.MAX_LINE + "throughput: 9.5 samples/s"
    assert script_cell.match_lines(PATTERN, [far, "throughput: 2.25 samples/s"]) == [
        None,
        {"value": "2.25"},
    ]


def test_json_records_are_read_strictly(tmp_path):
    cell = script_cell_of(script={"source": "json", "read": "steps.jsonl", "warmup": 1})
    out = tmp_path / script_cell.OUTPUT_DIR
    out.mkdir()
    records = [{"step": i, "samples": 64, "seconds": s} for i, s in enumerate((9.0, 0.5, 1.5))]
    (out / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    reading = script_cell.read_throughput(cell, tmp_path)
    assert reading.throughput == 128 / 2.0  # the warm-up record left out
    assert [s for s, _, _ in reading.streams[None].steps] == [1, 2]
    (out / "steps.jsonl").write_text('{"step": 0, "samples": 6.5, "seconds": 1}\n')
    with pytest.raises(script_cell.NoThroughput, match="samples 6.5 is not a whole number"):
        script_cell.read_throughput(
            script_cell_of(script={"source": "json", "read": "steps.jsonl"}), tmp_path
        )


def test_no_matching_throughput_fails_the_cell_with_the_pattern_and_its_tail(tmp_path):
    (tmp_path / "train.py").write_text("print('loss 0.5')\nprint('done')\n")
    cell = script_cell_of(nodes=1, script={"script": str(tmp_path / "train.py")})
    output = tmp_path / "cell" / "metrics.jsonl"
    assert launch.run_cell(cell, output, git_commit=None, python=sys.executable) == 1
    failure = json.loads((output.parent / FAILURE_FILE).read_text())
    assert PATTERN in failure["reason"] and "done" in failure["reason"]
    assert "done" in failure["log_tail"]["0"]
    assert not output.exists()


def _example() -> tuple[str, str]:
    """The script section's worked example: its study file and the log as printed."""
    section = PAGE.read_text().split("## Your script: the `script` workload", 1)[1]
    part = section.split("### A worked example", 1)[1]
    study = re.search(r"```yaml\n(.*?)```", part, re.S).group(1)
    printed = re.search(r"```text\n(.*?)```", part, re.S).group(1)
    return study, printed


def _shape(text: str) -> list[str]:
    """A log's lines with what differs between runs masked: numbers, hashes, times."""
    text = re.sub(r"\d{8}T\d{6}Z-pid\d+", "<measurement>", text)
    text = re.sub(r"sha256 [0-9a-f]{12}", "sha256 <sha>", text)
    text = re.sub(r"\d+\.\d+", "<n>", text)
    return [line.rstrip() for line in text.strip().splitlines()]


def test_the_documented_example_runs_as_printed(tmp_path, monkeypatch, capfd):
    """The page's study, parsed as the workflow parses it; its 2-node cell run through the real
    launcher on 2 local ranks: the unmodified DDP script sees torchrun's environment, the cell's
    throughput is the number it printed, to the digit, and its log reads as the page prints it
    (numbers, hashes and times aside; the checkout's path is /path/to/checkout)."""
    from dlscale.study.matrix import load_workflow_study

    study_text, printed = _example()
    (tmp_path / "my-script-study.yaml").write_text(study_text)
    study = load_workflow_study({"study_file": str(tmp_path / "my-script-study.yaml")}, ROOT)
    cell = next(c for c in study.cells if c.nodes == 2)
    checkout = tmp_path / "checkout"
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    monkeypatch.chdir(checkout)
    output = checkout / cell.path
    python = sys.executable
    assert launch.run_cell(cell, output, git_commit=None, python=python) == 0
    log = capfd.readouterr().err
    records = read_metrics(output)
    kept = next((output.parent / MEASUREMENTS_DIR).iterdir())
    line = (kept / "rank0.log").read_text().strip()
    assert float(line.split()[1]) == records[-1]["value"]["throughput_samples_per_s"]
    assert records[0]["value"]["script"]["printed"] == line.split()[1]
    seen = [r["value"]["torchrun_environment"] for r in records if r["event"] == "rank_start"]
    assert [(e["RANK"], e["WORLD_SIZE"], e["GROUP_RANK"]) for e in seen] == [
        ("0", "2", "0"),
        ("1", "2", "1"),
    ]
    assert (kept / script_cell.OUTPUT_DIR / "steps.jsonl").is_file()
    shown = log.replace(python, "/path/to/checkout/.venv/bin/python").replace(
        str(checkout), "/path/to/checkout"
    )
    if os.environ.get("DLSCALE_PRINT_EXAMPLE"):
        print(shown, file=sys.stderr)
    assert _shape(shown) == _shape(printed), shown
