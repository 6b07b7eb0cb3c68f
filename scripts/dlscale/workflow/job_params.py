"""What a train job's params and inputs (rules/common.smk, rules/train.smk) are built from: the hook
that hands Snakemake a params function's signature once (`per_job`), the cell's JSON
(`cell_json_param`), the environment each cell runs in (`Interpreters`: its folder, its Python
and its conda file) and a convergence cell's dataset (`train_inputs`).

The environments live in .venvs/ or where DLSCALE_ENVS_DIR says
(dlscale.registry.frameworks.environments_dir), as scripts/setup.sh built them; a job gets its
environment's interpreter by its absolute path.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

from snakemake.common import overwrite_function_params
from snakemake.exceptions import WorkflowError
from snakemake.io import ancient

from dlscale.data import FORMATS as DATA_FORMATS
from dlscale.registry.frameworks import FRAMEWORKS, environments_dir
from dlscale.study.hardware import environment_variant
from dlscale.study.matrix import Study
from dlscale.study.script_workload import environments_of

# The shipped real data (rules/data.smk writes it): one copy per format under results/data/,
# shared by every study.
SHIPPED_DIGITS = "results/data/digits"


def per_job(func):
    """A train job's params are functions of its wildcards. Snakemake asks a params function's
    signature at each of its calls, three times per job (inspect.signature: ~60,000 calls in the
    dry run of a 10,000-cell study); its own hook snakemake.common.overwrite_function_params
    hands it the signature once (the same mapping, so the same arguments are passed)."""
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


def cell_json_param(cell_of, workload: str):
    """The params function of a workload's train rules: the cell the job's wildcards name
    (`cell_of(wildcards, workload)`), serialised whole, the launcher's one input
    (dlscale.study.cell.Cell.to_json)."""

    def cell_json(wildcards):
        return cell_of(wildcards, workload).to_json()

    return per_job(cell_json)


def shipped_data(data_format: str):
    """The shipped digits in `data_format` (one of dlscale.data.FORMATS) as a job's input:
    marked ancient, so rewriting them (e.g. after rules/data.smk changes) never re-runs the
    cells that read them."""
    if data_format not in DATA_FORMATS:
        raise WorkflowError(
            f"dlscale: no shipped data in format {data_format!r}; "
            f"allowed: {', '.join(DATA_FORMATS)}"
        )
    return ancient(f"{SHIPPED_DIGITS}/{data_format}")


def train_inputs(study: Study, workload: str) -> dict:
    """What a workload's train rules read besides their cell: a convergence cell's dataset
    (a shipped one is written by the shipped_digits job of rules/data.smk and read through
    shipped_data(), an ancient input)."""
    if workload != "convergence":
        return {}
    from dlscale.study.workloads import SHIPPED_DATASETS, data_path

    conv = study.config["convergence"]
    if conv["dataset"] in SHIPPED_DATASETS:
        return {"data": shipped_data(conv["data_format"])}
    return {"data": data_path(study.config)}


class Interpreters:
    """The environments of a study's cells in the checkout at `basedir`. Each interpreter is
    found once per (hardware, framework, precision) or (hardware, model), not once per job: a
    10,000-cell dry run asks 10,000 times."""

    def __init__(self, study: Study, basedir: str | Path):
        self.study = study
        self.basedir = basedir
        self.environments = environments_dir(basedir)
        # a script's label (its cells' framework) -> the framework whose environment it runs in
        # (dlscale.study.script_workload)
        self.script_environments = environments_of(study.config)
        self.framework_python = functools.cache(self._framework_python)
        self.model_python = functools.cache(self._model_python)

    def environment_dir(self, name: str | None) -> Path | None:
        """The folder of environment `name` (None: the driver's own environment)."""
        return None if name is None else self.environments / name

    def conda_env(self, framework: str) -> str:
        """The conda environment file of a framework's cells under --sdm conda; a script's:
        its environment's (envs/<framework>.yaml of the framework it runs in)."""
        env = self.script_environments.get(framework, framework)
        return str(Path(self.basedir) / "envs" / f"{env}.yaml")

    def _framework_python(self, hardware: str, framework: str, precision: str | None = None):
        """The driver venv's interpreter for PyTorch's CPU build, else
        <environments>/<env>/bin/python (<env>-cuda for GPU hardware; a float8 cell's
        <env>-float8, with torchao: dlscale.study.matrix.float8_environment)."""
        from dlscale.study.matrix import float8_environment

        entry = self.study.hardware[hardware]
        framework = self.script_environments.get(framework, framework)  # a script's environment
        env = FRAMEWORKS[framework].environment_for(environment_variant(entry), entry)
        if precision == "float8" and "float8" in FRAMEWORKS[framework].capabilities:
            env = float8_environment(env)
        if env is None:
            return sys.executable
        return str(self.environment_dir(env) / "bin" / "python")

    def _model_python(self, hardware: str, model: str) -> str | None:
        """A model of the study's `models:` section: its own environment
        (dlscale.study.study_models); None for any other model."""
        from dlscale.study.study_models import model_python

        return model_python(self.study, hardware, model, self.basedir)
