"""The study's description: what is measured, before any job runs.

- a cell (`cell`) and the matrix of cells a study file expands to (`matrix`: where a cell's
  parameters enter; `cell_fields`: the fields it derives beyond the axes; `workloads`: each
  workload's axes and batches; `matrix_checks`: the refusals before any job; `study_size`: the
  cells it plans and the max_cells refusal); a user's script as a cell (`script_workload`, its
  pattern check `script_patterns`, its files and content hash `script_files`);
- loading and validating the study file (`config`), the hardware file (`hardware`), which keys
  enter a cell's identity (`hashes`), and the one error all of them raise (`errors`);
- the learning rate a cell trains with (`lr`), a cell's Slurm resources (`resources`), regression
  references (`references`), the planner's partitions (`partitions`), a cell's parallel
  dimensions (`parallel_dims`), and the measurement protocol's fixed facts (`protocol`:
  warm-up, probes, telemetry, the metrics format's event names).

Nothing here imports a framework's environment.
"""
