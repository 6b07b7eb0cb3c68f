"""`python -m dlscale.registry environments [cpu|cuda]`: the venvs under .venvs/ the frameworks
need, one per line (what scripts/setup.sh builds by default and accepts).
`python -m dlscale.registry pip-index ENV`: the index arguments pip installs ENV with, one per
line (a CUDA line's environment, e.g. pytorch-cu128: PyTorch's wheel index for the line,
$DLSCALE_TORCH_INDEX/<line>, default https://download.pytorch.org/whl, as an extra index beside
the user's pip configuration; the rest from the configured index, PyPI unless pip.conf or
PIP_INDEX_URL names a mirror, or from $DLSCALE_PYPI_INDEX where set; nothing for the others).
`python -m dlscale.registry line-cuda ENV`: the CUDA version a line's environment must be built
for (pytorch-cu128: 12.8, from cuda_drivers.json); nothing for the others.
`python -m dlscale.registry environments-dir`: the folder the environments live in, absolute
(.venvs/ in the checkout, or $DLSCALE_ENVS_DIR).
`python -m dlscale.registry layered [cpu|cuda]`: the layered environments (a venv over another
one's site-packages: pytorch-hf, dlscale.registry.model_sources), one per line;
`python -m dlscale.registry layered-base ENV`: the environment ENV is layered over (nothing:
the driver's .venv).
`python -m dlscale.registry setup`: what scripts/setup.sh asks before it builds anything, in one
interpreter's start: the cpu environments, the cuda ones, the layered cpu ones and the layered
cuda ones (a line each, names separated by spaces), then the environments folder.
Standard library only: setup.sh runs it with the interpreter it was given (--python, DLSCALE_PYTHON,
python3) before any venv exists."""

from __future__ import annotations

import os
import sys

from dlscale.registry.cuda_drivers import table
from dlscale.registry.frameworks import FRAMEWORKS, VARIANTS, environments, environments_dir
from dlscale.registry.model_sources import LAYERED, layered

TORCH_INDEX = "https://download.pytorch.org/whl"


def line_of(env: str) -> str | None:
    """The CUDA line whose environment `env` is (pytorch-cu128: cu128), or None."""
    for record in FRAMEWORKS.values():
        for line, name in zip(record.cuda_lines[1:], record.line_environments(), strict=True):
            if name == env:
                return line
    return None


def pip_index(env: str, environ=os.environ) -> list[str]:
    """pip's index arguments for environment `env` (see the module's docstring): the line's
    index added to the user's and the site's pip configuration (pip appends a command line's
    --extra-index-url to PIP_EXTRA_INDEX_URL and pip.conf's), whose index (a site's mirror)
    serves the rest unless DLSCALE_PYPI_INDEX names another."""
    line = line_of(env)
    if line is None:
        return []
    torch = environ.get("DLSCALE_TORCH_INDEX", TORCH_INDEX).rstrip("/")
    pypi = environ.get("DLSCALE_PYPI_INDEX")
    return [f"--extra-index-url={torch}/{line}", *([f"--index-url={pypi}"] if pypi else [])]


def main(argv: list[str]) -> int:
    if argv == ["setup"]:
        for names in (environments("cpu"), environments("cuda"), layered("cpu"), layered("cuda")):
            print(" ".join(names))
        print(environments_dir(os.getcwd()))
        return 0
    if argv == ["environments-dir"]:
        print(environments_dir(os.getcwd()))
        return 0
    if len(argv) == 2 and argv[0] == "line-cuda":
        line = line_of(argv[1])
        if line is not None:
            print(table()["pytorch_lines"][line])
        return 0
    if argv[:1] == ["layered"] and len(argv) <= 2 and (argv[1:] or ["cpu"])[0] in VARIANTS:
        for name in layered((argv[1:] or ["cpu"])[0]):
            print(name)
        return 0
    if len(argv) == 2 and argv[0] == "layered-base" and argv[1] in LAYERED:
        print(LAYERED[argv[1]] or "")
        return 0
    if len(argv) == 2 and argv[0] == "pip-index":
        for arg in pip_index(argv[1]):  # nothing at all for an environment without its own index
            print(arg)
        return 0
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
