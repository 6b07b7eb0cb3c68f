"""First contact ends and explains: the launcher bounds communicator set-up
and the first step from outside the ranks (dlscale.run.first_contact), and a failed cell's
record and log end with the diagnosis (dlscale.run.diagnosis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dlscale.run import diagnosis, first_contact, launch
from dlscale.store.preflight_results import write_result
from dlscale.study.cell import FAILURE_FILE, Cell

from helpers.cells import cell_dict

SCRIPTS = Path(launch.__file__).resolve().parents[2]


def test_a_rank_that_never_joins_ends_the_cell_at_the_first_contact_deadline(tmp_path):
    """2 real gloo ranks; rank 1 hangs before its set-up (DLSCALE_FAULT ...:1:setup:hang), so
    rank 0 waits in the rendezvous (torch's own bound: the 300 s collective timeout). With a 2 s
    first-contact deadline the launcher stops both within seconds, names rank 1, and the cell's
    log ends with the diagnosis block. Without the deadline the launcher waits for rank 0's
    300 s, past this test's 60 s bound."""
    out = tmp_path / "cell" / "metrics.jsonl"
    env = dict(
        os.environ,
        PYTHONPATH=f"{SCRIPTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        DLSCALE_FAULT=f"{tmp_path.name}/cell:1:setup:hang",
        DLSCALE_FIRST_CONTACT_S="2",
        NCCL_SOCKET_IFNAME="lo",  # a site's variable: shown in the diagnosis
    )
    env.pop("NCCL_DEBUG", None)
    argv = ["--cell-json", json.dumps(cell_dict()), "--output", str(out), "--git-commit", ""]
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "dlscale.run.launch", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 124 and time.monotonic() - started < 30
    failure = json.loads((out.parent / FAILURE_FILE).read_text())
    assert "first contact" in failure["reason"] and "rank(s) [1] (started)" in failure["reason"]
    diag = failure["diagnosis"]
    assert set(diag["messages"]) == {"0", "1"}  # the stalled rank and its waiting peer
    assert diag["first_contact"] == {"0": "setting up", "1": "started"}
    (node,) = diag["nodes"].values()
    assert node["ranks"] == [0, 1] and any(line.startswith("lo ") for line in node["interfaces"])
    assert node["variables"]["NCCL_DEBUG"] == "WARN"  # the launcher's default
    assert node["variables"]["NCCL_SOCKET_IFNAME"] == "lo"
    assert node["variables"]["MASTER_ADDR"] == "127.0.0.1"
    # the cell's log (the launcher's stderr) ends with the diagnosis block
    tail = run.stderr[run.stderr.rindex("cell FAILED") :].splitlines()
    assert tail[1] == "----- diagnosis -----"
    assert "first contact: rank 0 setting up, rank 1 started" in tail
    assert any(line.strip().startswith("NCCL_SOCKET_IFNAME=lo") for line in tail)
    assert tail[-1].startswith("preflight: no preflight result")


def test_the_deadline_spans_set_up_and_the_first_step_and_a_single_rank_has_none():
    cell = Cell.from_json(json.dumps(cell_dict(first_step_timeout_s=1800)))
    bound = first_contact.SETUP_BOUND_S + 1800 + first_contact.MARGIN_S
    assert first_contact.deadline_s(cell, env={}) == bound
    assert first_contact.deadline_s(cell, env={first_contact.DEADLINE_ENV: "5"}) == 5.0
    assert (
        first_contact.deadline_s(
            Cell.from_json(json.dumps(cell_dict(nodes=1, global_batch=4))), env={}
        )
        is None
    )


def test_the_watch_starts_at_set_up_and_ends_when_every_rank_completed_its_first_step(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(first_contact, "POLL_S", 0.0)
    watch = first_contact.Watch(tmp_path, 2, seconds=0.05)
    first_contact.mark(tmp_path, 0, first_contact.STARTED, host="h")
    time.sleep(0.1)
    assert not watch.expired() and watch.since is None  # no rank in set-up: no clock yet
    first_contact.mark(tmp_path, 0, first_contact.SETTING_UP)
    assert not watch.expired() and watch.since is not None
    time.sleep(0.1)
    assert watch.expired()
    reason, behind = first_contact.failure_reason(tmp_path, 2, 0.05)
    assert behind == [1] and "(not started); the others: setting up: [0]" in reason
    assert first_contact.read_marks(tmp_path, 2)[0]["host"] == "h"  # kept with later phases
    steps = []
    hook = first_contact.step_hook(tmp_path, 1, steps.append)
    hook(0)
    assert 1 not in first_contact.read_marks(tmp_path, 2) and steps == [0]
    hook(1)  # before step 1: step 0 completed
    first_contact.mark(tmp_path, 0, first_contact.FIRST_STEP_DONE)
    assert not watch.expired() and watch.done and steps == [0, 1]


def test_the_diagnosis_keeps_communication_lines_the_users_nccl_debug_and_the_preflight(
    tmp_path,
):
    log = tmp_path / "rank0.log"
    log.write_text(
        "loss 0.5\nh:1:1 [0] NCCL WARN Net : Connect to 10.0.0.2<5000> failed\n"
        "epoch 1\nRuntimeError: [../gloo/transport/tcp/pair.cc:446] Connection closed by peer\n"
        "torch.distributed.DistBackendError: ... timed out after 300000 ms\n"
    )
    assert [line[:12] for line in diagnosis.messages(log)] == [
        "h:1:1 [0] NC",
        "RuntimeError",
        "torch.distri",
    ]
    assert diagnosis.with_nccl_debug({})["NCCL_DEBUG"] == "WARN"
    assert diagnosis.with_nccl_debug({"NCCL_DEBUG": "INFO"})["NCCL_DEBUG"] == "INFO"
    cell = Cell.from_json(json.dumps(cell_dict()))
    assert diagnosis.preflight_result(cell, tmp_path).startswith("no preflight result")
    (tmp_path / "preflight").mkdir()
    bad = {"name": "communicator", "ok": False, "detail": "gloo: refused", "fix": "the firewall"}
    result = {"hardware": cell.hardware, "environment": "driver", "passed": False}
    result.update(environment_id=cell.environment, finished_at=0, failed=bad, checks=[bad])
    write_result(tmp_path / "preflight" / "cpu-driver-0123456789ab.json", result)
    text = diagnosis.preflight_result(cell, tmp_path)
    assert "FAILED at 'communicator'" in text and "Fix: the firewall" in text
