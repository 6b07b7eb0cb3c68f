"""The encoder (dlscale.models.torch.transformer): its plan beyond ddp.

Tensor parallel splits the feed-forward layers, Megatron-LM's MLP split (the first by columns,
the second by rows: one all-reduce of the output). The attention keeps its fused input
projection (nn.MultiheadAttention's in_proj_weight, no nn.Linear) whole on every rank of the
tensor-parallel group. fully_shard wraps each encoder layer, then the root. A pipeline splits
its layers into stages of contiguous layers.
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
