# Every cell's metrics -> one tidy table per granularity (rank, cell, scaling point).


rule collect:
    input:
        metrics=metrics_files(),
    output:
        ranks=OUT["ranks"],
        cells=OUT["cells"],
        scaling=OUT["scaling"],
        quarantine=OUT["quarantine"],
        status=OUT["status"],
    params:
        straggler_threshold=STUDY.config["straggler_threshold"],
    log:
        "results/logs/collect.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/collect.py"
