# Every cell's metrics -> one tidy table per granularity (rank, cell, scaling point).
# A `run:` block, not `script:`: it runs inside Snakemake's process, where a `script:` job would
# first serialise all of the study's inputs for the script, which grows quadratically with the
# number of cells (10,000 cells: tens of seconds before the first file is read).
# It therefore runs in the driver environment (.venv, envs/workflow.txt), never in a conda env.
# dlscale.analysis.collect (pandas, scipy) is imported in the job, not at parse time: every Slurm job's
# snakemake parses the workflow again (benchmarks/planning.py, parse only).
# Each table is also an output in Snakemake's report (table_report, rules/common.smk).
from dlscale.analysis.mfu import hardware_peaks


rule collect:
    input:
        metrics=collect_metrics,
    output:
        ranks=table_report("ranks"),
        cells=table_report("cells"),
        scaling=table_report("scaling"),
        quarantine=table_report("quarantine"),
        status=table_report("status"),
        systems=table_report("systems"),
        convergence=table_report("convergence"),
        epochs=table_report("epochs"),
        time_to_accuracy=table_report("time_to_accuracy"),
    log:
        f"{RULE_OUT['logs']}/collect.log",
    params:
        straggler_threshold=STUDY.config["straggler_threshold"],
        validity_tolerance=STUDY.config["convergence"]["validity_tolerance"],
        # each hardware key's dense peak TFLOP/s (hardware file peak_tflops): cells.csv's MFU
        peaks=hardware_peaks(STUDY.hardware),
    run:
        from dlscale.analysis.collect import write_named_tables

        # every planned cell: those not among the inputs (a partial build) are listed as
        # failed or missing in the status table
        write_named_tables(
            metrics_files(),
            dict(output.items()),
            params.straggler_threshold,
            log[0],
            validity_tolerance=params.validity_tolerance,
            peaks=params.peaks,
        )
