"""Worst rejection time and peak memory over the bad-input corpus (targets: < 2 s and
< 200 MB per bad input).

Each case of tests/helpers/bad_input_corpus.py runs in a fresh Python process (so one case's peak
memory is not another's): the process imports dlscale, sets up the case's workspace, times the
refusal alone and reports its own peak RSS (getrusage ru_maxrss, which includes the interpreter
and the imported libraries). A baseline process loads the valid demo study the same way.

    PYTHONPATH=scripts .venv/bin/python benchmarks/bad_inputs.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

ONE = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {unit!r})
import bad_input_corpus as corpus
ws = corpus.make_workspace(Path({ws!r}))
import os; os.chdir(ws)
name = {name!r}
started = time.perf_counter()
if name == "(valid demo study)":
    from dlscale.study.matrix import load_workflow_study
    load_workflow_study({{}}, ws)
    message = ""
else:
    setup = dict((n, s) for n, s, _ in corpus.CORPUS)[name]
    message = corpus.reject(ws, setup)
seconds = time.perf_counter() - started
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"case": name, "seconds": seconds, "peak_rss_mb": peak_mb,
                  "message_chars": len(message)}}))
"""


def run_one(name: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        code = ONE.format(unit=str(ROOT / "tests" / "helpers"), ws=str(Path(tmp) / "ws"), name=name)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    if proc.returncode != 0:
        return {"case": name, "error": proc.stderr[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    import argparse

    from bad_input_corpus import CORPUS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=None, help="the first N cases only (smoke run)")
    cases = CORPUS[: p.parse_args(argv).cases]
    rows = [run_one("(valid demo study)")] + [run_one(name) for name, _, _ in cases]
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"ERROR {r['case']}: {r['error']}", file=sys.stderr)
    ok = [r for r in rows[1:] if "error" not in r]
    slow = max(ok, key=lambda r: r["seconds"])
    big = max(ok, key=lambda r: r["peak_rss_mb"])
    base = rows[0]
    print(f"{len(ok)} bad inputs, each in a fresh process ({sys.executable})")
    print(
        f"valid demo study: {base['seconds'] * 1000:.0f} ms, peak RSS {base['peak_rss_mb']:.0f} MB"
    )
    print(f"worst rejection time: {slow['seconds'] * 1000:.0f} ms ({slow['case']})")
    print(f"worst peak RSS: {big['peak_rss_mb']:.0f} MB ({big['case']})")
    print(f"longest message: {max(r['message_chars'] for r in ok)} characters")
    top = sorted(ok, key=lambda r: -r["seconds"])[:5]
    print("slowest:", ", ".join(f"{r['case']} {r['seconds'] * 1000:.0f} ms" for r in top))
    within = slow["seconds"] < 2.0 and big["peak_rss_mb"] < 200 and not errors
    print("targets (< 2 s, < 200 MB):", "met" if within else "NOT met")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
