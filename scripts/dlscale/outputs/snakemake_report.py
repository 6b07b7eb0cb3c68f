"""Snakemake's own report (`snakemake --report results/<study>/report.zip`): what each annotated
output is called there. The rules flag their outputs with `report(...)`: captions are the files
in the workflow's `report/` folder, categories and labels come from here (functions of a job's
wildcards and params, so a figure is filed by its family and hardware and labelled by the axis
values it shows).

Categories: "<family> figures" (subcategory: the hardware key), "Cells" (per-cell status and
provenance), "Tables", "Time to accuracy (real data)" (the convergence workload's tables),
"Regression check", "Report" (the PDF).
"""

from __future__ import annotations

FIGURES = "{family} figures"
CELLS, TABLES, CHECK, PDF = "Cells", "Tables", "Regression check", "Report"
CONVERGENCE = "Time to accuracy (real data)"

# Each table of the study: (category, caption file in report/, what a row is).
TABLES_SHOWN = {
    "cells": (CELLS, "cells.rst", "one per measured cell and repetition, with provenance"),
    "status": (CELLS, "status.rst", "one per planned cell: ok, failed or missing"),
    "scaling": (TABLES, "scaling.rst", "one per group and node count"),
    "ranks": (TABLES, "ranks.rst", "one per cell, repetition and rank"),
    "systems": (TABLES, "systems.rst", "one per hardware key, field and value"),
    "quarantine": (TABLES, "quarantine.rst", "one per rejected metrics file"),
    "verdicts": (CHECK, "verdicts.rst", "one per scaling point and metric"),
    "convergence": (CONVERGENCE, "convergence.rst", "one per convergence cell and repetition"),
    "epochs": (CONVERGENCE, "epochs.rst", "one per convergence cell, repetition and epoch"),
    "time_to_accuracy": (
        CONVERGENCE,
        "time_to_accuracy.rst",
        "one per convergence group and node count",
    ),
}


def figure_category(wildcards, params) -> str:
    return FIGURES.format(family=params.spec["family"])


def figure_subcategory(wildcards, params) -> str:
    return f"hardware {params.spec['hardware']}"


def figure_labels(wildcards, params) -> dict[str, str]:
    """The axis values a figure file shows (dlscale.outputs.figure_layout's entry)."""
    spec = params.spec
    return {
        "figure": spec["family"],
        "hardware": spec["hardware"],
        "models": ", ".join(spec["models"]),
        "policies": ", ".join(spec["policies"]),
        "frameworks": ", ".join(dict.fromkeys(s[0] for s in spec["series"])),
        "part": f"{spec['part']} of {spec['parts']}",
    }


def table_labels(name: str) -> dict[str, str]:
    return {"table": f"{name}.csv", "rows": TABLES_SHOWN[name][2]}


def table_category(name: str) -> str:
    return TABLES_SHOWN[name][0]


def table_caption(name: str) -> str:
    """The caption file, relative to a rule file in rules/."""
    return f"../report/{TABLES_SHOWN[name][1]}"
