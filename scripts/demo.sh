#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the demo study on the embedded default (local profile,
# CPU, small models) to results/demo/report/report.pdf. Extra arguments go to snakemake.
# `bash scripts/setup.sh` builds the other frameworks' environments.
# As root (a fresh VM, CI) set-up installs Debian's packages too (TeX Live: the report PDF); as a
# plain user it installs nothing system-wide, and without TeX on PATH the demo builds everything
# but the PDF and says so at its start (docs/pages/first-day.md).
set -euo pipefail
cd "$(dirname "$0")/.."
system=()
[ "$(id -u)" -ne 0 ] || system=(--system-packages)
bash scripts/setup.sh "${system[@]}" none   # the demo study uses PyTorch only (the driver venv)
exec .venv/bin/snakemake --profile profiles/local "$@"
