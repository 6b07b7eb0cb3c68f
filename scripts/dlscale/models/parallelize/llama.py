"""The Llama-3-class decoder (dlscale.models.torch.llama): its plan beyond ddp.

fully_shard wraps each TransformerBlock, then the root (torchtitan's units: the root holds the
token embedding, the final norm and the output head). Tensor parallel splits the blocks as
Megatron-LM does: attention by heads (wq, wk, wv by columns, wo by rows; its degree must divide
the query and the key/value heads) and the SwiGLU (w1, w3 by columns, w2 by rows). The token
embedding, the norms and the output head stay whole on every rank of the group: torchtitan's
complete plan (the embedding row-wise, sequence-parallel norms, the head column-wise under
loss_parallel) is issue 49's work ("LLM training measured the way the field trains, II").
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
    fsdp_units=("layers.*",),
    splits_heads=True,
    pipeline=True,
)
