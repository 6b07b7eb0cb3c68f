"""The GPT-2-class decoder (dlscale.models.torch.gpt): its plan beyond ddp.

Tensor parallel splits attention by heads (query, key and value projections by columns, the
output projection by rows) and the MLP (by columns, then rows); the embeddings, LayerNorms and
the tied head stay whole on every rank of the group. Its heads must divide the degree.
fully_shard wraps each block, then the root. No pipeline: the head is tied to the token
embedding, which two stages cannot share.
"""

from dlscale.registry.strategies import ParallelPlan

PLAN = ParallelPlan(
    tp={
        "blocks.*.attn.wq": "colwise",
        "blocks.*.attn.wk": "colwise",
        "blocks.*.attn.wv": "colwise",
        "blocks.*.attn.wo": "rowwise",
        "blocks.*.mlp.fc": "colwise",
        "blocks.*.mlp.proj": "rowwise",
    },
    fsdp_units=("blocks.*",),
    splits_heads=True,
    why_not_pipeline="its head is tied to its token embedding, which two stages cannot share",
)
