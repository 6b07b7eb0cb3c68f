# macros + tables + figures -> report.tex -> report.pdf (with the study's tables/cells.csv
# attached).
# Regenerate only the report with
# `snakemake --profile profiles/local --forcerun report_inputs report_tex` (no cell reruns).


rule report_inputs:
    input:
        cells=OUT["cells"],
        scaling=OUT["scaling"],
        quarantine=OUT["quarantine"],
        status=OUT["status"],
        systems=OUT["systems"],
        convergence=OUT["convergence"],
        time_to_accuracy=OUT["time_to_accuracy"],
    output:
        macros=OUT["macros"],
        cells_table=OUT["cells_table"],
        quarantine_table=OUT["quarantine_table"],
        status_table=OUT["status_table"],
        systems_table=OUT["systems_table"],
        convergence_table=OUT["convergence_table"],
    log:
        f"{LOGS}/report_inputs.log",
    conda:
        "../envs/analysis.yaml"
    params:
        config=STUDY.config,
        n_planned=len(STUDY.cells),
    script:
        "../scripts/report_inputs.py"


rule report_tex:
    input:
        template=REPORT_TEMPLATE,
    output:
        tex=OUT["tex"],
    log:
        f"{LOGS}/report_tex.log",
    conda:
        "../envs/analysis.yaml"
    params:
        title=report_title_param,
        figures=FIGURE_LAYOUT,
        convergence_figures=CONVERGENCE_LAYOUT,
        attachment=report_attachment(),
    script:
        "../scripts/report_tex.py"


rule report_pdf:
    input:
        tex=OUT["tex"],
        macros=OUT["macros"],
        cells_table=OUT["cells_table"],
        quarantine_table=OUT["quarantine_table"],
        status_table=OUT["status_table"],
        systems_table=OUT["systems_table"],
        convergence_table=OUT["convergence_table"],
        verdicts_table=OUT["verdicts_table"],  # rules/check.smk
        cells=OUT["cells"],  # attached to the PDF
        figures=figure_files(),
        convergence_figures=convergence_figure_files(),
        plan_macros=OUT["plan_macros"],  # the Recommendations section (rules/plan.smk)
        plan_tables=OUT["plan_tables"],
        plan_figure=OUT["plan_figure"],
    output:
        pdf=report(
            OUT["pdf"],
            caption="../report/pdf.rst",
            category="Report",
            labels={"file": "report.pdf"},
        ),
    log:
        OUT["pdf_log"],
    conda:
        "../envs/latex.yaml"
    script:
        "../scripts/report_pdf.py"
