"""dlscale: scaling studies of distributed deep-learning training.

Where things happen (one obvious place each):
- a cell's parameters enter:   dlscale.study.cell.Cell    (made from config by matrix.build_matrix)
- ranks start:                 dlscale.run.launch       (local processes or `srun`)
- one rank trains and times:   dlscale.run.train + dlscale.frameworks.<name>
- metrics are written:         dlscale.store.metrics      (versioned JSON lines, atomic)
- cells become a table:        dlscale.analysis.collect
- a figure is drawn:           dlscale.outputs.plotting
- the report is built:         dlscale.outputs.report
"""

__version__ = "0.1.0"
