"""One rank's own kit, below the adapters: who the rank is (`rank_context`), the device it uses
(`devices`: gpu_binding's allowed values and the device choice), the one timing loop and its
probes (`timing`: run_timed, the collective timeout, SyncAudit), energy (`energy`), telemetry
(`telemetry`), the node's probes (`node_probes`) and provenance (`provenance`).

An adapter (dlscale.frameworks) calls down into this floor; nothing here imports an adapter, the
launcher or the rank's main (dlscale.run), which sit above (tests/unit/test_layers.py states the
floors). It runs inside the allocation, in the framework's environment: the analysis and output
sides never import it.
"""
