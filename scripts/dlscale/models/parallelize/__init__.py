"""Each model architecture's plan for the strategies beyond ddp, beside the models, one module per
architecture (torchtitan keeps a `parallelize` per model): `dlscale.models.parallelize.<arch>`
defines `PLAN`, a dlscale.registry.strategies.ParallelPlan. Found by convention, as the builders
are (dlscale.models.find_builder): there is no list to extend.

Pure data (module names of the PyTorch models in dlscale.models.torch.<arch>): the parse-time
checks read a plan without importing torch; dlscale.frameworks.torch_parallel applies it.
"""

from __future__ import annotations

import functools
import importlib

from dlscale.registry.strategies import ParallelPlan

NO_PLAN = ParallelPlan()
# The plans of a study's own models (arch zoo.<name>: dlscale.models.zoo.register), in this
# process: their blocks, found from the model itself.
STUDY_PLANS: dict[str, ParallelPlan] = {}


def plan_for(arch: str) -> ParallelPlan:
    """The plan of architecture `arch` (dlscale.models ModelSpec.arch); an architecture with no
    module here has none (ddp, fsdp and hsdp still run it, wrapping its top-level children)."""
    if arch in STUDY_PLANS:
        return STUDY_PLANS[arch]
    return _module_plan(arch)


@functools.cache
def _module_plan(arch: str) -> ParallelPlan:
    try:
        module = importlib.import_module(f"{__name__}.{arch}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{arch}":
            raise
        return NO_PLAN
    plan = getattr(module, "PLAN", None)
    if not isinstance(plan, ParallelPlan):
        raise TypeError(f"{module.__name__}.PLAN must be a ParallelPlan, not {type(plan).__name__}")
    return plan
