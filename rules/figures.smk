# One rule per figure family; each reads only the scaling table, so figures regenerate without
# touching any cell (`snakemake --forcerun figure_throughput ...`).


rule figure_throughput:
    input:
        scaling=OUT["scaling"],
    output:
        pdf="results/figures/{figure}.pdf",
    wildcard_constraints:
        figure="throughput",
    params:
        column_width_in=STUDY.config["report"]["column_width_in"],
    log:
        "results/logs/figures/{figure}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


use rule figure_throughput as figure_speedup with:
    wildcard_constraints:
        figure="speedup",


use rule figure_throughput as figure_efficiency with:
    wildcard_constraints:
        figure="efficiency",


use rule figure_throughput as figure_frameworks with:
    wildcard_constraints:
        figure="frameworks",


use rule figure_throughput as figure_breakdown with:
    wildcard_constraints:
        figure="breakdown",
