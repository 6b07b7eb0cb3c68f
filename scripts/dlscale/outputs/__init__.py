"""What a reader sees: the figure files a study has (`figure_layout`), where a figure is drawn
(`plotting`), the LaTeX report's macros and tables (`report`, its time-to-accuracy section
`tta_section`) and the captions of Snakemake's HTML report (`snakemake_report`). Imports no
framework and nothing of the run side (tests/unit/test_layers.py)."""
