"""The launchers' code: one class per launcher, one file each (local.py, srun.py), registered
against its record in dlscale.registry.launchers (what each one is; read by every part that
differs between them); every module of this package is imported here, so a new file registers
its class with nothing else to edit. The port chooser is ports.py; the container wrapping every
launcher applies is launcher_base.in_container.

`launcher_for(cell)`: the launcher that starts a cell's ranks here; `REGISTERED[name]`: a
launcher by name."""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Mapping

from dlscale.run.launchers.launcher_base import REGISTERED, ContainerError, Launcher
from dlscale.study.cell import Cell

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # each launcher's file registers it

__all__ = ["REGISTERED", "ContainerError", "Launcher", "launcher_for"]


def launcher_for(cell: Cell, env: Mapping[str, str] = os.environ) -> Launcher:
    """The launcher that starts `cell`'s ranks in environment `env`: the cell's own, or the one
    it hands the cell to (SrunLauncher.for_cell)."""
    return REGISTERED[cell.launcher].for_cell(cell, env)
