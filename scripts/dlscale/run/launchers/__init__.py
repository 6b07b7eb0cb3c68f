"""The launchers' code: one class per launcher, one file each (local.py, srun.py), registered
against its record in dlscale.registry.launchers (what each one is; read by every part that
differs between them). The port chooser both use is ports.py; the container wrapping both apply
is base.in_container.

`launcher_for(cell)`: the launcher that starts a cell's ranks here; `REGISTERED[name]`: a
launcher by name."""

from __future__ import annotations

import os
from collections.abc import Mapping

from dlscale.run.launchers import local, srun  # noqa: F401  (each registers its class)
from dlscale.run.launchers.launcher_base import REGISTERED, ContainerError, Launcher
from dlscale.study.cell import Cell

__all__ = ["REGISTERED", "ContainerError", "Launcher", "launcher_for"]


def launcher_for(cell: Cell, env: Mapping[str, str] = os.environ) -> Launcher:
    """The launcher that starts `cell`'s ranks in environment `env`: the cell's own, or the one
    it hands the cell to (SrunLauncher.for_cell)."""
    return REGISTERED[cell.launcher].for_cell(cell, env)
