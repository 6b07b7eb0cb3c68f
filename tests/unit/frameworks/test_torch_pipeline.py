"""Pipelines as the field trains them: a schedule per study (gpipe, 1f1b, interleaved_1f1b),
micro-batches by default at least twice the stages, the bubble fraction in the rank's record,
stages balanced by forward FLOPs with the embedding and the head counted, the Llama family as
stages, and pp combined with fsdp and tp in one mesh (dlscale.frameworks.torch_pipeline).

On real ranks (gloo, one process each; tests/helpers/parallel_ranks.py): llama3_debug trains
to the single-process loss within RTOL after 3 AdamW steps under each schedule, pp+fsdp and
pp+fsdp+tp (replicas of a pipeline: test_torch_parallel_ranks' 2 x 2 pp case), and each rank holds
its stage's share of the state. AdamW divides a constant factor on the gradients out, so the
same processes also train each schedule, pp+fsdp, pp+tp and pp+fsdp+tp with plain SGD
(`/sgd0`: no momentum, no clipping) within PLAIN_RTOL, a check that sees a micro-batch whose
gradient the schedule leaves unscaled (and, with data parallel, a wrong average): each asserts
that such a break moves the single-process loss by at least SIGHT times its tolerance. The
8-rank pp x dp_shard x tp case is benchmarks/pipeline_combinations.py."""

from __future__ import annotations

import copy

import pytest

from dlscale.models.torch.pipeline_split import balanced_bounds
from dlscale.registry.parallel_dims import (
    PIPELINE_SCHEDULES,
    ParallelDims,
    cell_microbatches,
    pipeline_problems,
)
from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study

from .test_torch_parallel_ranks import (
    PLAIN_RTOL,
    RTOL,
    STATE_RTOL,
    check_sight,
    data_parallel_degree,
    loss_check,
    reference,
    run_ranks,
    state_bytes,
)

ADAMW_BYTES_PER_PARAMETER = 16  # float32 parameter, gradient and AdamW's two moments


# ---- the records --------------------------------------------------------------------------
def test_the_bubble_fraction_is_the_literatures():
    """(p-1)/(m+p-1) for GPipe and 1F1B; interleaving v stages per rank divides the bubble's
    share of the ideal time by v (Narayanan et al. 2021): (p-1)/(v m+p-1) of the step."""
    gpipe, one_f_one_b, interleaved = (
        PIPELINE_SCHEDULES[n] for n in ("gpipe", "1f1b", "interleaved_1f1b")
    )
    assert gpipe.bubble_fraction(4, 4) == pytest.approx(3 / 7)  # the 43 % at 4 stages
    assert one_f_one_b.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert interleaved.stages_per_rank == 2
    assert interleaved.bubble_fraction(4, 8) == pytest.approx(3 / 19)
    bubble, ideal = 3 / 19, 1 - 3 / 19  # as Narayanan et al. state it: bubble / ideal time
    assert bubble / ideal == pytest.approx((1 / 2) * (4 - 1) / 8)


def test_micro_batches_default_to_twice_the_stages_that_fit():
    assert cell_microbatches("pp", 2, None, 8, "1f1b") == 4
    assert cell_microbatches("pp+fsdp", 4, None, 16, "interleaved_1f1b") == 8
    assert cell_microbatches("pp", 2, None, 6, "gpipe") == 6  # 4 does not divide 6
    assert cell_microbatches("pp", 2, 3, 6, "gpipe") == 3  # stated: kept
    assert cell_microbatches("fsdp", 4, None, 16) == 1


def test_stages_are_cut_where_the_heaviest_is_lightest():
    assert balanced_bounds([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert balanced_bounds([0, 1, 1, 1, 1, 0], 4) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert balanced_bounds([0, 1, 1, 2.3], 2) == [(0, 3), (3, 4)]  # a heavy head alone
    assert balanced_bounds([5, 1, 1, 1], 3) == [(0, 1), (1, 3), (3, 4)]
    with pytest.raises(ValueError, match="5 stages for 4 pieces"):
        balanced_bounds([1, 1, 1, 1], 5)


def test_llama_stages_count_the_head_and_hold_the_model_once():
    import torch

    from dlscale.models.torch import build
    from dlscale.models.torch.llama import pipeline_stage

    model = build("llama3_debug")
    total = sum(p.numel() for p in model.parameters())
    for stages in (2, 4):
        parts = [pipeline_stage(model, s, stages) for s in range(stages)]
        held = [p for part in parts for p in part.parameters()]
        assert len({id(p) for p in held}) == len(held) and sum(p.numel() for p in held) == total
        assert parts[0].first and parts[-1].last
    # 2 stages: the head (2 d V = 262,272 FLOPs/token) outweighs both blocks (2 x 114,944):
    # it gets a stage of its own
    two = [pipeline_stage(model, s, 2) for s in range(2)]
    assert [p.layer_ids for p in two] == [[0, 1], []]
    x = torch.randint(0, 2048, (2, 64))
    with torch.no_grad():
        assert torch.equal(two[1](two[0](x)), model(x))
    model.tie_embeddings = True  # as llama3_1b's entry has it
    with pytest.raises(ValueError, match="tied to its token embedding"):
        pipeline_stage(model, 0, 2)


@pytest.mark.parametrize("model", ["transformer_small", "llama3_debug"])
def test_every_stage_with_blocks_is_one_the_tensor_parallel_plan_splits(model):
    """A stage keeps the whole model's module names, so the model's tensor-parallel plan
    (dlscale.models.parallelize) finds its blocks: pp+tp splits them, never runs a stage whole
    on ranks that would repeat one another's work (the pipeline refuses such a stage)."""
    from dlscale.frameworks.torch_parallel import _matching
    from dlscale.frameworks.torch_pipeline import _pieces, pipeline_stage
    from dlscale.models import get_spec
    from dlscale.models.parallelize import plan_for
    from dlscale.models.torch import build

    arch = get_spec(model).arch
    whole = build(model)
    for stage in range(2):
        part = pipeline_stage(whole, arch, stage, 2)
        if any("layers." in piece for piece in _pieces(part)):
            assert _matching(part, list(plan_for(arch).tp)), (model, stage, _pieces(part))


@pytest.mark.parametrize(
    "strategy, nodes, rpn, tp, pp, dims",
    [
        ("pp+fsdp", 2, 2, 1, 2, (1, 2, 1)),
        ("pp+tp", 2, 2, 2, 2, (1, 1, 2)),
        ("pp+tp", 2, 4, 2, 2, (2, 1, 2)),
        ("pp+fsdp+tp", 2, 4, 2, 2, (1, 2, 2)),
    ],
)
def test_pipelines_combine_with_shards_and_tensor_parallel_in_one_mesh(
    strategy, nodes, rpn, tp, pp, dims
):
    d = ParallelDims.of(strategy, nodes, rpn, tp, pp)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.pp) == (*dims, pp)
    assert d.mesh() == ((pp, *dims), ("pp", "dp_replicate", "dp_shard", "tp"))


# ---- refused before any job -------------------------------------------------------------------
def pipeline_config(base_config, **changes) -> dict:
    config = copy.deepcopy(base_config)
    config["workloads"] = ["throughput"]
    config["axes"].update(model=["llama3_debug"], parallelism=["pp"], nodes=[1])
    config["ranks_per_node"] = 2
    for key, value in changes.items():
        (config["axes"] if key in config["axes"] else config)[key] = value
    return config


def test_a_study_of_llama_pipelines_plans_schedules_and_micro_batches(root, base_config):
    config = pipeline_config(
        base_config,
        parallelism=["pp", "pp+fsdp", "pp+fsdp+tp"],
        ranks_per_node=4,
        pp_degree=2,
        tp_degree=2,
        pp_schedule="interleaved_1f1b",
    )
    cells = {c.parallelism: c for c in load_study(config, root).cells}
    assert {p: (c.pp_degree, c.tp_degree, c.microbatches) for p, c in cells.items()} == {
        "pp": (2, 1, 4),
        "pp+fsdp": (2, 1, 4),
        "pp+fsdp+tp": (2, 2, 4),
    }
    assert {c.pp_schedule for c in cells.values()} == {"interleaved_1f1b"}
    assert "pp_schedule" in cells["pp"].identity()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"pp_schedule": "zero_bubble"}, "pp_schedule.*gpipe.*1f1b.*interleaved_1f1b"),
        (
            {"microbatches": 1},
            "microbatches: 1: 1f1b needs at least as many micro-batches as stages .2.*"
            "allowed: 2, 4, 8",
        ),
        (
            {"pp_schedule": "interleaved_1f1b", "ranks_per_node": 4, "pp_degree": 4},
            "pp_degree: 8 stages .4 ranks x 2 under interleaved_1f1b. but the model has 2 "
            "layers .* 4 pieces.; allowed: at most 2",
        ),
        ({"model": ["llama3_1b"]}, "llama3_1b.*tied to its token embedding"),
        (
            {"parallelism": ["pp+fsdp+tp"], "ranks_per_node": 4, "pp_degree": 3, "tp_degree": 2},
            "pp_degree: 3 does not divide the 2 pipeline ranks .*4 ranks / tp 2.; allowed: 2",
        ),
        ({"parallelism": ["pp+tp"], "model": ["gpt2_tiny"]}, "gpt2_tiny.*head is tied"),
    ],
)
def test_bad_pipelines_are_refused_before_any_job(root, base_config, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_study(pipeline_config(base_config, **changes), root)


def test_interleaved_micro_batches_must_suit_its_rounds():
    assert pipeline_problems(8, 4, 6, 6, 8, "x", "interleaved_1f1b") == []  # 1 round of 6
    (msg,) = pipeline_problems(4, 2, 3, 5, 8, "x", "interleaved_1f1b")
    assert "microbatches: 3 does not divide a pipeline's batch of 10" in msg
    (msg,) = pipeline_problems(4, 2, 5, 5, 8, "x", "interleaved_1f1b")
    assert "5: interleaved_1f1b runs max(1, microbatches // stages) = 2 rounds" in msg
    assert "allowed: 1, 2, 10" in msg


# ---- real ranks -------------------------------------------------------------------------------
SCHEDULES = ("pp:gpipe", "pp:1f1b", "pp:interleaved_1f1b")


def check_stage_state(rank: dict, shards: int = 1) -> None:
    """A rank holds its stages' parameters, gradients and AdamW moments, over `shards`."""
    stages = rank["execution"]["pipeline"]["local_stages"]
    share = sum(s["parameters"] for s in stages) * ADAMW_BYTES_PER_PARAMETER / shards
    assert state_bytes(rank["memory"]) == pytest.approx(share, rel=STATE_RTOL)
    assert state_bytes(rank["memory"]) == pytest.approx(
        rank["memory"]["predicted"]["state_bytes"], rel=STATE_RTOL
    )


def plain(tokens) -> tuple[str, ...]:
    """The same strategies trained with plain SGD (an entry's `/sgd0`)."""
    return tuple(f"{token}/sgd0" for token in tokens)


def check_losses(ranks, entries, what: str, world: int) -> dict:
    """Every entry's loss against the single-process program's (AdamW within RTOL, plain SGD
    within PLAIN_RTOL), all reported before any assert; returns the differences by entry."""
    rels = {}
    for entry in entries:
        losses = {r[entry]["loss"] for r in ranks}
        assert len(losses) == 1, (entry, losses)
        sighted = entry.endswith("/sgd0")
        rels[entry] = loss_check(
            f"llama3_debug {entry} {what}",
            losses.pop(),
            reference("llama3_debug", world, "sgd0" if sighted else "adamw"),
            PLAIN_RTOL if sighted else RTOL,
            "sighted" if sighted else "old",
            "sgd0" if sighted else "adamw",
        )
    for entry, rel in rels.items():
        if entry.endswith("/sgd0"):
            assert rel <= PLAIN_RTOL, (entry, rel)
            assert ranks[0][entry]["training"]["optimizer"]["momentum"] == 0.0
    return rels


def test_llama_pipelines_train_to_the_single_process_loss_under_each_schedule(tmp_path):
    """2 stages on 2 ranks (1 node), each schedule one after another in the same processes,
    under AdamW and then plain SGD."""
    entries = SCHEDULES + plain(SCHEDULES)
    ranks = run_ranks(tmp_path, ",".join(entries), 1, 2, 2, "llama3_debug", "adamw")
    rels = check_losses(ranks, entries, "1x2", 2)
    check_sight("llama3_debug", 2, 1, pipelined=True)
    whole = None
    for token in SCHEDULES:
        assert rels[token] <= RTOL
        facts = [r[token]["execution"]["pipeline"] for r in ranks]
        schedule = PIPELINE_SCHEDULES[token.split(":")[1]]
        assert facts[0]["torch_schedule"].endswith(schedule.torch_class)
        assert facts[0]["microbatches"] == 2 and facts[0]["stages"] == 2
        assert facts[0]["bubble_fraction"] == pytest.approx(schedule.bubble_fraction(2, 2))
        ids = sorted(i for f in facts for i in f["stage_ids"])
        assert ids == list(range(2 * schedule.stages_per_rank))
        held = sum(s["parameters"] for f in facts for s in f["local_stages"])
        assert whole in (None, held)  # every schedule's stages hold the model once
        whole = held
        for r in ranks:
            check_stage_state(r[token])
    assert whole == 360_768  # llama3_debug's parameters
    interleaved = ranks[0]["pp:interleaved_1f1b"]["execution"]["pipeline"]["local_stages"]
    assert [s["pieces"] for s in interleaved] == [["tok_embeddings"], ["layers.1"]]


COMBINED = ("pp+fsdp:1f1b:pp2", "pp+fsdp+tp:interleaved_1f1b:pp2")
# plain SGD: the same, and pp+tp (pp 2 x tp 2: the mesh pp+fsdp+tp has at 4 ranks, under 1f1b)
COMBINED_PLAIN = plain(COMBINED + ("pp+tp:1f1b:pp2",))


def test_llama_pipelines_combine_with_fsdp_and_tp_on_four_ranks(tmp_path):
    """1 node x 4 ranks: pp 2 x dp_shard 2 (pp+fsdp), pp 2 x tp 2 (pp+fsdp+tp: no rank left to
    shard over at 4; the 8-rank case is benchmarks/pipeline_combinations.py), under AdamW, and
    then with plain SGD in the same processes, pp+tp among them. Replicas of a pipeline
    (fully_shard over (dp_replicate, 1)) are the 2 x 2 pp case of test_torch_parallel_ranks."""
    entries = COMBINED + COMBINED_PLAIN
    ranks = run_ranks(tmp_path, ",".join(entries), 1, 4, 2, "llama3_debug", "adamw")
    rels = check_losses(ranks, entries, "1x4", 4)
    for entry in COMBINED_PLAIN:
        dp = data_parallel_degree(ranks[0][entry], 4)
        check_sight("llama3_debug", 4, dp, pipelined=True)
    assert ranks[0]["pp+tp:1f1b:pp2/sgd0"]["execution"]["dims"]["tp"] == 2
    for token in COMBINED:
        assert rels[token] <= RTOL
    fsdp = [r["pp+fsdp:1f1b:pp2"] for r in ranks]
    assert fsdp[0]["execution"]["dims"] == {
        "dp_replicate": 1,
        "dp_shard": 2,
        "tp": 1,
        "pp": 2,
        "world_size": 4,
    }
    assert "fully_shard (FSDP2) over dp_shard" in fsdp[0]["wrapper"]
    for r in fsdp:
        check_stage_state(r, shards=2)
    three_d = ranks[0]["pp+fsdp+tp:interleaved_1f1b:pp2"]
    # rank 0 holds stages 0 (the embedding) and 2 (block 1, split over tp: its stage's
    # layers.0)
    assert "layers.0.attention.wq" in three_d["execution"]["tensor_parallel"]
    assert three_d["execution"]["pipeline"]["bubble_fraction"] == pytest.approx(1 / 5)
    for r in ranks:
        rank = r["pp+fsdp+tp:interleaved_1f1b:pp2"]
        assert state_bytes(rank["memory"]) == rank["memory"]["predicted"]["state_bytes"]
