"""The convergence workload's loop: train on a real dataset until a target validation accuracy
or an epoch cap, one epoch record per epoch (framework-neutral; an adapter that declares
`convergence_method` supplies its loaders, step and evaluation: dlscale.frameworks.base).

The clock of time-to-accuracy (dlscale.study.protocol.TIME_TO_ACCURACY_METHOD) holds only training:
every epoch starts at a barrier over all ranks and ends at each rank's device synchronisation
after its last optimizer step; the epoch's time is the slowest rank's (all-reduced maximum).
Outside it (TIME_TO_ACCURACY_EXCLUDES): start-up, initialisation, model build, opening the
dataset, one warm-up forward and backward pass without update (compilation, tracing,
allocation; weights, momentum and normalisation statistics unchanged), the idle probe, and the
validation after each epoch, and the loader-only measurement after the last epoch
(loader_only: the rank's training loader without the model, dlscale.data.loader_bench, to flag
an input-bound cell). Validation covers the whole validation split, disjoint from the
training split: each rank evaluates its own shard and the correct counts are summed over all
ranks, so every rank sees the same accuracy and stops at the same epoch.

The learning rate of every optimizer step comes from dlscale.study.lr (the cell's rule, base rate,
reference batch and warm-up).
"""

from __future__ import annotations

import statistics
import time

from dlscale.rank.provenance import host_activity
from dlscale.study.cell import Cell
from dlscale.study.lr import Schedule
from dlscale.study.protocol import (
    COMPETING_BUSY_CPUS,
    EPOCH,
    IDLE_PROBE,
    IDLE_PROBE_SECONDS,
    INPUT_BOUND_MARGIN,
    LOADER_BATCHES,
    LOADER_MAX_SECONDS,
    LOADER_METHOD,
    LOADER_WARMUP_BATCHES,
)


def idle_probe(adapter) -> dict:
    """What else keeps the host busy before the first epoch (as run_timed's probe)."""
    adapter.barrier()
    probe = host_activity(IDLE_PROBE_SECONDS)
    probe["competing"] = (probe["busy_cpus"] or 0.0) > COMPETING_BUSY_CPUS
    adapter.barrier()
    return probe


def loader_only(train, train_samples_per_s: float, barrier) -> dict:
    """The rank's training loader alone, without the model (LOADER_METHOD), against its
    training throughput (samples/s over its epochs, loading included): their ratio and whether
    it is below INPUT_BOUND_MARGIN (input-bound). All ranks start together (`barrier`), as in
    training, so they compete for the node's cores and disk as they did."""
    from dlscale.data.loader_bench import input_bound, measure_loader

    barrier()
    out = measure_loader(
        train,
        warmup_batches=LOADER_WARMUP_BATCHES,
        batches=LOADER_BATCHES,
        max_seconds=LOADER_MAX_SECONDS,
    )
    out["train_samples_per_s"] = train_samples_per_s
    out["ratio"] = out["samples_per_s"] / train_samples_per_s
    out["input_bound"] = input_bound(out["samples_per_s"], train_samples_per_s)
    out["margin"] = INPUT_BOUND_MARGIN
    out["method"] = LOADER_METHOD
    return out


def lr_schedule(adapter, cell: Cell, info, steps_per_epoch: int) -> Schedule:
    """The learning rate of every optimizer step (dlscale.study.lr) for `steps_per_epoch` steps
    per epoch; a training split that gives this rank no batch is refused."""
    if steps_per_epoch < 1:
        raise ValueError(
            f"the training split ({info.train_samples} samples) gives rank "
            f"{adapter.ctx.rank} no batch of {cell.per_rank_batch}"
        )
    return Schedule(
        rule=cell.lr_rule,
        base=cell.learning_rate,
        reference_batch=cell.reference_batch,
        global_batch=cell.global_batch,
        warmup_epochs=cell.warmup_epochs,
        steps_per_epoch=steps_per_epoch,
    )


def train_epoch(adapter, train, schedule: Schedule, step: int, before_step=None) -> tuple:
    """One pass over the rank's training batches, starting at optimizer step `step` (no device
    synchronisation: the caller's epoch clock ends with one). Returns (summed loss as a device
    value, the rank's samples, the epoch's first and last learning rate, its steps)."""
    loss_sum, rank_samples, first_lr, lr, steps = None, 0, None, None, 0
    for batch in train:
        if before_step:
            before_step(step)
        lr = schedule.at(step)
        first_lr = lr if first_lr is None else first_lr
        loss, n = adapter.train_batch(batch, lr)
        loss_sum = loss if loss_sum is None else loss_sum + loss
        rank_samples += n
        step += 1
        steps += 1
    return loss_sum, rank_samples, first_lr, lr, steps


def run_convergence(adapter, cell: Cell, info, write, before_step=None) -> dict:
    """Train `cell` on the dataset `info` (dlscale.data.DatasetInfo) to its target accuracy or
    its epoch cap. `write(event, value)` records the idle probe and each epoch as it ends (a
    crash keeps what ran); `before_step(i)`, if given, runs before every optimizer step (fault
    injection). Returns the rank's summary for its rank_end record."""
    train, sampler, val = adapter.data_loaders(info, workers=cell.loader_workers, seed=0)
    schedule = lr_schedule(adapter, cell, info, len(train))
    sampler.set_epoch(0)
    started = time.perf_counter()
    adapter.warmup_pass(next(iter(train)))
    adapter.sync()
    warmup_pass_seconds = time.perf_counter() - started
    write(IDLE_PROBE, idle_probe(adapter))
    step, training, seen, own_seconds = 0, 0.0, 0, []
    rank_samples_total, clock_start_time, epoch_steps = 0, None, []
    for epoch in range(1, cell.max_epochs + 1):
        sampler.set_epoch(epoch)
        adapter.barrier()
        if clock_start_time is None:
            clock_start_time = time.time()
        t0 = time.perf_counter()
        loss_sum, rank_samples, first_lr, lr, steps = train_epoch(
            adapter, train, schedule, step, before_step
        )
        step += steps
        adapter.sync()
        rank_seconds = time.perf_counter() - t0
        v0 = time.perf_counter()
        correct, count = adapter.evaluate(val)
        rank_val_seconds = time.perf_counter() - v0
        loss_total, samples, correct, count = adapter.allreduce_sum(
            [adapter.to_host(loss_sum), rank_samples, correct, count]
        )
        epoch_seconds, val_seconds = adapter.allreduce_max([rank_seconds, rank_val_seconds])
        samples, correct, count = int(round(samples)), int(round(correct)), int(round(count))
        training += epoch_seconds
        seen += samples
        own_seconds.append(rank_seconds)
        epoch_steps.append(steps)
        rank_samples_total += rank_samples
        accuracy = correct / count
        write(
            EPOCH,
            {
                "epoch": epoch,
                "train_loss": loss_total / samples,
                "val_accuracy": accuracy,
                "val_correct": correct,
                "val_samples": count,
                "epoch_seconds": epoch_seconds,
                "training_seconds": training,
                "samples": samples,
                "samples_seen": seen,
                "steps": steps,
                "learning_rate": lr,
                "learning_rate_first": first_lr,
                "validation_seconds": val_seconds,
                "rank_epoch_seconds": rank_seconds,
                "rank_samples": rank_samples,
            },
        )
        if accuracy >= cell.target_accuracy:
            break
    total = sum(own_seconds)
    loader = loader_only(train, rank_samples_total / total, adapter.barrier)
    return {
        "steps": step,
        "seconds_total": total,
        "step_seconds_sum": total,
        "throughput_samples_per_s": rank_samples_total / total,
        # the convergence loop synchronises the device once per epoch, not per step: a step's
        # time is the epoch's mean, and this the median over epochs
        "step_seconds_median": statistics.median(s / n for s, n in zip(own_seconds, epoch_steps)),
        "warmup_pass_seconds": warmup_pass_seconds,
        "clock_start_time": clock_start_time,
        "learning_rate_schedule": schedule.describe(),
        "loader_only": loader,
    }
