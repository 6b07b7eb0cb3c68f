# macros + tables + figures -> report.tex -> report.pdf (with the study's tables/cells.csv
# attached).
# Regenerate only the report with
# `snakemake --profile profiles/local --forcerun report_inputs report_tex` (no cell reruns).
from dlscale.store.preflight_results import PREFLIGHT_DIR


rule report_inputs:
    input:
        cells=RULE_OUT["cells"],
        scaling=RULE_OUT["scaling"],
        quarantine=RULE_OUT["quarantine"],
        status=RULE_OUT["status"],
        systems=RULE_OUT["systems"],
        convergence=RULE_OUT["convergence"],
        time_to_accuracy=RULE_OUT["time_to_accuracy"],
    output:
        macros=RULE_OUT["macros"],
        cells_table=RULE_OUT["cells_table"],
        memory_table=RULE_OUT["memory_table"],
        quarantine_table=RULE_OUT["quarantine_table"],
        status_table=RULE_OUT["status_table"],
        systems_table=RULE_OUT["systems_table"],
        convergence_table=RULE_OUT["convergence_table"],
        script_section=RULE_OUT["script_section"],
    log:
        f"{RULE_OUT['logs']}/report_inputs.log",
    params:
        config=STUDY.config,
        n_planned=len(STUDY.cells),
        preflight_dir=f"{RESULTS}/{PREFLIGHT_DIR}",  # dlscale.workflow.preflight's results
    run:
        from dlscale.outputs.report import write_report_inputs

        write_report_inputs(
            {**dict(input.items()), **dict(output.items())},
            config=params.config,
            n_planned=params.n_planned,
            preflight_dir=params.preflight_dir,
        )


rule report_tex:
    input:
        template=REPORT_TEMPLATE,
    output:
        tex=RULE_OUT["tex"],
    log:
        f"{RULE_OUT['logs']}/report_tex.log",
    params:
        title=report_title_param,
        figures=FIGURE_LAYOUT,
        convergence_figures=CONVERGENCE_LAYOUT,
        attachment=report_attachment(),
    run:
        from dlscale.outputs.report import render_tex

        render_tex(
            output.tex,
            title=params.title,
            figures=params.figures,
            convergence_figures=params.convergence_figures,
            attachment=params.attachment,
        )


rule report_pdf:
    input:
        **report_sources(RULE_OUT),  # report.tex, macros, tables (rules/common.smk)
        cells=RULE_OUT["cells"],  # attached to the PDF
        figures=report_figures,  # the throughput and convergence figures of its folder
    output:
        pdf=report(
            RULE_OUT["pdf"],
            caption="../report/pdf.rst",
            category="Report",
            labels={"file": "report.pdf"},
        ),
    log:
        RULE_OUT["pdf_log"],
    run:
        from dlscale.outputs.report import compile_pdf

        compile_pdf(input.tex, log=log[0])
