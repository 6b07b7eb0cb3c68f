"""Running one cell: the launcher that starts its ranks (`launch`: where ranks start), who a rank
is (`rank_context`), one rank's CLI and timing (`train`), the convergence workload's loop
(`convergence_loop`), the rank's device (`devices`), energy (`energy`), telemetry (`telemetry`),
the node's probes (`node_probes`) and provenance (`provenance`). This side runs inside the
allocation, in the framework's environment; the analysis and output sides never import it
(tests/unit/test_layers.py)."""
