#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the demo study on the embedded default (local profile,
# CPU, small models) to results/report/report.pdf. Extra arguments go to snakemake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/snakemake --profile profiles/local "$@"
