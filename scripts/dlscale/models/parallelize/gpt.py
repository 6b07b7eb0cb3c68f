"""The GPT-2-class decoder (dlscale.models.torch.gpt): its plan beyond ddp.

Tensor parallel, the complete plan (torchtitan's llama3 plan, adapted to GPT-2's learned
position embedding): the token embedding split by vocabulary rows, its output all-reduced (the
position embedding, whole, is added to the whole sequence), then cut to this rank's part of the
sequence at the first block; the LayerNorms sequence parallel; attention split by heads (query,
key and value projections by columns, the output projection by rows) and the MLP (by columns,
then rows), their inputs all-gathered from the sequence split and their outputs
reduce-scattered back to it; the head split by vocabulary columns under loss_parallel. The
head is tied to the token embedding: both are Shard(0) of the same [vocab, d] weight, so the
split keeps them one parameter. Its heads and the sequence length must divide by the degree.

The "blocks" plan (a cell with `tp_plan: blocks`; docs/pages/decisions/changed-defaults.md):
the blocks' Linear layers only, the embeddings, LayerNorms and the tied head whole on every
rank of the group.

fully_shard wraps each block, then the root; activation checkpointing and per-block
compilation wrap the same blocks. No pipeline: the head is tied to the token embedding, which
two stages cannot share.
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
    tp_complete={
        "token_embedding": "embedding",
        "blocks.0": "scatter_sequence",
        "blocks.*.ln_1": "sequence_parallel",
        "blocks.*.attn": "gather_sequence",
        "blocks.*.attn.wq": "colwise",
        "blocks.*.attn.wk": "colwise",
        "blocks.*.attn.wv": "colwise",
        "blocks.*.attn.wo": "rowwise_to_sequence",
        "blocks.*.ln_2": "sequence_parallel",
        "blocks.*.mlp": "gather_sequence",
        "blocks.*.mlp.fc": "colwise",
        "blocks.*.mlp.proj": "rowwise_to_sequence",
        "ln_f": "sequence_parallel",
        "head": "output_loss_parallel",
    },
    fsdp_units=("blocks.*",),
    splits_heads=True,
    why_not_pipeline="its head is tied to its token embedding, which two stages cannot share",
)
