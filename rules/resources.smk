# Resources only. Every Slurm resource of a cell is derived from its hardware entry in
# config/hardware.yaml (site facts) by dlscale.resources; nothing partition- or sbatch-specific
# is typed in a rule. They depend on (hardware, nodes) only: computed once per train rule.
from dlscale.resources import class_resources as _class_resources


def class_resources(hardware, nodes):
    """threads and Slurm resources of the cells of one resource class (rules/train.smk)."""
    return _class_resources(STUDY.config, STUDY.hardware[hardware], nodes)
