"""What drives a cell's ranks, above the adapters: the launcher that starts them (`launch`: where
ranks start), one rank's main (`train`: the cell's CLI, the adapter's set-up, the metrics it
writes) and the convergence workload's loop (`convergence_loop`). The rank's own kit (device,
timing loop, energy, telemetry, probes, provenance) is the floor below the adapters,
dlscale.rank. This side runs inside the allocation, in the framework's environment; the analysis
and output sides never import it (tests/unit/test_layers.py)."""
