"""The commands the workflow's messages suggest, complete as printed.

A message that tells the user to add a setting (`remeasure=True`, `launcher=srun`,
`max_cells=...`, `restart=cancel`) prints the whole command that does it: the user's own
command line with that setting inside its one `--config`. Snakemake keeps only the last
`--config` (and the last `--configfile`) of a command line, and a `--config` replaces the
profile's `config:` list, so "add `--config remeasure=True`" to a command that already has
`--config study_file=my-study.yaml` would re-plan the default study instead of the user's.

The command line is the driver's own (`sys.argv`), read back with Snakemake's own parser
(`snakemake.cli.parse_args`, the profile applied as Snakemake applies it), so the executor a
dry run would use (`executor:` of `--profile profiles/slurm`) is known at parse time too.
Outside the `snakemake` command (the API, a test calling the workflow in process) there is no
command line to repeat: `Invocation.current()` is None and the messages say what to add.
"""

from __future__ import annotations

import contextlib
import functools
import io
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from dlscale.registry import launchers

CONFIG_OPTIONS = ("--config", "-C")
CONFIGFILE_OPTIONS = ("--configfile", "--configfiles")
ONE_RUN_FLAGS = ("-n", "--dry-run", "--dryrun", "-F", "--forceall", "-f", "--force")
FORCERUN_OPTIONS = ("--forcerun", "-R")
PROFILE_OPTIONS = ("--profile",)
EXECUTOR_OPTIONS = ("--executor", "-e")


def _is_snakemake(argv0: str) -> bool:
    path = Path(argv0)
    return path.name == "snakemake" or (
        path.name == "__main__.py" and path.parent.name == "snakemake"
    )


def _option_groups(tokens: list[str], options: tuple[str, ...]) -> list[tuple[int, int]]:
    """(start, end) of each occurrence of one of `options` with the values that follow it
    (`--config a=b c=d`, `--config=a=b`, `-Ca=b`), as argparse reads an nargs option: the
    values run to the next token that starts with '-'."""
    groups, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        joined = any(
            token.startswith(o + "=") or (len(o) == 2 and token.startswith(o) and token != o)
            for o in options
        )
        if token in options or joined:
            end = i + 1
            if not joined:
                while end < len(tokens) and not tokens[end].startswith("-"):
                    end += 1
            groups.append((i, end))
            i = end
        else:
            i += 1
    return groups


@dataclass(frozen=True)
class Invocation:
    """The driver's command line: its tokens (after `snakemake`), the `--config` entries
    Snakemake used (the profile's `config:` list when the command gives none) and the executor
    it names (the profile's `executor:`, else Snakemake's default, `local`)."""

    tokens: tuple[str, ...]
    config: tuple[str, ...]
    executor: str
    dry_run: bool = False  # -n, --dry-run

    @classmethod
    def current(cls) -> Invocation | None:
        """This process's command line, if it is the `snakemake` command's and reads back here
        (a profile named relative to another folder than the workflow's, with --directory, may
        not: then None, and the messages say what to add instead of printing a command). Read
        back once per command line (the parse and the resume's signal handling ask again)."""
        return _read_back(tuple(sys.argv))

    @classmethod
    def parse(cls, tokens: list[str]) -> Invocation:
        from snakemake.cli import parse_args

        # Snakemake's parser announces the profile it applies; the run has said so already
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            _, args = parse_args(list(tokens))
        # no executor named: Snakemake's own default, the local one
        return cls(
            tuple(tokens), tuple(args.config or ()), args.executor or "local", bool(args.dryrun)
        )

    def repeated_options(self) -> str | None:
        """A `--config` or `--configfile` given more than once: Snakemake used only the last,
        so the earlier ones were dropped without a word. The message and the command that gives
        them together."""
        for options, what in ((CONFIG_OPTIONS, "--config"), (CONFIGFILE_OPTIONS, "--configfile")):
            groups = _option_groups(list(self.tokens), options)
            if len(groups) < 2:
                continue
            dropped = [t for s, e in groups[:-1] for t in self.tokens[s:e]]
            return (
                f"{what} was given {len(groups)} times; Snakemake keeps only the last one, so "
                f"{shlex.join(dropped)} would be ignored (another study or other settings than "
                f"you asked for). Give them in one {what}:\n  {self.merged(options)}"
            )
        return None

    def merged(self, options: tuple[str, ...]) -> str:
        """This command with every occurrence of `options` given as one."""
        groups = _option_groups(list(self.tokens), options)
        values = []
        for start, end in groups:
            first = self.tokens[start]
            for o in options:
                if first.startswith(o + "="):
                    values.append(first[len(o) + 1 :])
                elif len(o) == 2 and first.startswith(o) and first != o:
                    values.append(first[len(o) :])
            values.extend(self.tokens[start + 1 : end])
        rest = self._without(groups)
        return _command([*rest, options[0], *values])

    def with_config(self, **changes) -> str:
        """This command with `changes` (key=value) set inside its one `--config`, every other
        `--config` entry kept as Snakemake read it (the profile's, when the command gave none)."""
        entries = [e for e in self.config if e.partition("=")[0] not in changes]
        entries += [f"{key}={value}" for key, value in changes.items()]
        rest = self._without(_option_groups(list(self.tokens), CONFIG_OPTIONS))
        return _command([*rest, "--config", *entries])

    def with_launcher(self, launcher: str, **changes) -> str:
        """This command run with `launcher`: the shipped profile whose executor runs it (its
        record's `profile`, dlscale.registry.launchers: profiles/slurm for srun; a study is
        measured, re-measured and redrawn with the launcher it was measured with) in place of
        its own profile and executor, and launcher=<launcher> (and `changes`) in its one
        `--config` (a `--config` replaces the profile's `config:` list), every other entry
        kept."""
        drop = _option_groups(list(self.tokens), PROFILE_OPTIONS + EXECUTOR_OPTIONS)
        at = drop[0][0] if drop else 0  # where the command named its profile, else first
        profile = ["--profile", launchers.launcher(launcher).profile]
        tokens = self._without(drop + [(at, len(self.tokens))])
        tokens += profile + self._without(drop + [(0, at)])
        return Invocation(tuple(tokens), self.config, self.executor).with_config(
            launcher=launcher, **changes
        )

    def with_target(self, target: str) -> str:
        """This command building `target`: the target first (a value after `--config` would be
        read as one of its entries), without what belonged to this run only (a dry run's flag,
        the jobs it forced to rerun)."""
        rest = self._without(_option_groups(list(self.tokens), FORCERUN_OPTIONS))
        return _command([target, *(t for t in rest if t not in ONE_RUN_FLAGS)])

    def _without(self, groups: list[tuple[int, int]]) -> list[str]:
        drop = {i for start, end in groups for i in range(start, end)}
        return [t for i, t in enumerate(self.tokens) if i not in drop]


@functools.cache
def _read_back(argv: tuple[str, ...]) -> Invocation | None:
    if not argv or not _is_snakemake(argv[0]):
        return None
    try:
        return Invocation.parse(list(argv[1:]))
    except (SystemExit, Exception):  # argparse exits on what it cannot read
        return None


def _command(tokens: list[str]) -> str:
    return shlex.join(["snakemake", *tokens])


def with_config(invocation: Invocation | None, **changes) -> str:
    """The command that repeats this run with `changes` in its `--config`, or, without a command
    line to repeat, what to add to it."""
    if invocation is not None:
        return invocation.with_config(**changes)
    entries = " ".join(f"{key}={value}" for key, value in changes.items())
    return (
        f"your command with {entries} added to its one --config (beside its other --config "
        "entries: Snakemake keeps only the last --config of a command line)"
    )


def with_launcher(invocation: Invocation | None, launcher: str, **changes) -> str:
    """The command that repeats this run with the profile and launcher `launcher` needs (and
    `changes` in its `--config`)."""
    if invocation is not None:
        return invocation.with_launcher(launcher, **changes)
    entries = " ".join(f"{key}={value}" for key, value in {"launcher": launcher, **changes}.items())
    return (
        f"your command with --profile {launchers.launcher(launcher).profile} and {entries} in "
        "its one --config (beside its other --config entries)"
    )


def with_target(invocation: Invocation | None, target: str) -> str:
    """The command that builds `target` with this run's profile and configuration."""
    if invocation is not None:
        return invocation.with_target(target)
    return f"snakemake {shlex.quote(target)} with this run's --profile and --config"
