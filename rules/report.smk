# macros + tables + figures -> report.tex -> report.pdf. Regenerate only the report with
# `snakemake --profile profiles/local --forcerun report_inputs` (no cell reruns).

rule report_inputs:
    input:
        cells="results/tables/cells.csv",
        scaling="results/tables/scaling.csv",
        quarantine="results/tables/quarantine.csv",
    output:
        macros="results/report/macros.tex",
        cells_table="results/report/cells_table.tex",
        quarantine_table="results/report/quarantine_table.tex",
    params:
        config=STUDY.config,
        n_planned=len(STUDY.cells),
    log:
        "results/logs/report_inputs.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report_inputs.py"


rule report_tex:
    input:
        template=REPORT_TEMPLATE,
    output:
        tex="results/report/report.tex",
    params:
        title=report_title(),
        figures=report_figures(),
    log:
        "results/logs/report_tex.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report_tex.py"


rule report_pdf:
    input:
        tex="results/report/report.tex",
        macros="results/report/macros.tex",
        cells_table="results/report/cells_table.tex",
        quarantine_table="results/report/quarantine_table.tex",
        figures=expand("results/figures/{figure}.pdf", figure=FIGURES),
    output:
        pdf="results/report/report.pdf",
    log:
        "results/logs/report_pdf.log",
    conda:
        "../envs/latex.yaml"
    script:
        "../scripts/report_pdf.py"
