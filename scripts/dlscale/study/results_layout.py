"""What lives directly under results/ besides the study folders (dlscale.study.cell.STUDY_DIR):
the names the project itself writes there, which no study may take."""

from __future__ import annotations

# Everything else the project writes directly under results/ (name -> what writes it). Only
# study folders live there: no study may be named like one of these (case-insensitively, for a
# case-insensitive filesystem), so no command of the project deletes or shares a study's folder
# (dlscale.study.config.study_name_problem refuses the name when the study is parsed). A new file
# or folder directly under results/ is added here. Names starting with "_" or "." (e.g. the
# migration's results/_before-studies-<time>/) cannot be study names at all (the schema's
# pattern), so they need no entry.
RESULTS_DATABASE = "dlscale.sqlite"  # results/<this>: the default results database
RESERVED_UNDER_RESULTS = {
    "data": "the shipped datasets, shared by every study (rules/data.smk)",
    "logs": "the Slurm jobs' logs (profiles/slurm: dlscale-logdir results/logs/slurm)",
    "site": "the documentation site (docs/mkdocs.yml: site_dir, cleaned by every build)",
    # Snakemake's report where the README sent it before each study kept its own
    # (`--report results/<study>/report.zip`): earlier checkouts hold one there
    "report.zip": "Snakemake's report at its earlier path (now results/<study>/report.zip)",
    "README.md": "the shipped description of results/",
    # the layout before studies had their own folders (dlscale.store.migrate moves them)
    "runs": "cells of the layout before per-study folders",
    "tables": "tables of the layout before per-study folders",
    "figures": "figures of the layout before per-study folders",
    "report": "the report of the layout before per-study folders",
    # the results database (dlscale.store.database, config `database`): its SQLite file and
    # what SQLite and the project keep beside it
    RESULTS_DATABASE: "the results database (SQLite)",
    f"{RESULTS_DATABASE}-wal": "the results database's write-ahead log (SQLite)",
    f"{RESULTS_DATABASE}-shm": "the results database's shared memory (SQLite)",
    f"{RESULTS_DATABASE}-journal": "the results database's rollback journal (SQLite)",
    f"{RESULTS_DATABASE}.lock": "the results database's lock on a network file system",
}
