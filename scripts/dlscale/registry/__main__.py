"""`python -m dlscale.registry environments [cpu|cuda]`: the venvs under .venvs/ the frameworks
need, one per line (what scripts/setup.sh builds by default and accepts). Standard library
only: setup.sh runs it with the system Python before any venv exists."""

from __future__ import annotations

import sys

from dlscale.registry.frameworks import VARIANTS, environments


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "environments" or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    variants = argv[1:] or ["cpu"]
    if variants[0] not in VARIANTS:
        print(f"unknown variant {variants[0]!r}; allowed: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    print("\n".join(environments(variants[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
