"""Which variables a hardware entry's `env:` may set: a shell variable's name, and none the
project sets for every rank or reads to know who a rank is (RESERVED_ENV, with the reason).
Read by the hardware file's checks (dlscale.study.hardware) and by the launcher again
(dlscale.run.site_env). Pure Python, the standard library and dlscale.registry only: importable
in every framework environment the launcher runs in.
"""

from __future__ import annotations

import re

from dlscale.registry import frameworks

# `env:` names: what a shell variable may be called (the schema checks the values: literal text,
# no NUL or line break).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables the project sets for every rank, or reads to know who a rank is: an entry's `env:`
# may not set them (name or prefix -> why).
RESERVED_ENV = {
    "CUDA_VISIBLE_DEVICES": "Slurm's GPU binding sets it (gpu_binding)",
    "CUDA_DEVICE_ORDER": "the launcher sets it (PCI_BUS_ID: CUDA numbers GPUs as nvidia-smi)",
    "MASTER_ADDR": "the launcher sets the rendezvous",
    "MASTER_PORT": "the launcher sets the rendezvous",
    "RANK": "a rank reads it to know who it is (dlscale.rank.rank_context)",
    "WORLD_SIZE": "a rank reads it to know who it is (dlscale.rank.rank_context)",
    "LOCAL_RANK": "a rank reads it to know who it is (dlscale.rank.rank_context)",
    "LOCAL_WORLD_SIZE": "a rank reads it to know who it is (dlscale.rank.rank_context)",
    "GROUP_RANK": "a rank reads it to know who it is (dlscale.rank.rank_context)",
    "NODE_RANK": "a rank reads it to know who it is (dlscale.rank.rank_context)",
    "OMP_NUM_THREADS": "the launcher sets it from cpus_per_rank (the cell's threads)",
    "PYTHONPATH": "it would change the code the ranks run (the cell's environment)",
    "PYTHONHOME": "it would change the code the ranks run (the cell's environment)",
    "PYTHONUNBUFFERED": "the launcher sets it",
    "PATH": "a literal value replaces what the modules put there: prepend in a modulefile",
    "LD_LIBRARY_PATH": "a literal value replaces what the modules put there: prepend in a "
    "modulefile",
    "MODULEPATH": "env: is applied after the modules load: set it in the site's module "
    "initialisation or the job's environment",
    "BASH_ENV": "the module command runs without startup files",
    "SLURM_": "Slurm's own variables (the allocation, the step, the binding)",
    "SRUN_": "srun's options: they would change the step the launcher asks for",
    "SBATCH_": "sbatch's options: they would change the job the plugin asks for",
    "DLSCALE_": "the launcher's rank variables (dlscale.rank.rank_context)",
    **frameworks.reserved_env(),  # what an adapter sets for every rank (its record's)
}


def env_name_problem(name) -> str | None:
    """Why `name` cannot be an `env:` variable of a hardware entry, or None."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return (
            f"{name!r} is not a variable name (allowed: letters, digits and _, not starting "
            "with a digit)"
        )
    for reserved, why in RESERVED_ENV.items():
        if name == reserved or (reserved.endswith("_") and name.startswith(reserved)):
            return f"{name!r} is not allowed: {why}"
    return None
