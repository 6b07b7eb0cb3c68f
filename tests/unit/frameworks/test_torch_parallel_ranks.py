"""The parallelism axis on real ranks (gloo, separate processes): every strategy trains to the
single-process program's loss, and fsdp holds 1/world of ddp's parameter, gradient and
optimizer-state bytes. The axis itself (the record, the refusals, cells through the launcher):
test_torch_parallel.py.

The loss checks see the gradient's scale: AdamW with clipping (as the decoders train) divides a
constant factor on the gradients out, so a data-parallel average that is missed or applied
twice moves its loss by about 5e-5, under RTOL. Every strategy therefore also trains with plain
SGD (sgd0: no momentum, no clipping: the update is the learning rate times the gradient) in the
same rank processes, checked within PLAIN_RTOL; each such check asserts that the break it must
see (the single-process program with its gradients scaled as that break scales them,
helpers.parallel_ranks.FAULTS) moves the loss by at least SIGHT times its tolerance.
benchmarks/loss_breaks.py injects each break into the ranks and tabulates which checks fail."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.ranks import outputs as rank_outputs

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
# Relative loss difference from the single-process program after 3 steps, fp32: the target of
# the AdamW and momentum-SGD checks (the ranks agree with one process to about 1e-7: the order
# of the reductions)
RTOL = 1e-4
# ... and of the plain-SGD checks: 100x the reduction-order noise, and at most 1/SIGHT of the
# loss difference each break they must see causes (asserted beside each check, from the
# single-process program: a missed or doubled average moves gpt2_tiny's loss by 4e-3 or more,
# llama3_debug's by 7e-4 or more, transformer_small's by 0.4 or more; a pipeline's unscaled
# micro-batch llama3_debug's by 7e-4 or more)
PLAIN_RTOL = 1e-5
SIGHT = 10


# ---- real ranks -------------------------------------------------------------------------------
def run_ranks(
    tmp_path,
    parallelism: str,
    nodes: int,
    rpn: int,
    tp: int = 1,
    model="transformer_small",
    optimizer="sgd",
    precision="fp32",
) -> list[dict]:
    """Start nodes x rpn ranks of the production adapter (parallel_ranks.py), one process each;
    `parallelism`: one entry (STRATEGY[:OPTION...][@CHECKPOINTING][/OPTIMIZER]), or several
    comma-separated, run one after another in the same ranks (each rank's result is then one
    record per entry, by the entry as written)."""
    for attempt in (1, 2):
        try:
            return _start_ranks(tmp_path, parallelism, nodes, rpn, tp, model, optimizer, precision)
        except AssertionError as exc:
            # a port found free, then taken by another program before rank 0 bound it (another
            # test run's ranks on this machine): the same ranks again on new ports, once
            if attempt == 2 or "EADDRINUSE" not in str(exc):
                raise


def _start_ranks(tmp_path, parallelism, nodes, rpn, tp, model, optimizer, precision) -> list:
    from dlscale.run.launchers.ports import local_port

    world = nodes * rpn
    # production's chooser (below the ephemeral range), one port per entry, each drawn once:
    # a port drawn twice serves two entries of the same processes one after another, and the
    # second rendezvous can hang on the first's sockets
    ports: list[int] = []
    while len(ports) < len(parallelism.split(",")):
        port = local_port(world)
        ports += [] if port in ports else [port]
    name = parallelism.replace("/", "~")  # an entry's optimizer: not a folder
    outs = [tmp_path / f"{model}-{name}-{world}-{r}.json" for r in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPERS / "parallel_ranks.py"), str(r), str(world), str(rpn)]
            + [",".join(map(str, ports)), parallelism, str(tp), str(outs[r]), model]
            + [optimizer, precision],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = rank_outputs(procs, timeout=600)  # every rank stopped if one fails
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.loads(o.read_text()) for o in outs]


def state_bytes(memory: dict) -> int:
    return memory["param_bytes"] + memory["grad_bytes"] + memory["optimizer_state_bytes"]


@functools.cache
def reference(
    model: str,
    world: int,
    optimizer: str = "sgd",
    precision: str = "fp32",
    fault: str | None = None,
    degree: int | None = None,
) -> float:
    """The single-process loss (computed once per worker: no module-scoped fixture, so the
    test command's workers share these tests out instead of running them in one group); with
    `fault`, what the program trains to under that break of a data-parallel degree `degree`
    (default: the world) instead (helpers.parallel_ranks.FAULTS)."""
    from helpers.parallel_ranks import reference_loss

    return reference_loss(world, model, optimizer, precision, fault, degree)


def effect(model: str, world: int, optimizer: str, fault: str, **kwargs) -> float:
    """The relative loss difference break `fault` causes in the single-process program: what a
    check of this model, world and optimizer must be able to see."""
    right = reference(model, world, optimizer, kwargs.get("precision", "fp32"))
    return abs(reference(model, world, optimizer, fault=fault, **kwargs) - right) / right


def loss_check(
    what: str, loss: float, expected: float, tol: float, kind: str, optimizer: str
) -> float:
    """A loss check's relative difference, printed as one LOSS_CHECK line (the test, the
    check, its kind: "old" for a check as it stood before the plain-SGD ones, "sighted" for a
    check whose tolerance is at most 1/SIGHT of the breaks it must see, its optimizer, the
    difference and the tolerance) before any check's assert, so that
    benchmarks/loss_breaks.py sees every check of a test that fails."""
    rel = abs(loss - expected) / abs(expected)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    record = {
        "test": test,
        "check": what,
        "kind": kind,
        "optimizer": optimizer,
        "rel": rel,
        "tol": tol,
    }
    print(f"{what}: loss {loss:.8f}, ref {expected:.8f}, {rel:.2e} (tolerance {tol:.0e})")
    print("LOSS_CHECK " + json.dumps(record))
    return rel


def data_parallel_degree(rank: dict, world: int) -> int:
    """The ranks a gradient is averaged over (ddp: the world)."""
    dims = rank["execution"].get("dims")
    return dims["dp_replicate"] * dims["dp_shard"] if dims else world


def check_sight(model: str, world: int, dp: int, pipelined: bool = False) -> None:
    """The plain-SGD checks of this model and world see the breaks that apply to them: a
    missed and a doubled data-parallel average (dp > 1), an unscaled micro-batch (a pipeline),
    each moving the single-process loss by at least SIGHT x PLAIN_RTOL."""
    faults = (("no_average", "double_average") if dp > 1 else ()) + (
        ("skip_microbatch_scale",) if pipelined else ()
    )
    for fault in faults:
        seen = effect(model, world, "sgd0", fault, degree=dp)
        print(f"  sgd0 {model} world {world}: {fault} moves the loss by {seen:.2e}")
        assert SIGHT * PLAIN_RTOL <= seen, (fault, seen)


# predicted and measured state bytes per rank, and the shard fraction
STATE_RTOL = 0.02


# (model, parallelism, nodes, ranks per node, tp, optimizer, plain): the strategy trains to
# the single-process loss; where `plain`, the same processes train it again with plain SGD
STRATEGY_CASES = [
    ("transformer_small", "ddp", 2, 1, 1, "sgd", False),
    ("transformer_small", "fsdp", 2, 1, 1, "sgd", False),
    ("transformer_small", "hsdp", 2, 1, 1, "sgd", False),
    ("transformer_small", "tp", 1, 2, 2, "sgd", False),
    ("transformer_small", "fsdp+tp", 2, 2, 2, "sgd", False),
    ("transformer_small", "hsdp", 2, 2, 1, "sgd", False),
    # replicas of a tensor-parallel model: FSDP2's all-reduce over dp_replicate
    ("transformer_small", "tp", 2, 2, 2, "sgd", True),
    # the tiny decoder (GPT-2 class) as the decoders train: AdamW, its gradients clipped to
    # norm 1 over the shards, built on the meta device and materialised after fully_shard
    # under fsdp and hsdp; attention split by heads under tensor parallel
    ("gpt2_tiny", "ddp", 2, 1, 1, "adamw", True),
    ("gpt2_tiny", "fsdp", 2, 1, 1, "adamw", True),
    ("gpt2_tiny", "tp", 1, 2, 2, "adamw", True),
    ("gpt2_tiny", "fsdp+tp", 2, 2, 2, "adamw", True),
    ("gpt2_tiny", "hsdp", 2, 2, 1, "adamw", True),
    # pipeline (GPipe, 2 micro-batches): 2 stages over 2 nodes; 2 stages x 2 replicas
    ("transformer_small", "pp", 2, 1, 2, "sgd", False),
    ("transformer_small", "pp", 2, 2, 2, "sgd", True),
]


def entries_of(parallelism: str, plain: bool) -> list[str]:
    return [parallelism, f"{parallelism}/sgd0"] if plain else [parallelism]


@pytest.fixture(scope="module")
def shape_ranks(tmp_path_factory):
    """The ranks of one shape (model, nodes, ranks per node, optimizer): every strategy of
    STRATEGY_CASES of that shape (and its plain-SGD twin), one after another in one launch of
    the same processes, each entry on its own port with its own seeds and process groups (one
    interpreter start and torch import per rank for all of them, not one per strategy: the
    real-rank checks' CPU time is mostly those starts); started once per module and shape. Each
    rank's result: one record per entry, by the entry as written."""
    launched: dict[tuple, list[dict]] = {}

    def ranks(model: str, nodes: int, rpn: int, optimizer: str) -> list[dict]:
        shape = (model, nodes, rpn, optimizer)
        if shape not in launched:
            cases = [c for c in STRATEGY_CASES if (c[0], c[2], c[3], c[5]) == shape]
            entries = [e for c in cases for e in entries_of(c[1], c[6])]
            # one TP_DEGREE for all: a strategy that neither splits layers nor pipelines
            # takes 1 (helpers.parallel_ranks.degree_of)
            degree = max(c[4] for c in cases)
            folder = tmp_path_factory.mktemp("ranks")
            results = run_ranks(folder, ",".join(entries), nodes, rpn, degree, model, optimizer)
            launched[shape] = results if len(entries) > 1 else [{entries[0]: r} for r in results]
        return launched[shape]

    return ranks


@pytest.mark.parametrize("model, parallelism, nodes, rpn, tp, optimizer, plain", STRATEGY_CASES)
def test_every_strategy_trains_to_the_single_process_loss(
    shape_ranks, model, parallelism, nodes, rpn, tp, optimizer, plain
):
    """The strategy trains to the single-process loss within RTOL; where `plain`, the same
    processes train it again with plain SGD (`STRATEGY/sgd0`), within PLAIN_RTOL, a check that
    sees a wrong gradient average (and, pipelined, an unscaled micro-batch). The ranks run the
    other strategies of their shape too (shape_ranks)."""
    world = nodes * rpn
    sighted = f"{parallelism}/sgd0"
    results = shape_ranks(model, nodes, rpn, optimizer)
    ranks = [r[parallelism] for r in results]
    expected = reference(model, world, optimizer)
    losses = {r["loss"] for r in ranks}
    assert len(losses) == 1  # all-reduced: every rank the same
    loss = losses.pop()
    what = f"{model} {parallelism} {nodes}x{rpn} {optimizer}"
    rel = loss_check(what, loss, expected, RTOL, "old", optimizer)
    if plain:
        plain_losses = {r[sighted]["loss"] for r in results}
        assert len(plain_losses) == 1, plain_losses
        plain_rel = loss_check(
            f"{model} {sighted} {nodes}x{rpn}",
            plain_losses.pop(),
            reference(model, world, "sgd0"),
            PLAIN_RTOL,
            "sighted",
            "sgd0",
        )
    assert rel <= RTOL
    if plain:
        assert plain_rel <= PLAIN_RTOL
        first = results[0][sighted]
        assert first["training"]["optimizer"]["momentum"] == 0.0
        assert "clip" not in first["training"]["optimizer"]["implementation"]
        check_sight(model, world, data_parallel_degree(first, world), parallelism == "pp")
    for rank in ranks:  # what each rank holds, measured against predicted
        memory, predicted = rank["memory"], rank["memory"]["predicted"]
        measured = state_bytes(memory)
        print(
            f"  state bytes per rank: measured {measured}, predicted {predicted['state_bytes']}"
            + (
                f", shard fraction {predicted['full_state_bytes'] / predicted['shard_degree']:.0f}"
                if predicted["shard_degree"]
                else ""
            )
        )
        assert measured == pytest.approx(predicted["state_bytes"], rel=STATE_RTOL)
        assert memory["optimizer_state_dtype"] == "float32"
        per_param = {"sgd": 1, "adamw": 2}[optimizer]  # momentum; AdamW's two moments
        assert memory["optimizer_state_bytes"] == per_param * memory["param_bytes"]
        if parallelism in ("fsdp", "hsdp"):  # the exact shard fraction, padding counted
            fraction = predicted["full_state_bytes"] / predicted["shard_degree"]
            assert measured == pytest.approx(fraction, rel=STATE_RTOL)
            assert predicted["padding_bytes"] is not None
        if parallelism == "tp" and model == "gpt2_tiny":  # the complete plan: 1/t of the state
            assert measured == pytest.approx(predicted["full_state_bytes"] / tp, rel=STATE_RTOL)
    if parallelism in ("ddp", "fsdp", "hsdp"):
        assert ranks[0]["memory"]["predicted"]["activation_bytes"] > 0  # rank 0 estimates
        assert {r["memory"]["predicted"]["activation_bytes"] for r in ranks[1:]} == {None}
    facts = ranks[0]["execution"]
    assert facts["strategy"] == parallelism
    training = ranks[0]["training"]
    assert training["optimizer"]["name"] == optimizer
    assert ("init_weights()" in training["init"]) == (model == "gpt2_tiny")
    meta_after_shard = model == "gpt2_tiny" and parallelism in ("fsdp", "hsdp")
    assert ("after fully_shard" in training["init"]) == meta_after_shard
    if parallelism != "ddp":
        assert facts["dims"]["world_size"] == nodes * rpn
        assert ("tensor_parallel" in facts) == (tp > 1 and parallelism != "pp")
    if parallelism == "pp":
        assert facts["dims"]["pp"] == tp and facts["pipeline"]["stages"] == tp
        assert facts["pipeline"]["schedule"] == "gpipe"  # the helper's default
        # replicas of the pipeline: FSDP2's own reduction over (dp_replicate, 1), no hook
        replicas = facts["dims"]["dp_replicate"] > 1
        assert ("dp_shard = 1: replicas" in (facts["pipeline"]["data_parallel"] or "")) == replicas
    if parallelism in ("tp", "fsdp+tp"):  # the decoders' complete tensor-parallel plan
        complete = model == "gpt2_tiny"
        assert facts["tp_plan"] == ("complete" if complete else "blocks")
        assert facts["loss_parallel"] is complete
        assert ("head" in facts["tensor_parallel"]) is complete  # tied: the embedding's split
        assert ("token_embedding" in facts["tensor_parallel"]) is complete
    if parallelism == "tp" and nodes > 1:  # replicas: FSDP2 over (dp_replicate, dp_shard = 1)
        assert facts["fully_shard"] and "gradients all-reduced by FSDP2" in ranks[0]["wrapper"]
        assert facts["dims"]["dp_replicate"] == nodes and facts["dims"]["dp_shard"] == 1


LLAMA_STRATEGIES = ("ddp", "fsdp", "hsdp", "tp", "fsdp+tp")
# activation checkpointing, selective (the second block) and full (both), in the same processes
# (STRATEGY@MODE)
LLAMA_CHECKPOINTED = ("ddp@selective", "ddp@full", "fsdp+tp@full")
# plain SGD in the same processes: fully_shard's gradient average over 2 shards, and the
# complete tensor-parallel plan (replicated norm weights' partial gradients summed, the loss
# under loss_parallel)
LLAMA_PLAIN = ("fsdp/sgd0", "tp/sgd0")


def test_llama_trains_to_the_single_process_loss_under_each_strategy(tmp_path):
    """The Llama family's CPU shape (llama3_debug: RMSNorm, SwiGLU, RoPE, grouped-query
    attention, untied head) on 1 node x 2 ranks: ddp, fsdp, hsdp (its 2-D mesh, 1 replica of 2
    shards: the hybrid path across nodes is gpt2_tiny's 2 x 2 case above, the same code), tp
    (degree 2: the KV heads split too) and fsdp+tp, one after another in the same 2 processes
    (one interpreter start for all: about the cost of one strategy), each to the
    single-process loss on the same global batch within RTOL after 3 AdamW steps; then ddp and
    fsdp+tp with activation checkpointing, to the same loss, the bytes the last step's forward
    saves for backward (outside checkpointing's own hooks) the predicted activations of each
    mode within 1 %; then fsdp and tp with plain SGD (LLAMA_PLAIN) within PLAIN_RTOL."""
    entries = LLAMA_STRATEGIES + LLAMA_CHECKPOINTED + LLAMA_PLAIN
    ranks = run_ranks(
        tmp_path, ",".join(entries), 1, 2, tp=2, model="llama3_debug", optimizer="adamw"
    )
    expected = reference("llama3_debug", 2, "adamw")
    rels = {}  # every check's difference first: a failing assert leaves none unreported
    for entry in entries:
        losses = {r[entry]["loss"] for r in ranks}
        assert len(losses) == 1, (entry, losses)  # every rank the same
        plain = entry in LLAMA_PLAIN
        rels[entry] = loss_check(
            f"llama3_debug {entry} 1x2",
            losses.pop(),
            reference("llama3_debug", 2, "sgd0") if plain else expected,
            PLAIN_RTOL if plain else RTOL,
            "sighted" if plain else "old",
            "sgd0" if plain else "adamw",
        )
    for entry in LLAMA_PLAIN:
        assert rels[entry] <= PLAIN_RTOL, entry
        assert ranks[0][entry]["training"]["optimizer"]["momentum"] == 0.0
    check_sight("llama3_debug", 2, data_parallel_degree(ranks[0]["fsdp/sgd0"], 2))
    for entry in LLAMA_CHECKPOINTED:
        assert rels[entry] <= RTOL
        mode = entry.partition("@")[2]
        assert ranks[0][entry]["training"]["activation_checkpointing"] == mode
        done = ranks[0][entry]["execution"]["activation_checkpointing"]
        assert done["blocks"] == {"selective": ["layers.1"], "full": ["layers.0", "layers.1"]}[mode]
    saved = {}
    for entry in ("ddp", "ddp@selective", "ddp@full"):
        measured = ranks[0][entry]["saved_activation_bytes"]
        predicted = ranks[0][entry]["memory"]["predicted"]["activation"]
        print(
            f"  {entry}: saved for backward {measured} bytes, predicted {predicted['bytes']} "
            f"(without checkpointing {predicted['bytes_without_checkpointing']})"
        )
        assert predicted["checkpointing"] == (entry.partition("@")[2] or "none")
        assert measured == pytest.approx(predicted["bytes"], rel=0.01)
        saved[entry] = measured
    assert saved["ddp@full"] < saved["ddp@selective"] < saved["ddp"]
    for parallelism in LLAMA_STRATEGIES:
        assert rels[parallelism] <= RTOL
        facts = ranks[0][parallelism]["execution"]
        assert facts["strategy"] == parallelism
        if parallelism != "ddp":
            assert facts["dims"]["world_size"] == 2
        assert ("tensor_parallel" in facts) == ("tp" in parallelism)
    assert "layers.1.attention.wk" in ranks[0]["tp"]["execution"]["tensor_parallel"]
    # the complete plan (torchtitan's): embedding, sequence-parallel norms, the output head
    # under loss_parallel; each rank holds 1/t of ddp's state
    for parallelism in ("tp", "fsdp+tp"):
        facts = ranks[0][parallelism]["execution"]
        assert facts["tp_plan"] == "complete" and facts["loss_parallel"] is True
        for name in ("tok_embeddings", "layers.0.attention_norm", "norm", "output"):
            assert name in facts["tensor_parallel"], (parallelism, name)
    tp_share = state_bytes(ranks[0]["tp"]["memory"]) / state_bytes(ranks[0]["ddp"]["memory"])
    print(f"llama3_debug tp=2 / ddp state bytes per rank: {tp_share:.5f}")
    assert tp_share == pytest.approx(0.5, rel=STATE_RTOL)
    assert ranks[0]["fsdp"]["execution"]["fully_shard"] == ["layers.0", "layers.1"]
    assert ranks[0]["hsdp"]["execution"]["dims"]["dp_shard"] == 2
    assert "(FSDP2, hybrid) over (dp_replicate, dp_shard)" in ranks[0]["hsdp"]["wrapper"]
    # AdamW's state: each rank's measured bytes are the predicted ones, and fully_shard holds
    # half of ddp's (2 shards, FSDP's padding counted)
    for parallelism in LLAMA_STRATEGIES:
        memory = ranks[0][parallelism]["memory"]
        assert state_bytes(memory) == memory["predicted"]["state_bytes"], parallelism
    full = state_bytes(ranks[0]["ddp"]["memory"])
    for parallelism in ("fsdp", "hsdp"):
        share = state_bytes(ranks[0][parallelism]["memory"]) / full
        assert share == pytest.approx(0.5, rel=STATE_RTOL), (parallelism, share)


# bf16 under fully_shard, its loss read in float32 (helpers.parallel_ranks.float32_loss):
# against the float32 program, the bf16 forward and backward move gpt2_tiny's AdamW loss by
# about 1e-4 (the single-process bf16 program: 7e-5); against the single-process bf16 program
# (the same casts: helpers.parallel_ranks.reference_loss, precision bf16) the ranks differ by
# the bf16 rounding of per-rank rather than global gradients. Each tolerance is at most 1/SIGHT
# of what training without gradient sync (each shard's rows from its own rank's batch) moves
# the loss by, asserted in the test: 2.3e-2 under AdamW, 2e-3 under plain SGD.
BF16_RTOL = 1e-3  # against the float32 program
BF16_SAME_CASTS_RTOL = 1e-4  # against the single-process bf16 program
# before: the loss in bf16 (rounded to within 2^-8 = 4e-3 of itself: gpt2_tiny's 7.8037 reads
# 7.8125) within 2e-2 of the float32 program's
OLD_BF16_RTOL = 2e-2


def test_a_bf16_fsdp_cell_takes_its_precision_from_fsdps_policy(tmp_path):
    """bf16 under fully_shard: FSDP2's MixedPrecisionPolicy all-gathers the parameters in bf16
    for the forward, reduces the gradients in float32 into float32 shards, and no autocast
    runs; the loss (read in float32) stays within BF16_RTOL of the float32 program's and within
    BF16_SAME_CASTS_RTOL of the single-process bf16 program's, under AdamW and, in the same
    processes, plain SGD: tolerances that a run without gradient sync exceeds."""
    plain = "fsdp/sgd0"
    results = run_ranks(tmp_path, f"fsdp,{plain}", 2, 1, 1, "gpt2_tiny", "adamw", "bf16")
    ranks = [r["fsdp"] for r in results]
    expected = reference("gpt2_tiny", 2, "adamw")
    same_casts = reference("gpt2_tiny", 2, "adamw", "bf16")
    what = "gpt2_tiny fsdp 2x1 adamw bf16"
    rels = []  # every check's difference first: a failing assert leaves none unreported
    for r, rank in enumerate(ranks):
        loss_check(
            f"{what}, loss in bf16 (rank {r})",
            rank["loss_in_precision"],
            expected,
            OLD_BF16_RTOL,
            "old",
            "adamw",
        )
        rels.append(
            (
                loss_check(
                    f"{what} (rank {r})", rank["loss"], expected, BF16_RTOL, "sighted", "adamw"
                ),
                loss_check(
                    f"{what}, single-process bf16 (rank {r})",
                    rank["loss"],
                    same_casts,
                    BF16_SAME_CASTS_RTOL,
                    "sighted",
                    "adamw",
                ),
            )
        )
    plain_rels = [
        loss_check(
            f"gpt2_tiny {plain} 2x1 bf16, single-process bf16 (rank {r})",
            rank[plain]["loss"],
            reference("gpt2_tiny", 2, "sgd0", "bf16"),
            BF16_SAME_CASTS_RTOL,
            "sighted",
            "sgd0",
        )
        for r, rank in enumerate(results)
    ]
    for rank, (rel, same_casts_rel) in zip(ranks, rels):
        assert rank["forward_weight_dtype"] == "torch.bfloat16"
        assert rank["execution"]["mixed_precision"] == {
            "param_dtype": "bfloat16",
            "reduce_dtype": "float32",
        }
        assert rank["training"]["precision"] == (
            "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32), no autocast"
        )
        # the sharded state stays float32: the predicted bytes hold
        memory = rank["memory"]
        assert state_bytes(memory) == memory["predicted"]["state_bytes"]
        assert rel <= BF16_RTOL
        assert same_casts_rel <= BF16_SAME_CASTS_RTOL
    for rel, rank in zip(plain_rels, results):
        assert rel <= BF16_SAME_CASTS_RTOL
        assert rank[plain]["forward_weight_dtype"] == "torch.bfloat16"
    # what training without gradient sync moves the loss by: each tolerance sees it
    for optimizer, tol in (
        ("adamw", BF16_RTOL),
        ("adamw", BF16_SAME_CASTS_RTOL),
        ("sgd0", BF16_SAME_CASTS_RTOL),
    ):
        seen = effect("gpt2_tiny", 2, optimizer, "no_sync", precision="bf16")
        print(f"  {optimizer} bf16: no gradient sync moves the loss by {seen:.2e}")
        assert SIGHT * tol <= seen, (optimizer, tol, seen)


def test_fsdp_holds_a_world_size_share_of_ddps_state(shape_ranks):
    ranks = shape_ranks("transformer_small", 2, 1, "sgd")  # ddp and fsdp among them
    ddp, fsdp = [r["ddp"] for r in ranks], [r["fsdp"] for r in ranks]
    full = state_bytes(ddp[0]["memory"])
    for rank in fsdp:
        ratio = state_bytes(rank["memory"]) / full
        print(f"fsdp/ddp state bytes per rank, world 2: {ratio:.4f}")
        assert ratio <= 1 / 2 * 1.10
        assert rank["memory"]["peak_rss_mb"] > 0 and rank["memory"]["peak_allocated_mb"] is None
    assert {state_bytes(r["memory"]) for r in ddp} == {full}
