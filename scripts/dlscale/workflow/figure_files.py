"""The study's figure files, computed from the planned cells when the workflow is parsed, so
Snakemake knows every file at parse time (rules/common.smk: the final targets, the report's
inputs, each figure job's spec).

Throughput figures: a bounded set of files per hardware key
(dlscale.outputs.figure_layout.figure_layout: one family per hardware, one panel per model x batch
policy, at most MAX_PANELS panels per file and MAX_SERIES framework x precision series per panel;
larger studies split into numbered parts). The layout is also the report's figure list (file
relative to the figures folder, caption, hardware, width), for the complete and the partial
report alike. The convergence workload's figures (time-to-accuracy, epochs-to-accuracy,
validation accuracy curves) are in their own folder per hardware key
(dlscale.outputs.figure_layout.convergence_layout).
"""

from __future__ import annotations

from snakemake.exceptions import WorkflowError

from dlscale.outputs.figure_layout import convergence_layout, figure_layout, variant
from dlscale.study.matrix import Study
from dlscale.study.script_workload import figures_in_units, units_of


class StudyFigures:
    """The figure files of `study`: `layout` and `convergence_layout` hold one entry per file
    (dlscale.outputs.figure_layout: its file relative to the figures folder, panels, series,
    caption, size); `figures` is the complete study's figures folder, named in the refusal of a
    file the study does not have."""

    def __init__(self, study: Study, figures: str):
        self.figures = figures
        width = study.config["report"]["column_width_in"]
        layout = figure_layout(
            [
                (
                    c.hardware,
                    c.framework,
                    c.model,
                    c.policy,
                    variant(c.precision, c.mode, c.parallelism),
                )
                # the scaling figures' cells: throughput cells and a user's script's (in its unit)
                for c in study.cells_of("throughput") + study.cells_of("script")
            ],
            column_width_in=width,
            plan=study.config["plan"],  # how far the predicted extensions reach (captions)
            devices={hw: study.hardware[hw]["device"] for hw in study.config["axes"]["hardware"]},
        )
        self.layout = figures_in_units(layout, units_of(study.config))  # scripts' units
        self.convergence_layout = convergence_layout(
            [
                (c.hardware, c.framework, c.model, c.policy, variant(c.precision, c.mode))
                for c in study.cells_of("convergence")
            ],
            column_width_in=width,
        )
        self._specs = {spec["file"]: spec for spec in self.layout}
        self._convergence_specs = {spec["file"]: spec for spec in self.convergence_layout}

    def files(self, out: dict[str, str]) -> list[str]:
        """Every throughput figure file in the folder of `out` (dlscale.workflow.paths)."""
        return [f"{out['figures']}/{spec['file']}" for spec in self.layout]

    def convergence_files(self, out: dict[str, str]) -> list[str]:
        """Every convergence figure file in the folder of `out`."""
        return [f"{out['figures']}/{spec['file']}" for spec in self.convergence_layout]

    def spec(self, hardware: str, figure: str) -> dict:
        """The layout entry (panels, series, size) of one throughput figure file."""
        return self._entry(self._specs, f"{hardware}/{figure}.pdf", "figure")

    def convergence_spec(self, hardware: str, figure: str) -> dict:
        """The layout entry of one convergence figure file."""
        file = f"{hardware}/convergence/{figure}.pdf"
        return self._entry(self._convergence_specs, file, "convergence figure")

    def _entry(self, specs: dict, file: str, kind: str) -> dict:
        """The entry of `file` in `specs`, or a clear error naming the study's files of that
        kind."""
        try:
            return specs[file]
        except KeyError:
            raise WorkflowError(
                f"dlscale: {self.figures}/{file} is not a {kind} of this study; "
                f"its {kind}s: {', '.join(specs) or 'none'}"
            ) from None
