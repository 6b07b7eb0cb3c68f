#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the test suite: unit tests, workflow tests that run Snakemake
# end to end on the local profile, the Slurm tests on the local cluster and the docs build.
# The tests run on pytest-xdist workers, in the groups tests/conftest.py gives them: the Slurm
# tests one after another on one worker (one cluster), a module's shared fixture (the tiny study
# run once, read by many tests) on one worker, every other test wherever a worker is free.
# Workers: DLSCALE_TEST_WORKERS, default one more than the CPUs (most tests wait on
# subprocesses and sleeps), at most 8; DLSCALE_TEST_WORKERS=0 runs everything in this process.
# Extra arguments go to pytest (e.g. `-ra --durations=20`, `tests/unit`, `-k name`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=${DLSCALE_TEST_WORKERS:-$(( $(nproc) + 1 ))}
[ "$workers" -le 8 ] || workers=8
exec .venv/bin/python -m pytest -n "$workers" "$@"
