"""`dlscale models list [--environment ENV]` (also `python -m dlscale.workflow.models_command`):
the shipped models and the entry points of the `dlscale.models` group installed in an
environment (default: the driver's); `dlscale models show STUDY_FILE`: what a study's own
models are (config `models:`, docs/pages/your-model.md) and their cells."""

from __future__ import annotations

import sys

from dlscale.study.study_models import checkout, entry_points, environment_python, show


def main(argv: list[str]) -> int:
    import argparse

    from dlscale.models import SPECS

    parser = argparse.ArgumentParser(prog="dlscale models", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["list", "show"])
    parser.add_argument("study_file", nargs="?", help="show: the study file")
    parser.add_argument(
        "--environment",
        default=None,
        help="the environment whose entry points to list: a name under the environments "
        "folder or an absolute path (default: the driver's)",
    )
    args = parser.parse_args(argv)
    if args.command == "show":
        from dlscale.study.matrix import load_workflow_study

        if not args.study_file:
            parser.error("show needs the study file")
        study = load_workflow_study({"study_file": args.study_file}, checkout())
        print(show(study), end="")
        return 0
    print("shipped models (axes.model):")
    for name, spec in SPECS.items():
        print(f"  {name:18} {spec.description}")
    python = environment_python(args.environment, checkout())
    found = entry_points(python)
    where = args.environment or "the driver's environment"
    print(f"entry points of the dlscale.models group in {where} (models: <name>: entry_point):")
    for ep in found:
        print(f"  {ep['entry_point']:18} {ep['distribution']} {ep['version']} ({ep['value']})")
    if not found:
        print("  (none)")
    print(
        "transformers configurations: any configuration class of transformers "
        "(models: <name>: transformers: config_class), run in pytorch-hf"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
