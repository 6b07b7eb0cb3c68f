"""What every launcher shares: the `Launcher` class each one subclasses, in a file of its own
(dlscale.run.launchers.local, .srun) and registered by name against its record in
dlscale.registry.launchers, and the container wrapping of the rank's command, the same under
either launcher (the engines' command lines: dlscale.registry.containers)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import dlscale
from dlscale.registry import launchers as records
from dlscale.registry.containers import ENGINES
from dlscale.study.cell import Cell
from dlscale.study.container_image import needed_binds

Ranks = list[tuple[int, subprocess.Popen]]  # (rank, process); -1: one process for every rank


class Launcher:
    """How a cell's ranks start. A subclass names its record (`name`), starts the ranks
    (`start`: the processes to wait for, their logs under the rank folder) and may hand a cell
    to another launcher (`for_cell`). `watches_step`: its one process is a Slurm step that can
    outlive a failed rank, so the waiting launcher watches the step's log (launch.StepWatch)."""

    name: ClassVar[str]
    watches_step: ClassVar[bool] = False

    @property
    def record(self) -> records.Launcher:
        return records.launcher(self.name)

    def start(
        self, cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str] = os.environ
    ) -> Ranks:
        raise NotImplementedError

    def for_cell(self, cell: Cell, env: Mapping[str, str]) -> Launcher:
        """The launcher that starts `cell`'s ranks here (itself, unless a subclass says)."""
        return self


REGISTERED: dict[str, Launcher] = {}


def register(cls: type[Launcher]) -> type[Launcher]:
    """Class decorator: one instance of `cls`, under its record's name (a class without a
    record in dlscale.registry.launchers is refused at import)."""
    records.launcher(cls.name)
    REGISTERED[cls.name] = cls()
    return cls


class ContainerError(RuntimeError):
    """The container cannot see what its ranks need (a Charliecloud image without the mount
    point of a path the ranks read): the cell fails before any rank starts."""


def package_root() -> Path:
    """The folder the dlscale package is imported from (scripts/ of the checkout)."""
    return Path(dlscale.__file__).resolve().parent.parent


def in_container(
    cell: Cell, argv: list[str], rank_dir: Path, env: dict
) -> tuple[list[str], list[str]]:
    """(srun options, the rank's command) for a cell whose hardware entry names a container
    (hardware.yaml `container`; the engines' command lines: dlscale.registry.containers): the
    rank's interpreter is the image's (`container.python`) and the engine's program goes first;
    the dlscale package's folder, the working directory (the checkout), the cell's folder (its
    ranks' files) and a convergence cell's dataset are bound at the same paths, with the site's
    binds, the rank starts in the same working directory, and PYTHONPATH names the package
    inside. Without a container: no options and `argv` as it is. `env` (the ranks'
    environment) gains PYTHONPATH."""
    if not cell.container:
        return [], argv
    c = dict(cell.container)
    engine = ENGINES[c["engine"]]
    root, cwd = str(package_root()), os.getcwd()
    paths = [root, cwd, str(rank_dir.resolve().parent)]
    if cell.data_path:
        paths.append(str(Path(cell.data_path).resolve()))
    binds, problems = needed_binds(paths, c)
    if problems:
        raise ContainerError(
            f"hardware {cell.hardware!r}: the {engine.name} container cannot see what the "
            f"ranks read: {'; '.join(problems)}"
        )
    env["PYTHONPATH"] = root
    prefix = engine.prefix(c["image"], list(binds), cell.device == "cuda", cwd)
    python = c.get("python", "python3")
    return engine.srun_options(c["image"], list(binds), cwd), [*prefix, python, *argv[1:]]
