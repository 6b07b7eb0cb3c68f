"""The encoder (dlscale.models.torch.transformer): its plan beyond ddp.

Tensor parallel splits the feed-forward layers, Megatron-LM's MLP split (the first by columns,
the second by rows: one all-reduce of the output). The attention keeps its fused input
projection (nn.MultiheadAttention's in_proj_weight, no nn.Linear) whole on every rank of the
tensor-parallel group, as do the embedding, the norms and the head: the plan is kept as it was
(no complete plan: its tp cells run the "blocks" plan and keep their identity; splitting the
fused in_proj by heads needs a hand-written attention, which nn.MultiheadAttention is not).
fully_shard wraps each encoder layer, then the root; activation checkpointing and per-block
compilation wrap the same layers. A pipeline splits its layers into stages of contiguous
layers.
"""

from dlscale.registry.strategies import ParallelPlan

PLAN = ParallelPlan(
    tp={
        "encoder.layers.*.linear1": "colwise",
        "encoder.layers.*.linear2": "rowwise",
    },
    fsdp_units=("encoder.layers.*",),
    pipeline=True,
)
