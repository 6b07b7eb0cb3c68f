"""What a reader sees: the figure files a study has (`figure_layout`), where a figure is drawn
(`plotting`; the convergence families in `convergence_plots`, the planner's figure in
`plan_figure`; the style, grid, axes and legend they share in `figure_kit`), the LaTeX report
(`report`: tables and files; `report_macros`: its numbers as macros; `cell_table`: the cell
summary table; `latex_text`: escaping and number formats; its time-to-accuracy section
`tta_section`) and the captions of Snakemake's HTML report (`snakemake_report`). Imports no
framework and nothing of the run side (tests/unit/test_layers.py)."""
