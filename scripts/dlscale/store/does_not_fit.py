"""A cell whose ranks run out of memory is a result: "does not fit at this size", not a failure.

A rank whose setup or steps raise its framework's out-of-memory error (Adapter.out_of_memory:
torch.OutOfMemoryError, the CPU allocator's "can't allocate memory", Python's MemoryError)
writes DOES_NOT_FIT_FILE in its rank folder (what it tried, the error, the memory it held: its
Adapter.memory_per_rank) and exits with DOES_NOT_FIT_EXIT; the launcher then records the cell
with status DOES_NOT_FIT in its failure record (dlscale.run.launch.record_failure), the status table
and the report show it as such (dlscale.analysis.cell_status), and its ranks' records say how far
it got.
Pure Python."""

from __future__ import annotations

import json
from pathlib import Path

DOES_NOT_FIT = "does_not_fit"  # the cell's status (status.csv, the report)
DOES_NOT_FIT_EXIT = 75  # a rank's exit code when it ran out of memory
DOES_NOT_FIT_FILE = "does_not_fit.rank{rank}.json"  # in the rank folder


def record_rank(rank_dir: str | Path, rank: int, error: BaseException, memory: dict | None) -> dict:
    """Write what a rank that ran out of memory knows."""
    record = {
        "rank": rank,
        "error": f"{type(error).__name__}: {error}"[:2000],
        "memory": memory,
    }
    path = Path(rank_dir) / DOES_NOT_FIT_FILE.format(rank=rank)
    path.write_text(json.dumps(record, sort_keys=True))
    return record


def rank_records(rank_dir: str | Path) -> list[dict]:
    """The records of a cell's ranks that ran out of memory, by rank (empty: none did)."""
    out = []
    for path in sorted(Path(rank_dir).glob(DOES_NOT_FIT_FILE.format(rank="*"))):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(out, key=lambda r: r.get("rank", 0))


def reason(records: list[dict]) -> str:
    """The status table's reason for a cell that does not fit."""
    first = records[0]
    return f"does not fit: rank {first['rank']} ran out of memory ({first['error'][:200]})" + (
        f"; {len(records)} ranks in all" if len(records) > 1 else ""
    )
