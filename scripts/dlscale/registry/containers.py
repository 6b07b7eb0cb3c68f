"""hardware.yaml `container`: the container engines a hardware entry's ranks can run in, each as
one record that emits its part of the ranks' launch (ReFrame's container platforms, one class
each, do the same). The ranks run inside the container; the cell's launcher, the driver and the
report run outside it. The schema's `container.engine` enum is filled from here.

Each engine's command line follows its documented flags:
- `apptainer`: `apptainer exec [--nv] --bind SRC[:DST][,...] --pwd DIR IMAGE CMD ...`
  (apptainer exec(1): `--nv` binds the host's NVIDIA driver libraries and devices; `--bind/-B`
  a comma-separated list of src[:dest[:opts]]; `--pwd` the initial working directory). The host
  environment passes into the container by default.
- `pyxis`: srun's own options from NVIDIA's SPANK plugin, `--container-image=IMAGE`,
  `--container-mounts=SRC:DST[:FLAGS][,...]` and `--container-workdir=DIR` (pyxis README,
  "Usage"; without it the image's own working directory); the command after them runs inside
  the image's root file system, created per task by enroot; GPUs through enroot's NVIDIA hook.
  The environment passes in by default.
- `charliecloud`: `ch-run [-b SRC[:DST]]... --cd=DIR IMAGE -- CMD ...` (ch-run(1)): an
  unprivileged image directory (or SquashFS file); a bind's destination must exist in the image
  (ch-run creates none without `--write`), the host's /tmp is bound at /tmp by default, and the
  working directory is / unless `--cd` says otherwise. GPUs need the host's NVIDIA libraries
  injected into the image once (`ch-fromhost --nvidia IMAGE`).

Every engine starts the rank in the launcher's working directory (the study's checkout: paths
the ranks get may be relative to it).

Adding an engine: a record here (its srun options and its command prefix), a unit test of its
command line against its documented flags, and its line in docs/pages/slurm.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CHARLIECLOUD_DEFAULT_BINDS = ("/tmp",)  # ch-run binds the host's /tmp (or $TMPDIR) at /tmp


@dataclass(frozen=True)
class ContainerEngine:
    """One engine: `srun_options(image, binds, cwd)` are added to the ranks' srun (pyxis's own
    options), `prefix(image, binds, gpu, cwd)` goes before the rank's command (the engine's
    program); `cwd`: the working directory the rank starts in;
    `needs_srun`: the engine starts containers only through srun (no local launcher);
    `exact_binds`: the engine binds any path at the same path in the container (creating the
    mount point); without it only the site's binds (and `default_binds`) exist in the
    container, and the launcher's paths must lie under one of them."""

    name: str
    program: str | None  # the command the nodes must have; None: a plugin of srun itself
    srun_options: Callable[[str, list[str], str], list[str]]
    prefix: Callable[[str, list[str], bool, str], list[str]]
    needs_srun: bool
    exact_binds: bool
    default_binds: tuple[str, ...]
    image_forms: str  # what `container.image` may be, for messages and the docs


def _apptainer_prefix(image: str, binds: list[str], gpu: bool, cwd: str) -> list[str]:
    return [
        "apptainer",
        "exec",
        *(["--nv"] if gpu else []),
        *(["--bind", ",".join(binds)] if binds else []),
        "--pwd",
        cwd,
        image,
    ]


def _charliecloud_prefix(image: str, binds: list[str], gpu: bool, cwd: str) -> list[str]:
    return ["ch-run", *(f"--bind={b}" for b in binds), f"--cd={cwd}", image, "--"]


ENGINES = {
    e.name: e
    for e in (
        ContainerEngine(
            "apptainer",
            "apptainer",
            lambda image, binds, cwd: [],
            _apptainer_prefix,
            needs_srun=False,
            exact_binds=True,
            default_binds=(),
            image_forms="a SIF file (an absolute path) or a registry reference pinned by digest "
            "(docker://REPO@sha256:<64 hex>, oras://...@sha256:...)",
        ),
        ContainerEngine(
            "pyxis",
            None,
            lambda image, binds, cwd: [
                f"--container-image={image}",
                *([f"--container-mounts={','.join(binds)}"] if binds else []),
                f"--container-workdir={cwd}",
            ],
            lambda image, binds, gpu, cwd: [],
            needs_srun=True,
            exact_binds=True,
            default_binds=(),
            image_forms="an enroot SquashFS file (an absolute path) or a registry reference "
            "pinned by digest ([REGISTRY#]REPO@sha256:<64 hex>)",
        ),
        ContainerEngine(
            "charliecloud",
            "ch-run",
            lambda image, binds, cwd: [],
            _charliecloud_prefix,
            needs_srun=False,
            exact_binds=False,
            default_binds=CHARLIECLOUD_DEFAULT_BINDS,
            image_forms="an image directory or a SquashFS file (an absolute path)",
        ),
    )
}
