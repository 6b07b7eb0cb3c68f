"""Where a study's own models come from (config `models:`; docs/pages/your-model.md): one record
per source, and the environments they run in.

- `transformers`: a configuration class of the transformers library with keyword arguments, or
  a local config.json, always built from the configuration with random weights (nothing is
  downloaded; remote code is refused). Runs in `<environment>-hf`: the framework's environment
  with transformers and accelerate layered over it (envs/pytorch-hf.txt), so no shipped cell's
  environment changes.
- `entry_point`: a builder an installed package registers under the `dlscale.models` entry
  point group (as pytest finds `pytest11` plugins): the study names the entry point and the
  environment the package is installed in; the package's distribution name and version are
  part of its cells' identity.

Standard library only: scripts/setup.sh reads the layered environments
(`python -m dlscale.registry layered`) before any venv exists.
"""

from __future__ import annotations

# The entry point group a package registers its model builders under (pyproject.toml:
# [project.entry-points."dlscale.models"] name = "package.module:builder").
ENTRY_POINT_GROUP = "dlscale.models"

TRANSFORMERS = "transformers"
ENTRY_POINT = "entry_point"
SOURCES = {
    TRANSFORMERS: "a transformers configuration class with keyword arguments, or a local "
    "config.json, built from the configuration with random weights",
    ENTRY_POINT: f"a builder an installed package registers under the {ENTRY_POINT_GROUP!r} "
    "entry point group",
}

# The frameworks whose adapters build these models (PyTorch modules).
FRAMEWORKS = ("pytorch",)

# The layered environments: name -> the environment it is layered over (None: the driver's
# .venv). Each is envs/<name>.txt installed into a venv that sees its base's site-packages
# through a .pth file (scripts/setup.sh), so it shares the base's torch.
HF_SUFFIX = "-hf"
LAYERED = {"pytorch-hf": None, "pytorch-cuda-hf": "pytorch-cuda"}

# Why no pipelined strategy runs these models: dlscale.models.torch's pipeline split needs a
# model's pieces in order (embedding, blocks, head) with the names its stages keep, which only
# the shipped architectures declare.
WHY_NO_PIPELINE = (
    "a pipeline cuts a model into stages of contiguous pieces that its plan names "
    "(dlscale.models.parallelize), and a model from the study's `models:` section has no such "
    "plan"
)


def hf_environment(base: str | None) -> str:
    """The environment a transformers model runs in over a framework environment `base`
    (None: the driver's, pytorch): `<base>-hf`."""
    return f"{base or 'pytorch'}{HF_SUFFIX}"


def layered(variant: str = "cpu") -> list[str]:
    """The layered environments scripts/setup.sh builds for a variant (cpu: pytorch-hf)."""
    return [name for name, base in LAYERED.items() if ("cuda" in name) == (variant == "cuda")]
