# Every cell's metrics -> one tidy table per granularity (rank, cell, scaling point).
# A `run:` block, not `script:`: it runs inside Snakemake's process, where a `script:` job would
# first serialise all of the study's inputs for the script, which grows quadratically with the
# number of cells (10,000 cells: tens of seconds before the first file is read).
# It therefore runs in the driver environment (.venv, envs/workflow.txt), never in a conda env.
# dlscale.analysis.collect (pandas, scipy) is imported in the job, not at parse time: every Slurm job's
# snakemake parses the workflow again (benchmarks/planning.py, parse only).
from dlscale.analysis.mfu import hardware_peaks
from dlscale.outputs.snakemake_report import table_caption, table_category, table_labels


rule collect:
    input:
        metrics=collect_metrics,
    output:
        ranks=report(
            RULE_OUT["ranks"],
            caption=table_caption("ranks"),
            category=table_category("ranks"),
            labels=table_labels("ranks"),
        ),
        cells=report(
            RULE_OUT["cells"],
            caption=table_caption("cells"),
            category=table_category("cells"),
            labels=table_labels("cells"),
        ),
        scaling=report(
            RULE_OUT["scaling"],
            caption=table_caption("scaling"),
            category=table_category("scaling"),
            labels=table_labels("scaling"),
        ),
        quarantine=report(
            RULE_OUT["quarantine"],
            caption=table_caption("quarantine"),
            category=table_category("quarantine"),
            labels=table_labels("quarantine"),
        ),
        status=report(
            RULE_OUT["status"],
            caption=table_caption("status"),
            category=table_category("status"),
            labels=table_labels("status"),
        ),
        systems=report(
            RULE_OUT["systems"],
            caption=table_caption("systems"),
            category=table_category("systems"),
            labels=table_labels("systems"),
        ),
        convergence=report(
            RULE_OUT["convergence"],
            caption=table_caption("convergence"),
            category=table_category("convergence"),
            labels=table_labels("convergence"),
        ),
        epochs=report(
            RULE_OUT["epochs"],
            caption=table_caption("epochs"),
            category=table_category("epochs"),
            labels=table_labels("epochs"),
        ),
        time_to_accuracy=report(
            RULE_OUT["time_to_accuracy"],
            caption=table_caption("time_to_accuracy"),
            category=table_category("time_to_accuracy"),
            labels=table_labels("time_to_accuracy"),
        ),
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
