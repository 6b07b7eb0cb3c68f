"""The script workload downstream: its cells' columns (unit, hash, command), the report's
section (command and content hash stated, the scaling table in the script's unit) and the
throughput figures' axis in the script's unit."""

from __future__ import annotations

import pandas as pd

from dlscale.outputs.script_section import script_section
from dlscale.study.script_workload import figures_in_units, script_columns

SCRIPT = {
    "command": ["{python}", "{script}", "--b", "{per_rank_batch}"],
    "script": "train/train.py",
    "sha256": "ab" * 32,
    "files": 2,
    "environment": "pytorch",
    "launch": "torchrun",
    "unit": "tokens",
}
START = {
    "script": {"argv": ["/env/python", "train/train.py", "--b", "8"], "printed": "123.5"},
    "timing": {"throughput": "read from the script's output: pattern 'x'"},
}


def test_a_script_cell_states_its_unit_hash_and_command():
    columns = script_columns({"script": SCRIPT}, START, 123.5)
    assert columns["throughput_unit"] == "tokens/s"
    assert columns["throughput_tokens_per_s"] == 123.5  # never x seq_len
    assert columns["script_sha256"] == SCRIPT["sha256"]
    assert columns["script_command"] == "{python} {script} --b {per_rank_batch}"
    assert columns["script_argv"] == "/env/python train/train.py --b 8"


def test_the_report_section_states_command_and_hash():
    row = script_columns({"script": SCRIPT}, START, 123.5)
    cells = pd.DataFrame(
        [{"workload": "script", "framework": "my_ddp", "model": "mlp", **row}]
        + [{"workload": "throughput", "framework": "pytorch", "model": "cnn_small"}]
    )
    scaling = pd.DataFrame(
        [
            {
                "framework": "my_ddp",
                "hardware": "cpu",
                "policy": "weak",
                "precision": "fp32",
                "nodes": n,
                "world_size": n,
                "n": 3,
                "throughput_samples_per_s_median": 100.0 * n,
                "speedup_median": float(n),
                "scaling_efficiency_median": 1.0,
            }
            for n in (1, 2)
        ]
    )
    tex = script_section(cells, scaling)
    assert r"\section{Your scripts}" in tex and r"Script \texttt{my\_ddp}" in tex
    assert "ab" * 32 in tex and r"\{python\}" in tex and "tokens/s" in tex
    assert tex.count(r"\\") == 3  # the header and one row per node count
    assert script_section(cells[cells["workload"] != "script"], scaling).startswith("%")


def test_throughput_figures_of_scripts_are_in_their_unit():
    spec = {"family": "throughput", "series": [["my_ddp", "fp32"]], "caption": "Throughput."}
    other = {**spec, "series": [["pytorch", "fp32"]]}
    both = {**spec, "series": [["my_ddp", "fp32"], ["pytorch", "fp32"]]}
    out = figures_in_units([spec, other, both], {"my_ddp": "tokens"})
    assert out[0]["ylabel"] == "Throughput (tokens/s)" and "my_ddp tokens/s" in out[0]["caption"]
    assert "ylabel" not in out[1]
    assert "own unit" in out[2]["ylabel"]
