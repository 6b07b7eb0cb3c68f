"""A target typed after Snakemake's `--config`: refused in one line with the command that works.

Snakemake's `--config` takes every word up to the next option, so in `snakemake --profile
profiles/local --config study_file=my-study.yaml check` the target `check` is read as a config
entry, and Snakemake's reader of the entries (`snakemake.cli.parse_config`, through
`snakemake.common.parse_key_value_arg`) raises a ValueError that the command prints as a
traceback, before the workflow is read. Snakemake takes a target anywhere else: before
`--config` (`snakemake check --profile ... --config ...`), between other options, or after `--`.

`refuse_targets_after_config` wraps `snakemake.common.parse_key_value_arg`: for a `--config`
entry without `=` (the reader's own error message says which option it reads) it raises
Snakemake's one-line `Error: ...` with the same command, the words moved before `--config`;
every other call is Snakemake's own. The dlscale executor plugin installs it: Snakemake imports
every installed executor plugin while it imports its command line (`snakemake.cli`), before
`snakemake.cli` takes that function from `snakemake.common` and before any entry is read, for
every profile, so `snakemake.cli.parse_config` itself is not yet defined then.
"""

from __future__ import annotations

import sys

from dlscale.workflow.advice import CONFIG_OPTIONS, _command, _is_snakemake, _option_groups


def working_order(tokens: list[str]) -> tuple[list[str], list[str]]:
    """The words inside `tokens`' `--config` options that are not KEY=VALUE, and `tokens` (a
    command line after `snakemake`) with those words moved first, as targets; a `--config` left
    without entries is dropped (it would replace the profile's `config:` list with nothing)."""
    moved, drop = [], set()
    for start, end in _option_groups(tokens, CONFIG_OPTIONS):
        words = [i for i in range(start + 1, end) if "=" not in tokens[i]]
        moved += [tokens[i] for i in words]
        drop |= set(words)
        if words and len(words) == end - start - 1:  # `--config` held only these words
            drop.add(start)
    return moved, moved + [t for i, t in enumerate(tokens) if i not in drop]


def refusal(words: list[str], argv: list[str]) -> str:
    """The one line that refuses `words` (config entries without `=`), with the command that
    works when `argv` is the snakemake command's (then every such word of it is named)."""
    moved, order = working_order(argv[1:]) if argv and _is_snakemake(argv[0]) else ([], [])
    named = ", ".join(f"`{w}`" for w in moved or words)
    is_not = "is not a KEY=VALUE setting" if len(moved or words) == 1 else "are not KEY=VALUE"
    what = (
        f"{named} after --config {is_not}: Snakemake reads every word after --config up to the "
        "next option as a setting, so a target there is not run"
    )
    if not moved:
        return f"{what}; name targets before --config (or after `--`). Nothing was run."
    return f"{what}; name targets before --config: {_command(order)} (nothing was run)"


# How Snakemake's reader of `--config` entries (snakemake.cli.parse_config) starts its error
CONFIG_ERROR = "Invalid config definition"


def refuse_targets_after_config() -> None:
    """Wrap `snakemake.common.parse_key_value_arg` (once): a `--config` entry without `=` is
    refused with `refusal`, as a CliException, which Snakemake prints as one `Error: ...` line
    (exit 1), and a ValueError, for callers that catch the reader's own error. Without that
    function (another Snakemake), nothing changes."""
    try:
        import snakemake.common as common
        from snakemake.exceptions import CliException
    except ImportError:
        return
    original = getattr(common, "parse_key_value_arg", None)
    if original is None or getattr(original, "_dlscale_wrapped", False):
        return

    class TargetAfterConfig(CliException, ValueError):
        pass

    def parse_key_value_arg(arg, errmsg, *args, **kwargs):
        if "=" not in str(arg) and str(errmsg).startswith(CONFIG_ERROR):
            raise TargetAfterConfig(refusal([str(arg)], sys.argv))
        return original(arg, errmsg, *args, **kwargs)

    parse_key_value_arg._dlscale_wrapped = True
    parse_key_value_arg.__wrapped__ = original
    parse_key_value_arg.__doc__ = original.__doc__
    common.parse_key_value_arg = parse_key_value_arg
