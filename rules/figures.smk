# One rule per figure family; each writes that family's files of every hardware key
# (results/figures/{hardware}/{family}.pdf, or {family}-{part}.pdf when a hardware key needs
# more than one file; the list is FIGURE_LAYOUT in common.smk). Each reads only the scaling
# table, so figures regenerate without touching any cell:
# `snakemake --forcerun figure_throughput figure_speedup figure_efficiency figure_frameworks
# figure_breakdown`.


rule figure_throughput:
    input:
        scaling=OUT["scaling"],
    output:
        pdf="results/figures/{hardware}/{figure}.pdf",
    wildcard_constraints:
        figure=figure_family_pattern("throughput"),
    params:
        spec=figure_spec,
    log:
        "results/logs/figures/{hardware}/{figure}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


use rule figure_throughput as figure_speedup with:
    wildcard_constraints:
        figure=figure_family_pattern("speedup"),


use rule figure_throughput as figure_efficiency with:
    wildcard_constraints:
        figure=figure_family_pattern("efficiency"),


use rule figure_throughput as figure_frameworks with:
    wildcard_constraints:
        figure=figure_family_pattern("frameworks"),


use rule figure_throughput as figure_breakdown with:
    wildcard_constraints:
        figure=figure_family_pattern("breakdown"),
