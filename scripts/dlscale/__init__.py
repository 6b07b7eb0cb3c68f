"""dlscale: scaling studies of distributed deep-learning training.

Where things happen (one obvious place each):
- a cell's parameters enter:   dlscale.cell.Cell    (made from config by matrix.build_matrix)
- ranks start:                 dlscale.launch       (local processes or `srun`)
- one rank trains and times:   dlscale.train + dlscale.frameworks.<name>
- metrics are written:         dlscale.metrics      (versioned JSON lines, atomic)
- cells become a table:        dlscale.collect
- a figure is drawn:           dlscale.plotting
- the report is built:         dlscale.report
"""

__version__ = "0.1.0"
