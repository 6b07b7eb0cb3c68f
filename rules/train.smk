# One job per cell: the launcher (scripts/dlscale/launch.py) starts the cell's ranks, locally or
# with srun inside the cell's Slurm allocation, and writes the cell's metrics file atomically.


rule train:
    output:
        metrics=CELL_PATTERN,
    log:
        "results/logs/train/{hardware}/{framework}/{model}/{policy}/{precision}/n{nodes}/r{rep}.log",
    params:
        cell=cell_json,
        python=framework_python,
        launcher=STUDY.config["launcher"],
        study=STUDY.config["study"],
        config_hash=STUDY.config_hash,
        git_commit=GIT_COMMIT,
    threads: cell_threads
    resources:
        nodes=cell_nodes,
        tasks=cell_tasks,
        cpus_per_task=cell_cpus_per_task,
        mem_mb=cell_mem_mb,
        runtime=cell_runtime,
        slurm_partition=cell_partition,
        slurm_extra=cell_slurm_extra,
        mpi=cell_mpi,
        # every cell counts 1 against the profile's `resources: dlscale_cell=N` limit; the
        # local profile sets N=1 so no cell is measured while another one runs
        dlscale_cell=1,
    conda:
        framework_conda_env
    shell:
        "{params.python:q} -m dlscale.launch --launcher {params.launcher:q} --cell-json {params.cell:q}"
        " --study {params.study:q} --config-hash {params.config_hash:q}"
        " --git-commit={params.git_commit:q} --output {output.metrics:q} > {log:q} 2>&1"
