"""The ground floor: what exists, one record each. Every other floor reads these records and
none restates them (tests/unit/registry/test_registry.py keeps the "listed once" claims true).

- `frameworks`: one `Framework` record per framework (adapter entry point, environments,
  model package, workloads, strategies, CUDA probe and limit, the sync and initialisation facts
  the report states);
- `strategies`: one `Strategy` record per parallel strategy (its degrees, whether it splits
  layers, shards or pipelines, the model-side plan it needs) and `ParallelPlan`, the shape of
  a model's plan (dlscale.models.parallelize keeps one per architecture, beside the models);
- `parallel_dims`: a cell's degrees (`ParallelDims`, torchtitan's shape) and their checks;
- `gpu_bindings`: hardware.yaml `gpu_binding`'s allowed values, from the entry to the srun
  options and the rank's device choice;
- `cuda_probes`: whether an environment's build drives CUDA, and for which CUDA version, read
  from its files;
- `cuda_drivers`: which NVIDIA driver runs which CUDA build (the table in cuda_drivers.json,
  with its source);
- `formats`: the dataset formats dlscale.data reads;
- `launchers`: one `Launcher` record per way of starting a cell's ranks (local processes, srun):
  which Snakemake executors need it, whether its ranks are a Slurm step, its profile (the code
  that starts the ranks: one class per launcher in dlscale.run.launchers);
- `containers`: one record per container engine the ranks can run in, and its command line.

Standard library only, and nothing from dlscale above this floor: the schema enums, the
workflow's parse-time checks and scripts/setup.sh (through `python -m dlscale.registry`) read
it before any framework or venv exists.
"""
