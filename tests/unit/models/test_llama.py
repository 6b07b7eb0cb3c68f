"""The Llama-3 family: shapes and parameter counts of the three registry entries (the
1B and 8B built on the meta device), RoPE, grouped-query attention and causality against
independent implementations, init_weights reproducing the seed's values after to_empty, the
debug model training on a CPU, and the refusals before any job (frameworks, pipeline, heads)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dlscale.models import get_spec, llama_ffn_dim, llama_param_count, spec_for
from dlscale.models.torch import build, example_batch, llama
from dlscale.study.config import ConfigError

from helpers import ranks

# name: (d_model, layers, heads, KV heads, SwiGLU width, vocab, seq_len, tied, parameters)
SHAPES = {
    "llama3_debug": (64, 2, 4, 2, 192, 2048, 64, False, 360_768),
    # Llama 3.2 1B as released (head tied to the embedding): 1.24 B
    "llama3_1b": (2048, 16, 32, 8, 8192, 128_256, 8192, True, 1_235_814_400),
    # Llama 3.1 8B: 8.03 B
    "llama3_8b": (4096, 32, 32, 8, 14336, 128_256, 8192, False, 8_030_261_248),
}


@pytest.mark.parametrize("name", SHAPES)
def test_shapes_and_parameter_counts(name: str) -> None:
    d, layers, heads, kv_heads, ffn, vocab, seq_len, tied, params = SHAPES[name]
    spec = get_spec(name)
    assert spec.param_count == params and spec.input_shape == (seq_len,)
    assert spec.vocab_size == spec.num_classes == vocab
    with torch.device("cpu" if name == "llama3_debug" else "meta"):
        model = build(name)
    assert sum(p.numel() for p in model.parameters()) == params
    assert len(model.layers) == layers and model.rope.shape == (seq_len, d // heads // 2, 2)
    assert "rope" not in model.state_dict()  # a non-persistent buffer
    block = model.layers[0]
    head_dim = d // heads
    assert block.attention.wq.weight.shape == (d, d)
    assert block.attention.wk.weight.shape == block.attention.wv.weight.shape
    assert block.attention.wk.weight.shape == (kv_heads * head_dim, d)
    assert block.feed_forward.w1.weight.shape == (ffn, d) == block.feed_forward.w3.weight.shape
    assert block.feed_forward.w2.weight.shape == (d, ffn)
    assert isinstance(block.attention_norm, torch.nn.RMSNorm) and isinstance(
        model.norm, torch.nn.RMSNorm
    )
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert (model.output.weight is model.tok_embeddings.weight) == tied
    a = spec.arch_kwargs
    assert llama_ffn_dim(d, a["multiple_of"], a.get("ffn_dim_multiplier")) == ffn


def test_the_1b_untied_would_count_the_head_apart() -> None:
    """Llama 3.2 1B's released count is with its tied head; untied it would hold 128256 x 2048
    more (what the registry entry's comment states)."""
    a = dict(get_spec("llama3_1b").arch_kwargs, tie_embeddings=False)
    assert llama_param_count(128_256, 8192, **a) - 1_235_814_400 == 128_256 * 2048


def test_ffn_width_rule_is_torchtitans() -> None:
    assert llama_ffn_dim(4096, 1024, 1.3) == 14336  # 10922 -> 14198 -> 14336
    assert llama_ffn_dim(2048, 1024, 1.5) == 8192  # 5461 -> 8191 -> 8192
    assert llama_ffn_dim(256, 256) == 768  # torchtitan's debug model: 682 -> 768
    assert llama_ffn_dim(8192, 4096, 1.3) == 28672  # Llama 3 70B


def _reference_rope(x, theta, scaling_factor=None):
    """Meta's reference: pairs of adjacent channels as complex numbers times cis(position x
    frequency), the frequencies scaled by Llama 3.1's rule written as its per-frequency loop."""
    s, d = x.shape[1], x.shape[-1]
    freqs = [1.0 / theta ** (i / d) for i in range(0, d, 2)]
    if scaling_factor is not None:
        low, high, old = 1.0, 4.0, 8192
        scaled = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < old / high:
                scaled.append(f)
            elif wavelen > old / low:
                scaled.append(f / scaling_factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                scaled.append((1 - smooth) * f / scaling_factor + smooth * f)
        freqs = scaled
    angles = torch.outer(
        torch.arange(s, dtype=torch.float64), torch.tensor(freqs, dtype=torch.float64)
    )
    cis = torch.polar(torch.ones_like(angles), angles)  # (S, d/2)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis[None, :, None, :]).flatten(-2)


@pytest.mark.parametrize("scaling", [None, 8.0, 32.0])
def test_rope_matches_the_complex_reference(scaling) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 48, 3, 64)
    cache = llama.rope_cache(64, 48, 500_000.0, scaling)
    out = llama.apply_rope(x, cache)
    torch.testing.assert_close(
        out.double(), _reference_rope(x, 500_000.0, scaling), atol=2e-5, rtol=0
    )
    # a rotation: norms kept; scores depend on the distance of positions only
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    q = llama.apply_rope(torch.ones(1, 48, 1, 64), cache)[0, :, 0]
    assert torch.allclose(q[5] @ q[2], q[40] @ q[37], atol=1e-4)


def test_grouped_query_attention_matches_sdpa_enable_gqa() -> None:
    """repeat_kv next to each other: query head h reads KV head h // (heads / KV heads), as
    PyTorch's own enable_gqa does."""
    torch.manual_seed(0)
    att = llama.Attention(64, num_heads=8, num_kv_heads=2)
    x = torch.randn(2, 16, 64)
    cache = llama.rope_cache(8, 16, 500_000.0)
    q = llama.apply_rope(att.wq(x).view(2, 16, 8, 8), cache).transpose(1, 2)
    k = llama.apply_rope(att.wk(x).view(2, 16, 2, 8), cache).transpose(1, 2)
    v = att.wv(x).view(2, 16, 2, 8).transpose(1, 2)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = att.wo(y.transpose(1, 2).reshape(2, 16, 64))
    torch.testing.assert_close(att(x, cache), expected)
    with pytest.raises(ValueError, match="num_heads 8 is not divisible by num_kv_heads 3"):
        llama.Attention(64, 8, 3)


def test_causal_and_logits_per_position() -> None:
    spec = get_spec("llama3_debug")
    torch.manual_seed(0)
    model = build("llama3_debug")
    x, _ = example_batch(spec, 2)
    changed = x.clone()
    changed[:, 40:] = (changed[:, 40:] + 1) % spec.vocab_size
    with torch.no_grad():
        a, b = model(x).view(2, 64, -1), model(changed).view(2, 64, -1)
    torch.testing.assert_close(a[:, :40], b[:, :40])  # no position sees a later token
    assert not torch.allclose(a[:, 40:], b[:, 40:])


def test_init_weights_gives_the_seeds_values_after_to_empty() -> None:
    """from_spec draws nothing while it builds (meta device) and initialises by init_weights:
    a model built on the meta device, materialised and initialised from the same seed holds the
    same values (what a sharded model initialised after sharding needs); torchtitan's init
    (norms one, embedding N(0, 1), depth-scaled projections, head N(0, d^-1/2) cut at 3 sd)."""
    spec = get_spec("llama3_debug")
    torch.manual_seed(3)
    built = build("llama3_debug")
    torch.manual_seed(3)
    with torch.device("meta"):
        later = build("llama3_debug")
    assert later.output.weight.is_meta and later.rope.is_meta
    later.to_empty(device="cpu")
    later.init_weights()
    for (name, p), q in zip(built.named_parameters(), later.parameters()):
        assert torch.equal(p, q), name
    assert torch.equal(built.rope, later.rope)
    torch.manual_seed(4)
    built.init_weights()  # in place, from the generator's state: new values
    assert not torch.equal(built.output.weight, later.output.weight)
    std = {n: float(p.detach().std()) for n, p in later.named_parameters()}
    assert std["layers.0.attention_norm.weight"] == 0 == std["norm.weight"]
    assert std["tok_embeddings.weight"] == pytest.approx(1.0, rel=0.02)
    assert std["layers.0.attention.wq.weight"] == pytest.approx(0.02, rel=0.05)
    assert std["layers.1.attention.wo.weight"] == pytest.approx(0.02 / 2, rel=0.05)
    assert std["layers.1.feed_forward.w2.weight"] == pytest.approx(0.02 / 2, rel=0.05)
    assert std["output.weight"] == pytest.approx(64**-0.5 * 0.986, rel=0.05)  # cut at 3 sd
    assert float(later.output.weight.detach().abs().max()) <= 3 * 64**-0.5
    assert spec.arch_kwargs["rope_theta"] == 500_000.0


def test_the_debug_model_trains_on_a_cpu() -> None:
    """A few AdamW steps on one batch lower the loss (the debug shape runs a step in
    milliseconds on one thread)."""
    spec = get_spec("llama3_debug")
    torch.manual_seed(0)
    model = build("llama3_debug")
    x, y = example_batch(spec, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.1
    assert abs(losses[0] - math.log(spec.vocab_size)) < 1.0  # near uniform at the start


def test_other_sequence_lengths_keep_the_parameters() -> None:
    spec = spec_for("llama3_8b", 2048)
    assert spec.param_count == 8_030_261_248 and spec.input_shape == (2048,)
    with torch.device("meta"):
        model = build("llama3_8b", 2048)
    assert model.rope.shape == (2048, 64, 2)


# ---- refused before any job --------------------------------------------------------------------
def _config(base_config, **axes) -> dict:
    config = copy.deepcopy(base_config)
    config["workloads"] = ["throughput"]
    config["axes"].update(model=["llama3_debug"], **axes)
    return config


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"axes": {"framework": ["pytorch", "horovod"]}},
            "framework 'horovod' has no builder for model 'llama3_debug' \\(the Llama family "
            ".*Horovod.*\\); frameworks that build it: pytorch",
        ),
        (
            {"axes": {"framework": ["pytorch", "tensorflow"]}},
            "framework 'tensorflow' has no builder for model 'llama3_debug'",
        ),
        (
            # the Llama family runs as stages: at most its pieces (2 layers, the
            # embedding and the head), 2 per rank under interleaved_1f1b
            {
                "axes": {"parallelism": ["pp"]},
                "ranks_per_node": 4,
                "pp_degree": 4,
                "pp_schedule": "interleaved_1f1b",
            },
            "pp_degree: 8 stages .4 ranks x 2 under interleaved_1f1b. but the model has 2 "
            "layers .*allowed: at most 2",
        ),
        (
            {"axes": {"parallelism": ["tp"]}, "ranks_per_node": 4, "tp_degree": 4},
            "heads of model 'llama3_debug' \\(4 heads, 2 KV heads\\) over tensor-parallel "
            "degree 4 .*allowed tp_degree: a divisor of 4, 2 and ranks_per_node 4",
        ),
    ],
)
def test_llama_cells_refused_before_any_job(root, base_config, changes, message) -> None:
    from dlscale.study.matrix import load_study

    config = _config(base_config, **changes.pop("axes", {}))
    config.update(changes)
    with pytest.raises(ConfigError, match=message):
        load_study(config, root)


def test_llama_cells_of_the_strategies_are_planned(root, base_config) -> None:
    from dlscale.study.matrix import load_study

    config = _config(base_config, parallelism=["ddp", "fsdp", "hsdp", "tp", "fsdp+tp"])
    config.update(ranks_per_node=2)
    cells = load_study(config, root).cells
    assert {c.parallelism for c in cells} == {"ddp", "fsdp", "hsdp", "tp", "fsdp+tp"}
    assert {c.seq_len for c in cells} == {64}


def test_init_weights_after_sharding_gives_the_single_processs_values(tmp_path) -> None:
    """What meta-device initialisation after sharding relies on: llama3_debug built on meta,
    fully_shard-ed over 2 gloo ranks (each block, then the root), materialised and
    init_weights-ed with each rank's own seed holds, gathered whole, exactly what one process
    builds from rank 0's seed; each rank holds half of it (every parameter a DTensor)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from dlscale.run.launchers import ports

    helper = Path(__file__).resolve().parents[2] / "helpers" / "sharded_init.py"
    port = ports.local_port(2)
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(helper), str(r), "2", str(port), str(outs[r])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = ranks.outputs(procs, timeout=300)
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    results = [json.loads(o.read_text()) for o in outs]
    for r in results:
        assert r["differ"] == [] and r["dtensors"] and r["rope_equal"]
    assert sum(r["local_numel"] for r in results) == get_spec("llama3_debug").param_count
