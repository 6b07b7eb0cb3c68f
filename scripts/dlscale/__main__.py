"""`dlscale <command> ...` (console script) and `python -m dlscale <command> ...`: the everyday
commands that work on results folders. Each is also its own module (`python -m
dlscale.decisions.regression_check`).
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "check": (
        "dlscale.decisions.regression_check",
        "verdicts against the regression references; exit 1 on a FAIL",
    ),
    "bless": (
        "dlscale.decisions.regression_check",
        "record a study's results as the references of one system",
    ),
    "compare": ("dlscale.decisions.compare", "two studies' results folders, cell by cell"),
    "history": (
        "dlscale.decisions.history_command",
        "configurations across studies in the results database; `history import` records folders",
    ),
    "models": (
        "dlscale.workflow.models_command",
        "the shipped models, a venv's entry-point models, a study's own models",
    ),
    "status": (
        "dlscale.workflow.status_command",
        "a study's cells: measured, running, pending, failed, jobs",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print("usage: dlscale {" + ",".join(COMMANDS) + "} ...", file=sys.stderr)
        for name, (_, what) in COMMANDS.items():
            print(f"  {name:8} {what}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv if argv[0] == "bless" else argv[1:])


if __name__ == "__main__":
    sys.exit(main())
