#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the demo study on the embedded default (local profile,
# CPU, small models) to results/demo/report/report.pdf. Extra arguments go to snakemake.
# `bash scripts/setup.sh` builds the other frameworks' environments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh none        # the demo study uses PyTorch only (the driver venv)
exec .venv/bin/snakemake --profile profiles/local "$@"
