# One rule draws every figure file: results/<study>/figures/{hardware}/{figure}.pdf, where
# {figure} is a family (dlscale.layout.FAMILIES) or {family}-{part} when a hardware key needs more than one
# file (the list is FIGURE_LAYOUT in common.smk; params.spec says what the file holds). It reads
# only the scaling table, so figures regenerate without touching any cell:
# `snakemake --profile profiles/local --forcerun figure`.


rule figure:
    input:
        scaling=OUT["scaling"],
        predictions=OUT["predictions"],  # dashed predicted extensions (rules/plan.smk)
    output:
        pdf=f"{OUT['figures']}/{{hardware}}/{{figure}}.pdf",
    log:
        f"{LOGS}/figures/{{hardware}}/{{figure}}.log",
    wildcard_constraints:
        figure=FIGURE_NAME_PATTERN,
    conda:
        "../envs/analysis.yaml"
    params:
        spec=figure_spec,
    script:
        "../scripts/figure.py"
