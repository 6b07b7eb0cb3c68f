"""The study's description: what is measured, before any job runs.

A cell (`cell`) and the matrix of cells a study file expands to (`matrix`: where a cell's
parameters enter); loading and validating the study and hardware files (`config`); the learning
rate a cell trains with (`lr`); a cell's Slurm resources (`resources`); regression references
(`references`); the planner's partitions (`partitions`); a cell's parallel dimensions
(`parallel_dims`); and the measurement protocol's fixed facts (`protocol`: warm-up, probes,
event names of the metrics format). Nothing here imports a framework's environment.
"""
