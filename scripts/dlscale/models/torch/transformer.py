"""Small pre-norm transformer encoder for sequence classification."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dlscale.models import ModelSpec

__all__ = ["TransformerClassifier", "from_spec"]


class TransformerClassifier(nn.Module):
    """Token + learned positional embedding, pre-norm encoder, mean pool, linear head.

    Every sequence is assumed to be full length (no padding mask), so the pooled
    representation is the plain mean over positions. The encoder layers are
    :class:`torch.nn.TransformerEncoderLayer` (``batch_first=True``, ``norm_first=True``,
    GELU); a final LayerNorm follows the last layer, as usual for pre-norm stacks.

    With the defaults (vocab 8192, seq_len 128, d_model 256, 4 layers, 4 heads, FFN 1024,
    2 classes) the model has 5,289,986 parameters.

    Args:
        vocab_size: Number of distinct token ids.
        seq_len: Maximum (and expected) sequence length.
        num_classes: Number of output logits.
        d_model: Embedding / hidden width.
        num_layers: Number of encoder layers.
        num_heads: Number of attention heads.
        dim_feedforward: Hidden width of the feed-forward sublayer.
        dropout: Dropout probability inside the encoder layers.
    """

    def __init__(
        self,
        vocab_size: int = 8192,
        seq_len: int = 128,
        num_classes: int = 2,
        d_model: int = 256,
        num_layers: int = 4,
        num_heads: int = 4,
        dim_feedforward: int = 1024,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model,
            num_heads,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        # The nested-tensor fast path does not apply to norm_first layers; disabling it
        # up front avoids PyTorch's warning about it.
        self.encoder = nn.TransformerEncoder(
            layer, num_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        self.head = nn.Linear(d_model, num_classes)

        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding.weight, std=0.02)

    def forward(self, tokens: Tensor) -> Tensor:
        """Map token ids ``(N, L)`` (``L <= seq_len``) to logits ``(N, num_classes)``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        x = self.encoder(x)
        return self.head(x.mean(dim=1))


def from_spec(spec: ModelSpec, **encoder) -> TransformerClassifier:
    """The classifier of ``spec`` (the registry's ``arch="transformer"``): vocabulary,
    sequence length and classes from the spec, the encoder's sizes (``d_model``, ``num_layers``,
    ``num_heads``, ``dim_feedforward``, ``dropout``) from ``arch_kwargs``."""
    return TransformerClassifier(
        vocab_size=spec.vocab_size,
        seq_len=spec.input_shape[0],
        num_classes=spec.num_classes,
        **encoder,
    )


class TransformerStage(nn.Module):
    """One pipeline stage of the encoder classifier (dlscale.models.torch.transformer): the
    first stage embeds the tokens, every stage runs its contiguous run of encoder layers, the
    last normalises, pools and classifies: the model's forward, cut between layers."""

    def __init__(self, model: nn.Module, layers: list[nn.Module], first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.token_embedding = model.token_embedding
            self.position_embedding = model.position_embedding
        # under the whole model's names (encoder.layers.<i>), so its tensor-parallel and FSDP
        # plans (dlscale.models.parallelize.transformer) apply to the stage unchanged
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(layers)
        if last:
            self.norm, self.head = model.encoder.norm, model.head

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.token_embedding(x) + self.position_embedding(positions)
        for layer in self.encoder.layers:
            x = layer(x)
        if self.last:
            x = self.head(self.norm(x).mean(dim=1))
        return x


def pipeline_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Stage `stage` of `stages` of the classifier, for a pipeline
    (dlscale.frameworks.torch_pipeline; dlscale.models.parallelize.transformer.PLAN.pipeline):
    the embeddings, the encoder layers and the head (final norm, pooling, classifier) cut by
    forward FLOPs per token (dlscale.models.torch.pipeline_split). The embeddings are lookups
    and the head is tiny, so its layers split as evenly as they go, earlier stages taking the
    remainder, as before the split counted them."""
    from dlscale.models.torch.pipeline_split import forward_flops, stage_pieces

    layers = list(model.encoder.layers)
    d = model.token_embedding.embedding_dim
    seq_len = model.position_embedding.num_embeddings
    costs = [forward_flops(layer, 4.0 * d * seq_len) for layer in layers]
    head = forward_flops(model.encoder.norm) + forward_flops(model.head)
    first, last, start, stop = stage_pieces(costs, 0.0, head, stage, stages)
    return TransformerStage(model, layers[start:stop], first, last)
