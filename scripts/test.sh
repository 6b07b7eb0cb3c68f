#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the test suite: unit tests, workflow tests that run Snakemake
# end to end on the local profile, the Slurm tests on the local cluster and the docs build.
# The tests run on pytest-xdist workers, in the groups tests/conftest.py gives them: the Slurm
# tests in two groups, each one after another on one worker with its own local cluster, a
# module's shared fixture (the tiny study run once, read by many tests) on one worker, every
# other test wherever a worker is free.
# Workers: DLSCALE_TEST_WORKERS, default two more than the CPUs (the two Slurm groups wait on
# the clusters most of the time; the other workers take the rest), at most 8;
# DLSCALE_TEST_WORKERS=0 runs everything in this process.
# Extra arguments go to pytest (e.g. `-ra --durations=20`, `tests/unit`, `-k name`).
# As root (a fresh VM, CI) set-up installs Debian's packages too (TeX Live, poppler: tests read
# the PDFs); a plain user's machine must have them on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
system=()
[ "$(id -u)" -ne 0 ] || system=(--system-packages)
bash scripts/setup.sh "${system[@]}"
workers=${DLSCALE_TEST_WORKERS:-$(( $(nproc) + 2 ))}
[ "$workers" -le 8 ] || workers=8
exec .venv/bin/python -m pytest -n "$workers" --durations=25 "$@"
