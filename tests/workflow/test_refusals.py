"""The workflow refuses bad input before any job, on the embedded default (local profile): a
configuration that breaks the schema, hostile input through Snakemake (a YTE study file, a
launcher the executor cannot run, a FIFO for a file) and bad regression references; each stops
the run with a clear message and touches nothing. The parse-time checks themselves are
dlscale.workflow.guards (tests/unit/workflow/test_guards.py)."""

from __future__ import annotations

import copy

import pytest

from helpers.checkout import copy_workflow, snakemake

pytestmark = pytest.mark.workflow


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("axes", {"framework": ["tensorflw"]}, "axes.framework[0]: 'tensorflw' is not allowed"),
        ("axes", {"nodes": [0, 1]}, "axes.nodes[0]: 0 must be >= 1"),
        ("per_rank_batch", -1, "per_rank_batch: -1 must be >= 1"),
        ("global_batch", 3, "global_batch: 3"),
        ("exclude", [{"model": "resnet50"}], "exclude[0].model"),
    ],
)
def test_bad_config_stops_before_any_job(tmp_path, tiny_config, key, value, fragment):
    config = copy.deepcopy(tiny_config)
    if key == "global_batch":
        config["axes"]["policy"] = ["strong"]
    if isinstance(value, dict):
        config[key] = {**config[key], **value}
    else:
        config[key] = value
    work = copy_workflow(tmp_path, config)
    proc = snakemake(work, "--profile", "profiles/local")
    assert proc.returncode != 0
    assert fragment in proc.stderr, proc.stderr[-2000:]
    assert "No job was started" in proc.stderr
    assert not list((work / "results").rglob("metrics.jsonl"))


HOSTILE_RUNS = {
    # a study file that is a YTE template (Python code) is refused, its code never runs
    "yte-study-file": (
        {
            "yte.yaml": '__use_yte__: true\n?if __import__("pathlib").Path("PWNED").touch():\n'
            "  steps: 5\n"
        },
        ["-n", "--config", "study_file=yte.yaml"],
        "__use_yte__: a study file is plain YAML",
    ),
    # --config replaced the profile's launcher: a real run stops before the first job
    "launcher-without-allocation": (
        {},
        ["--config", "launcher=srun"],
        "executor is 'local' but launcher is 'srun'",
    ),
    # a hardware file that is a FIFO never hangs the run
    "hardware-fifo": ({}, ["-n", "--config", "hardware_file=fifo.yaml"], "is a FIFO"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RUNS))
def test_hostile_input_stops_the_workflow_and_touches_nothing(tmp_path, tiny_config, case):
    """Hostile input through Snakemake: a clear error, no traceback, no code run, results/ kept."""
    import hashlib
    import os

    files, args, fragment = HOSTILE_RUNS[case]
    work = copy_workflow(tmp_path, tiny_config)
    for name, text in files.items():
        (work / name).write_text(text)
    os.mkfifo(work / "fifo.yaml")
    kept = work / "results" / "tiny" / "runs" / "kept.jsonl"
    kept.parent.mkdir(parents=True)
    kept.write_text('{"event": "run_start"}\n')

    def checksums():
        return {
            str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((work / "results").rglob("*"))
            if p.is_file()
        }

    before = checksums()
    proc = snakemake(work, "--profile", "profiles/local", *args, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and fragment in out, out[-3000:]
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    assert not (work / "PWNED").exists()
    assert checksums() == before


def test_bad_references_stop_before_any_job(tmp_path, tiny_config):
    """config/references.yaml is validated with the other configuration: every problem named."""
    work = copy_workflow(tmp_path, tiny_config)
    (work / "config/references.yaml").write_text(
        "references:\n  cpu:\n    '*/n2':\n"
        "      throughput_samples_per_s: {value: 10, lower: 0.1, upper: 0.1, unit: ms}\n"
    )
    proc = snakemake(work, "--profile", "profiles/local", "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "config/references.yaml" in out and "No job was started" in out, out[-3000:]
    assert "lower: 0.1 must be <= 0" in out and "'samples/s' was expected" in out, out[-3000:]
