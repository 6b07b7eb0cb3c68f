"""Framework adapters: one module per framework, named after it, each defining `Adapter` (a
subclass of `base.Adapter`). What a framework is (its adapter entry point, environments,
strategies, ...) is its record in dlscale.registry.frameworks; `get_adapter` there imports the
adapter a rank uses, and only that one, so a framework's environment never needs the others.

Beside the adapter modules: `base` (the adapter contract and kit), `torch_model` (what the
pytorch and horovod adapters share) and `torch_parallel` (PyTorch's strategies beyond ddp, from
the model's plan in dlscale.models.parallelize). An adapter calls down into the rank's floor
(dlscale.rank: device, timing loop, energy, telemetry, provenance), never up into dlscale.run.
Adding a framework: docs/pages/extending.md.
"""
