"""A script's throughput pattern (config `script.scripts.<label>.throughput.pattern`), checked
when the study is read (dlscale.study.script_workload): a Python regular expression with either
a rate group or a step's count and seconds, short, and with nothing that backtracks
exponentially (a nested quantifier, a back reference). Matching is bounded besides, where the
launcher reads the script's output (dlscale.run.script_cell)."""

from __future__ import annotations

import re

# A pattern's named groups: `value` (a rate in the unit per second) or `count` and `seconds`
# (one step's units and its seconds).
RATE_GROUPS, STEP_GROUPS = ("value",), ("count", "seconds")
MAX_PATTERN_CHARS = 512


def _parser():
    try:  # Python 3.11+
        from re import _constants as constants
        from re import _parser as parser
    except ImportError:  # pragma: no cover (3.10)
        import sre_constants as constants
        import sre_parse as parser
    return parser, constants


def _nested_quantifier(tree, constants, inside: bool = False) -> bool:
    """Whether a parsed pattern repeats something that itself repeats (`(a+)+`, `(\\d*\\s?)*`):
    the shape whose backtracking grows exponentially with the line."""
    repeats = {constants.MAX_REPEAT, constants.MIN_REPEAT}
    repeats |= {getattr(constants, "POSSESSIVE_REPEAT", constants.MAX_REPEAT)}
    for op, av in tree:
        if op in repeats:
            _low, high, sub = av
            many = high is constants.MAXREPEAT or high > 1
            if many and inside:
                return True
            if _nested_quantifier(sub, constants, inside or many):
                return True
        elif op is constants.SUBPATTERN:
            if _nested_quantifier(av[-1], constants, inside):
                return True
        elif op is constants.BRANCH:
            if any(_nested_quantifier(b, constants, inside) for b in av[1]):
                return True
        elif op in (constants.ASSERT, constants.ASSERT_NOT):
            if _nested_quantifier(av[1], constants, inside):
                return True
        elif op is getattr(constants, "ATOMIC_GROUP", None):
            if _nested_quantifier(av, constants, inside):
                return True
    return False


def _backreference(tree, constants) -> bool:
    for op, av in tree:
        if op in (constants.GROUPREF, getattr(constants, "GROUPREF_EXISTS", None)):
            return True
        children = []
        if op in (constants.MAX_REPEAT, constants.MIN_REPEAT):
            children = [av[2]]
        elif op is constants.SUBPATTERN:
            children = [av[-1]]
        elif op is constants.BRANCH:
            children = list(av[1])
        elif op in (constants.ASSERT, constants.ASSERT_NOT):
            children = [av[1]]
        if any(_backreference(c, constants) for c in children):
            return True
    return False


def pattern_problem(key: str, pattern) -> str | None:
    """Why a throughput pattern cannot be used: not a string, too long, does not compile,
    lacks its named groups, nests quantifiers or refers back to a group (both can backtrack
    exponentially). Matching is bounded besides (dlscale.run.script_cell: a cap on a line's
    length, a timeout per line)."""
    if not isinstance(pattern, str) or not pattern:
        return f"{key}: a regular expression (Python `re`), e.g. 'throughput: (?P<value>[0-9.]+)'"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"{key}: {len(pattern)} characters; at most {MAX_PATTERN_CHARS}"
    try:
        compiled = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        return f"{key}: {pattern[:60]!r} does not compile: {exc}"
    parser, constants = _parser()
    try:
        tree = parser.parse(pattern)
    except Exception as exc:  # noqa: BLE001 (it compiled: the parser agrees)
        return f"{key}: {pattern[:60]!r} cannot be read: {exc}"
    if _nested_quantifier(tree, constants):
        return (
            f"{key}: {pattern[:60]!r} repeats a group that itself repeats (a nested "
            "quantifier such as (a+)+), which backtracks exponentially on a line that almost "
            "matches; write the repeated part once, e.g. ([0-9.]+) rather than ([0-9]+\\.?)+"
        )
    if _backreference(tree, constants):
        return f"{key}: {pattern[:60]!r} refers back to a group; patterns may not (backtracking)"
    groups = set(compiled.groupindex)
    if groups != set(RATE_GROUPS) and groups != set(STEP_GROUPS):
        return (
            f"{key}: {pattern[:60]!r} has named groups {sorted(groups) or 'none'}; a pattern has "
            "either (?P<value>...) (a rate in the unit per second) or (?P<count>...) and "
            "(?P<seconds>...) (one step's units and seconds), and no other named group"
        )
    return None
