"""The one error a study's description raises: its files cannot be run as written. Every module
that checks input (config, matrix, data, references) raises it, so a user sees one kind of
message naming the key and the allowed values."""

from __future__ import annotations

# at most this many problems are listed (a 50 MB file of errors still gives a short message)
MAX_PROBLEMS = 25


class ConfigError(ValueError):
    """A configuration problem; the message lists every problem found."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        shown = problems[:MAX_PROBLEMS]
        lines = "\n".join(f"  - {p}" for p in shown)
        if len(problems) > len(shown):
            lines += f"\n  ... and {len(problems) - len(shown)} more problem(s)"
        super().__init__(f"invalid {source}:\n{lines}")
