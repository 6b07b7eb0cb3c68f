# Every cell's metrics -> one tidy table per granularity (rank, cell, scaling point).


rule collect:
    input:
        metrics=metrics_files(),
    output:
        ranks="results/tables/ranks.csv",
        cells="results/tables/cells.csv",
        scaling="results/tables/scaling.csv",
        quarantine="results/tables/quarantine.csv",
    params:
        straggler_threshold=STUDY.config["straggler_threshold"],
    log:
        "results/logs/collect.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/collect.py"
