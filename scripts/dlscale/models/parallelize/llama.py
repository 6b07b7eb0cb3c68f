"""The Llama-3-class decoder (dlscale.models.torch.llama): its plan beyond ddp.

fully_shard wraps each TransformerBlock, then the root (torchtitan's units: the root holds the
token embedding, the final norm and the output head); activation checkpointing and per-block
compilation wrap the same blocks.

Tensor parallel, the complete plan (torchtitan's llama3 `apply_tp`): the token embedding split
by vocabulary rows, its output reduce-scattered over the sequence; the norms sequence parallel
(each rank normalises its part of the sequence); attention and SwiGLU as Megatron-LM splits
them (wq, wk, wv and w1, w3 by columns, wo and w2 by rows), their inputs all-gathered from the
sequence split first and their outputs reduce-scattered back to it; the output head split by
vocabulary columns, its logits left vocabulary-sharded for loss_parallel's cross-entropy. A
head tied to the token embedding (Llama 3.2 1B) is split as the embedding is (both Shard(0) of
the same [vocab, d] weight) and stays tied. Its degree must divide the query and the key/value
heads, and the sequence length.

The "blocks" plan (a cell with `tp_plan: blocks`; docs/pages/decisions/changed-defaults.md):
the blocks' Linear layers only, the embedding, the norms and the head whole on every rank of
the group.

A pipeline cuts it into stages of contiguous pieces (the embedding, the blocks, the final norm
and head), balanced by forward FLOPs (dlscale.models.torch.llama.pipeline_stage); an entry whose
head is tied to its embedding (llama3_1b) is refused (two stages cannot share it).
"""

from dlscale.registry.strategies import ParallelPlan

PLAN = ParallelPlan(
    tp={
        "layers.*.attention.wq": "colwise",
        "layers.*.attention.wk": "colwise",
        "layers.*.attention.wv": "colwise",
        "layers.*.attention.wo": "rowwise",
        "layers.*.feed_forward.w1": "colwise",
        "layers.*.feed_forward.w3": "colwise",
        "layers.*.feed_forward.w2": "rowwise",
    },
    tp_complete={
        "tok_embeddings": "embedding_to_sequence",
        "layers.*.attention_norm": "sequence_parallel",
        "layers.*.attention": "gather_sequence",
        "layers.*.attention.wq": "colwise",
        "layers.*.attention.wk": "colwise",
        "layers.*.attention.wv": "colwise",
        "layers.*.attention.wo": "rowwise_to_sequence",
        "layers.*.ffn_norm": "sequence_parallel",
        "layers.*.feed_forward": "gather_sequence",
        "layers.*.feed_forward.w1": "colwise",
        "layers.*.feed_forward.w3": "colwise",
        "layers.*.feed_forward.w2": "rowwise_to_sequence",
        "norm": "sequence_parallel",
        "output": "output_loss_parallel",
    },
    fsdp_units=("layers.*",),
    splits_heads=True,
    pipeline=True,
)
