"""From measurements to numbers: per-cell records to tidy tables (`collect`), medians and honest
intervals (`stats`), every planned cell's end (`cell_status`), the Systems table
(`systems_table`), time to accuracy (`time_to_accuracy`), the scaling model per series
(`scaling_series`: what a series is and what it holds; `scaling_model`: the fits and
predictions) and model FLOPs utilisation (`mfu`). Reads files; imports no framework and nothing
of the run side (tests/unit/test_layers.py)."""
