"""The metrics format: assembled records validate; anything incomplete or foreign is refused."""

from __future__ import annotations

import json

import pytest

from dlscale.store import metrics
from dlscale.store.metrics import MetricsError

from helpers.synthetic_metrics import assembled, rank_records


def test_assembled_file_validates_and_sums_ranks(tmp_path):
    records = assembled()
    path = tmp_path / "m.jsonl"
    metrics.write_atomic(path, records)
    back = metrics.read_metrics(path)
    summary = back[-1]["value"]
    # rank 0: 8*3/0.3 = 80/s, rank 1: 8*3/0.6 = 40/s -> 120/s, not 2 x rank 0 (160/s)
    assert summary["throughput_samples_per_s"] == pytest.approx(120.0)
    assert summary["rank_throughput_min"] == pytest.approx(40.0)
    assert summary["nodes_seen"] == ["n1", "n2"]
    assert summary["competing"] is True and summary["host_busy_cpus_max"] == pytest.approx(0.9)
    # breakdown: compute = half of each step; median step 0.15 s, median compute 0.075 s
    assert summary["comm_fraction"] == pytest.approx(0.5)
    # allreduce: the slowest rank's median (0.0015 s) over 1000 bytes; n=2 -> busbw == algbw
    (probe,) = summary["allreduce"]
    assert probe["algbw_bytes_per_s"] == pytest.approx(1000 / 0.0015)
    assert probe["busbw_bytes_per_s"] == pytest.approx(probe["algbw_bytes_per_s"])
    assert summary["joules_per_sample"] is None and summary["energy_unavailable"] == "test"
    assert back[0]["value"]["provenance"]["hosts"] == ["n1", "n2"]
    assert [r["event"] for r in back].count("step") == 6
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind


def test_every_line_has_the_fixed_keys(tmp_path):
    for rec in assembled():
        assert set(rec) == {"format", "version", "time", "event", "rank", "value"}
        assert rec["format"] == "dlscale.metrics" and rec["version"] == 1


def write_lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda rs: rs[:-1], "must start with run_start and end with summary"),  # truncated
        (lambda rs: [], "empty"),
        (lambda rs: [{**rs[0], "version": 2}] + rs[1:], "format version 2"),
        (
            lambda rs: [r for r in rs if not (r["event"] == "rank_end" and r["rank"] == 1)],
            "expected 0..1",
        ),
        (
            lambda rs: [{**rs[0], "value": {**rs[0]["value"], "cell": {"nodes": 2}}}] + rs[1:],
            "required",
        ),
        (
            lambda rs: (
                rs[:3] + [{**rs[3], "value": {"step": 0, "seconds": -1.0, "samples": 8}}] + rs[4:]
            ),
            "seconds",
        ),
    ],
)
def test_invalid_files_are_refused(tmp_path, mutate, message):
    path = tmp_path / "m.jsonl"
    write_lines(path, mutate(assembled()))
    with pytest.raises(MetricsError, match=message):
        metrics.read_metrics(path)


def test_corrupt_json_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(assembled()[0]) + "\n{not json\n")
    with pytest.raises(MetricsError, match="line 2: not JSON"):
        metrics.read_metrics(path)


def test_write_atomic_refuses_invalid_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "m.jsonl"
    metrics.write_atomic(path, assembled())
    before = path.read_bytes()
    with pytest.raises(MetricsError):
        metrics.write_atomic(path, assembled()[:-1])
    assert path.read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_missing_rank_file(tmp_path):
    (tmp_path / "rank0.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rank_records(0, [0.1], "n1"))
    )
    with pytest.raises(MetricsError, match="rank 1 wrote no metrics"):
        metrics.read_rank_files(tmp_path, 2)


# --- the fast read path: it may only ever accept what the schema accepts ---------------------


def _reference_valid(rec) -> bool:
    return not list(metrics._validator().iter_errors(rec))


BAD_VALUES = [
    None,
    True,
    False,
    -1,
    0,
    0.0,
    1.5,
    -0.5,
    "1",
    "",
    [],
    {},
    1e-400,
    float("inf"),
    2**70,
]


def _mutations(rec: dict):
    """Records that differ from `rec` in one place: every key's value replaced, removed, a key
    added, at the top level and one level down."""
    for key in rec:
        for bad in BAD_VALUES:
            yield {**rec, key: bad}
        yield {k: v for k, v in rec.items() if k != key}
    yield {**rec, "extra": 1}
    for event in metrics.RANKED:
        yield {**rec, "event": event}
    value = rec["value"]
    for key in value:
        for bad in BAD_VALUES:
            yield {**rec, "value": {**value, key: bad}}
        yield {**rec, "value": {k: v for k, v in value.items() if k != key}}
    yield {**rec, "value": {**value, "extra": 1}}


def test_fast_path_accepts_real_records_and_nothing_the_schema_rejects():
    records = assembled()
    assert all(metrics._fast_valid(rec) for rec in records)  # the fast path is taken
    tried = accepted = 0
    for rec in records:
        for mutated in _mutations(rec):
            tried += 1
            if metrics._fast_valid(mutated):
                accepted += 1
                assert _reference_valid(mutated), mutated
            else:  # rejected by the fast path: the reference validator decides
                assert (metrics._record_error(mutated) is None) == _reference_valid(mutated)
    assert tried > 1000 and 0 < accepted < tried


NUMBER_TOKENS = [
    "0",
    "1",
    "8",
    "-1",
    "0.0",
    "0.5",
    "1.5",
    "1e-05",
    "1e-400",
    "0.00000",
    "1e+16",
    "true",
    "null",
    '"1"',
    "01",
    "-0.0",
    "2.5e-7",
    "1E-2",
    "0e5",
    "1e999",
    "[]",
    "0.0001",
    "0.00001",
    "00.1",
]


def test_canonical_step_line_pattern_admits_only_valid_steps():
    steps = [rec for rec in assembled() if rec["event"] == "step"]
    assert all(metrics.STEP_LINE.fullmatch(json.dumps(r, sort_keys=True)) for r in steps)
    template = (
        '{"event": "step", "format": "dlscale.metrics", "rank": %s, "time": %s, '
        '"value": {"samples": %s, "seconds": %s, "step": %s}, "version": 1}'
    )
    tried = matched = 0
    for slot in range(5):
        for token in NUMBER_TOKENS:
            fields = ["0", "1763700000.5", "8", "0.01", "3"]
            fields[slot] = token
            line = template % tuple(fields)
            tried += 1
            if metrics.STEP_LINE.fullmatch(line):
                matched += 1
                assert _reference_valid(json.loads(line)), line
    # and text-level damage: truncation, a different key order, spaces
    line = json.dumps(steps[0], sort_keys=True)
    for damaged in (
        line[:-1],
        line[1:],
        json.dumps(steps[0]),
        line.replace(": ", ":"),
        line.replace('"step"', '"stop"', 1),
    ):
        assert not metrics.STEP_LINE.fullmatch(damaged)
    assert 0 < matched < tried


def test_reading_without_steps_returns_the_same_other_records(tmp_path):
    records = assembled()
    path = tmp_path / "m.jsonl"
    metrics.write_atomic(path, records)
    full = metrics.read_metrics(path)
    assert [r for r in full if r["event"] != "step"] == metrics.read_metrics(path, steps=False)
    # a damaged step line is still found and named by its line number
    lines = path.read_text().splitlines()
    i = next(n for n, ln in enumerate(lines) if '"event": "step"' in ln)
    lines[i] = lines[i].replace('"seconds": ', '"seconds": -', 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MetricsError, match=rf"line {i + 1}: value/seconds"):
        metrics.read_metrics(path, steps=False)
