# Every cell's metrics -> one tidy table per granularity (rank, cell, scaling point).
# A `run:` block, not `script:`: it runs inside Snakemake's process, where a `script:` job would
# first serialise all of the study's inputs for the script, which grows quadratically with the
# number of cells (10,000 cells: tens of seconds before the first file is read; issue 7).
# It therefore runs in the driver environment (.venv, envs/workflow.txt), never in a conda env.
from dlscale.collect import write_tables


rule collect:
    input:
        metrics=metrics_files(),
    output:
        ranks=OUT["ranks"],
        cells=OUT["cells"],
        scaling=OUT["scaling"],
        quarantine=OUT["quarantine"],
        status=OUT["status"],
        systems=OUT["systems"],
    log:
        f"{LOGS}/collect.log",
    params:
        straggler_threshold=STUDY.config["straggler_threshold"],
    run:
        write_tables(
            list(input.metrics),
            ranks_csv=output.ranks,
            cells_csv=output.cells,
            scaling_csv=output.scaling,
            quarantine_csv=output.quarantine,
            status_csv=output.status,
            systems_csv=output.systems,
            straggler_threshold=params.straggler_threshold,
            log=log[0],
        )
