# One job per cell: the launcher (scripts/dlscale/run/launch.py) starts the cell's ranks, locally or
# with srun inside the cell's Slurm allocation, and writes the cell's metrics file atomically.
# Its one input is the cell, serialised whole (dlscale.study.cell.Cell.to_json).
#
# One rule per resource class, workload and parallelism (dlscale.study.cell.train_rule:
# train_<hardware>_n<nodes> for throughput cells, converge_<hardware>_n<nodes> for convergence
# cells, with _<parallelism> appended for a strategy other than ddp and _rpn<k> for cells of
# other ranks per node than their hardware's default, config axes.ranks_per_node): the cells of a
# class request identical Slurm resources, which a job array needs (the Slurm plugin submits
# the ready jobs of one rule as one array, with the first job's resources; profiles/slurm
# `dlscale-array-jobs`). Every Slurm resource derives from the class's hardware entry in
# config/hardware.yaml (site facts) through dlscale.study.resources.class_resources, computed once per
# class; nothing partition- or sbatch-specific is typed here.
# Every class rule is the same rule; only its wildcard constraints, its output folder (the
# workload's, dlscale.study.cell.CELL_PATTERNS) and a convergence cell's dataset input differ.
from dlscale.study.cell import cell_pattern, train_log_pattern, train_rule
from dlscale.study.resources import class_resources

for _workload, _hardware, _nodes, _parallelism, _ranks in STUDY.train_rules():
    _threads, _resources = class_resources(STUDY.config, STUDY.hardware[_hardware], _nodes, _ranks)

    rule:
        name:
            train_rule(_workload, _parallelism, _ranks).format(hardware=_hardware, nodes=_nodes)
        input:
            **train_inputs(STUDY, _workload),
        output:
            metrics=cell_pattern(_workload, _parallelism, _ranks is not None),
        log:
            train_log_pattern(_workload, _parallelism, _ranks is not None),
        # a path naming its ranks per node (.../rpn<k>/) takes this class's only
        wildcard_constraints:
            **({"ranks_per_node": str(_ranks)} if _ranks else {}),
            hardware=re.escape(_hardware),
            nodes=str(_nodes),
            parallelism=re.escape(_parallelism),
        conda:
            # a script's cells: the environment it runs in (script_conda_env, rules/common.smk)
            script_conda_env if _workload == "script" else "../envs/{framework}.yaml"
        threads: _threads
        # the Slurm plugin's resource names (dlscale.study.resources.class_resources): nodes, tasks,
        # cpus_per_task, mem_mb, runtime, slurm_partition, slurm_extra, and constraint, gres,
        # tasks_per_gpu when the hardware entry asks for them (options the plugin owns and
        # refuses in slurm_extra); dlscale_cell=1 for the profiles' cell limit
        resources:
            **_resources,
        params:
            # everything the cell's measurement depends on (its launcher included): a change
            # re-measures the cell only when the user asks (rules/common.smk, dlscale.store.measurements)
            cell=CELL_JSON[_workload],
            python=framework_python,
        shell:
            "{params.python:q} -m dlscale.run.launch --cell-json {params.cell:q}"
            " --output {output.metrics:q} > {log:q} 2>&1"
