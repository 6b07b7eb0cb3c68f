"""Load the study configuration and the site hardware map; validate the configuration.

The hardware file's checks beyond its schema are in dlscale.study.hardware, what the hashes
include in dlscale.study.hashes.

Every problem is reported before any job runs, all at once, each message naming the key
(as a dotted path, e.g. ``axes.nodes[0]``) and, where there is a closed set, the allowed values.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import reprlib
import stat
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dlscale.study.cell import (
    AXES,  # noqa: F401  (re-exported: the axes of a study's matrix)
    STUDY_DIR,
)
from dlscale.study.errors import ConfigError  # noqa: F401 (re-exported)
from dlscale.study.results_layout import RESERVED_UNDER_RESULTS

# Bounds on reading a configuration file: it is refused before parsing when larger than
# MAX_FILE_BYTES, and while parsing when its aliases would expand it past MAX_NODES values or
# it nests deeper than MAX_DEPTH (a "billion laughs" file is a few hundred bytes).
MAX_FILE_BYTES = 1_000_000
MAX_NODES = 100_000
MAX_DEPTH = 32
# Bad values are quoted in messages up to this many characters (and at most
# dlscale.study.errors.MAX_PROBLEMS problems are listed).
MAX_VALUE_CHARS = 60


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = MAX_VALUE_CHARS
_REPR.maxlevel = 3


def shorten(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """repr(value), truncated to `limit` characters (and never expanded past them)."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])
    else:  # reprlib: bounded in elements, depth and string length whatever the value's size
        text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut(text: str, limit: int) -> str:
    """Text (not a value) cut to `limit` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _file_kind(mode: int) -> str:
    for test, word in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return word
    return "not a regular file"


def read_config_text(path: str | Path, *, source: str | None = None) -> str:
    """The text of a configuration file, read with bounds: only a regular file (never a
    directory, FIFO, device or socket, so a read cannot block), at most MAX_FILE_BYTES, valid
    UTF-8. Every refusal is a ConfigError naming the file."""
    source = source or str(path)
    if str(path).strip() == "":
        raise ConfigError(source, ["the path is empty; name a YAML file"])
    if "\x00" in str(path):
        raise ConfigError(source, ["the path contains a NUL character"])
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once instead of hanging; the
        # fstat below then refuses it before any read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(source, [f"file not found: {path}"]) from None
    except IsADirectoryError:
        raise ConfigError(source, [f"{path} is a directory, not a YAML file"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot open {path}: {exc.strerror}"]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                source, [f"{path} is {_file_kind(info.st_mode)}, not a regular YAML file"]
            )
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(
                source,
                [
                    f"{path} is {info.st_size:,} bytes; a configuration file may have at "
                    f"most {MAX_FILE_BYTES:,} bytes"
                ],
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, [f"cannot read {path}: {exc.strerror}"]) from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_FILE_BYTES:  # grew while being read
        raise ConfigError(
            source, [f"{path} has more than {MAX_FILE_BYTES:,} bytes; refused unread"]
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source,
            [
                f"{path} is not UTF-8 text (invalid byte {data[exc.start]:#04x} at offset "
                f"{exc.start}); save it as UTF-8"
            ],
        ) from None


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys and bounds what aliases can expand to."""

    _depth = 0

    def compose_node(self, parent, index):
        # refuse deep nesting while composing: PyYAML's scanner slows down with every open
        # flow level ("[[[[...", 1 MB of it takes seconds), so stop at the first level too many
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooLarge(f"nests deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:  # the mapping's own keys, before merges (<<)
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, "a mapping key must be a plain value", key_node.start_mark
                    ) from None
                if not isinstance(key, str):
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"the key {shorten(key)} is not a string (YAML reads unquoted "
                        "yes/no/on/off as booleans and digits as numbers): quote it",
                        key_node.start_mark,
                    )
                if key in seen:
                    raise _Duplicate(key, seen[key], key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


class _Duplicate(Exception):
    def __init__(self, key, first, again):
        self.key, self.first, self.again = key, first, again


def _expanded_size(node, memo: dict, depth: int = 0) -> int:
    """How many values a composed YAML node stands for once every alias is expanded
    (memoised per node, so a bomb is measured without being expanded); stops past the bounds."""
    if depth > MAX_DEPTH:
        raise _TooLarge(f"nests deeper than {MAX_DEPTH} levels")
    known = memo.get(id(node))
    if known is not None:
        return known
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            size += _expanded_size(child, memo, depth + 1)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += _expanded_size(key, memo, depth + 1) + _expanded_size(value, memo, depth + 1)
    if size > MAX_NODES:
        raise _TooLarge(
            f"expands to more than {MAX_NODES:,} values (YAML aliases; a 'billion laughs' file?)"
        )
    memo[id(node)] = size
    return size


class _TooLarge(Exception):
    pass


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text safely (no tags that build objects, no code), refusing duplicate keys,
    documents past the expansion bounds and more than one document."""
    try:
        loader = _StrictLoader(text)
    except yaml.YAMLError as exc:  # the reader refuses control characters up front
        raise ConfigError(source, [f"not valid YAML: {_cut(str(exc), 400)}"]) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {})
        return loader.construct_document(node)
    except _Duplicate as dup:
        raise ConfigError(
            source,
            [
                f"duplicate key {shorten(dup.key)} (line {dup.first.line + 1} and again at "
                f"line {dup.again.line + 1}); each key may appear once"
            ],
        ) from None
    except _TooLarge as exc:
        raise ConfigError(source, [f"the document {exc}; refused"]) from None
    except RecursionError:
        raise ConfigError(source, [f"the document nests deeper than {MAX_DEPTH} levels"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML: {_cut(str(exc), 400)}"]) from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path, *, source: str | None = None) -> Any:
    """A configuration file's content: bounded read (read_config_text), then parse_yaml."""
    source = source or str(path)
    return parse_yaml(read_config_text(path, source=source), source)


def load_config_file(path: str | Path, *, source: str | None = None) -> dict:
    """A study file (config/config.yaml, a `study_file`, or a --configfile): a YAML mapping, never
    a template. Snakemake evaluates a file with a top-level `__use_yte__: true` as a YTE
    template (Python expressions); dlscale refuses such a file instead of running it."""
    source = source or str(path)
    data = load_yaml(path, source=source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            source, [f"(top level): must be a mapping of keys, got {type(data).__name__}"]
        )
    if "__use_yte__" in data:
        raise ConfigError(
            source,
            [
                "__use_yte__: a study file is plain YAML; dlscale never evaluates it as a "
                "template (YTE runs Python code). Remove the key and write the values out."
            ],
        )
    return data


REGISTRY_KEYWORD = "x-dlscale-registry"
# {"x-dlscale-registry-default": R}: the subschema's default is R's default (a list of it for an
# array), so the schema file names no registry value.
REGISTRY_DEFAULT_KEYWORD = "x-dlscale-registry-default"


def _registry_names(registry: str) -> list[str]:
    """The names a registry defines: `models` (dlscale.models), `frameworks`, `strategies`,
    `gpu_bindings`, `formats`, `containers`, `pipeline_schedules` or `optimizers`
    (dlscale.registry; with `auto`)."""
    if registry == "models":
        from dlscale.models import names

        return names()
    if registry == "optimizers":  # config optimizer.name: auto, then every optimizer
        from dlscale.registry.optimizers import names

        return names()
    if registry == "pipeline_schedules":  # config pp_schedule
        from dlscale.registry.parallel_dims import PIPELINE_SCHEDULES as records
    elif registry == "frameworks":
        from dlscale.registry.frameworks import FRAMEWORKS as records
    elif registry == "strategies":
        from dlscale.registry.strategies import STRATEGIES as records
    elif registry == "gpu_bindings":
        from dlscale.registry.gpu_bindings import GPU_BINDINGS as records
    elif registry == "formats":  # the dataset formats dlscale.data reads
        from dlscale.registry.formats import FORMATS as records
    elif registry == "containers":  # hardware.yaml container.engine
        from dlscale.registry.containers import ENGINES as records
    else:
        raise ValueError(f"{REGISTRY_KEYWORD}: unknown registry {registry!r}")
    return list(records)


def _registry_default(registry: str) -> str:
    if registry == "strategies":
        from dlscale.registry.strategies import DEFAULT_STRATEGY

        return DEFAULT_STRATEGY
    if registry == "gpu_bindings":
        from dlscale.registry.gpu_bindings import DEFAULT_GPU_BINDING

        return DEFAULT_GPU_BINDING
    raise ValueError(f"{REGISTRY_DEFAULT_KEYWORD}: registry {registry!r} has no default")


def _fill_registries(schema: Any) -> None:
    """Give every subschema marked {"x-dlscale-registry": R} the enum of R's names, and every one
    marked {"x-dlscale-registry-default": R} R's default, so the registries (not the schema
    file) say which models, frameworks and strategies exist."""
    if isinstance(schema, dict):
        if REGISTRY_KEYWORD in schema:
            schema["enum"] = _registry_names(schema[REGISTRY_KEYWORD])
        if REGISTRY_DEFAULT_KEYWORD in schema:
            value = _registry_default(schema[REGISTRY_DEFAULT_KEYWORD])
            schema["default"] = [value] if schema.get("type") == "array" else value
        for sub in schema.values():
            _fill_registries(sub)
    elif isinstance(schema, list):
        for sub in schema:
            _fill_registries(sub)


def load_schema(path: str | Path) -> dict:
    with Path(path).open() as fh:
        schema = json.load(fh)
    _fill_registries(schema)
    return schema


def _key_path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _suggest(value, allowed) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(a) for a in allowed], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
    "boolean": "true or false",
    "null": "null",
}


def _describe(error: jsonschema.ValidationError) -> str:
    """One human sentence for a jsonschema error: key path, bad value, allowed values."""
    path = list(error.absolute_path)
    key = _key_path(path)
    v, val = error.validator, error.instance
    shown = shorten(val)
    if v == "enum":
        allowed = error.validator_value
        return (
            f"{key}: {shown} is not allowed; allowed values: "
            f"{', '.join(map(str, allowed))}{_suggest(val, allowed)}"
        )
    if v == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(val) - set(allowed), key=str)
        bits = [f"unknown key {k!r}{_suggest(k, allowed)}" for k in extra]
        where = f" in {key}" if path else ""
        return f"{'; '.join(bits)}{where}; allowed keys: {', '.join(allowed)}"
    if v == "type":
        want = error.validator_value
        want = [want] if isinstance(want, str) else want
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in want)
        if isinstance(val, bool) and ("integer" in want or "number" in want):
            return f"{key}: {shown} is a boolean; it must be {words}"
        if isinstance(val, float) and not math.isfinite(val):
            return f"{key}: {shown} is not a finite number; it must be {words}"
        if isinstance(val, float) and "integer" in want:
            return f"{key}: {shown} must be {words} (write it without a decimal point)"
        return f"{key}: {shown} must be {words}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[v]
        allowed = error.schema.get("x-dlscale-allowed")
        return f"{key}: {shown} must be {op} {error.validator_value}" + (
            f" (allowed: {allowed})" if allowed else ""
        )
    if v == "uniqueItems":
        seen, dup = set(), []
        for item in val:
            marker = json.dumps(item, sort_keys=True)
            if marker in seen:
                dup.append(item)
            seen.add(marker)
        return f"{key}: duplicated values {shorten(dup)}; list each value once"
    if v == "minItems":
        return f"{key}: must list at least {error.validator_value} value(s)"
    if v == "minProperties":
        return f"{key}: must name at least {error.validator_value} key(s)"
    if v == "pattern":
        allowed = error.schema.get(
            "x-dlscale-allowed",
            f"letters, digits and _ . - as matched by {error.validator_value!r}",
        )
        what = "a valid name" if "x-dlscale-allowed" not in error.schema else "allowed"
        return f"{key}: {shown} is not {what} (allowed: {allowed})"
    if v == "propertyNames":
        return f"{key}: key {shown} is not a valid name"
    if v == "required":
        return f"{key}: {error.message}"
    if v == "maxLength":
        return f"{key}: longer than {error.validator_value} characters"
    if v == "maxProperties":
        return f"{key}: names {len(val)} keys; at most {error.validator_value} are allowed"
    if v == "maxItems":
        return f"{key}: lists {len(val)} values; at most {error.validator_value} are allowed"
    if v == "minLength":
        return f"{key}: must not be empty"
    return f"{key}: {_cut(error.message, 200)}"


def _leaf_errors(error):
    if error.context:
        subs = error.context
        if error.validator in ("oneOf", "anyOf"):
            # a branch for another type of value (gpu_binding: a name or a map) says nothing
            # about this one: keep the errors of the branches its type belongs to
            other_type = {
                e.relative_schema_path[0]
                for e in subs
                if e.validator == "type" and not e.relative_path and len(e.schema_path) == 2
            }
            kept = [e for e in subs if e.relative_schema_path[0] not in other_type]
            if not kept and "type" in error.schema:
                return  # of no branch's type: the schema's own `type` error says so
            subs = kept or subs
        for sub in subs:
            yield from _leaf_errors(sub)
    else:
        yield error


def _is_integer(_checker, value) -> bool:
    """An integer is an int, never a bool and never a float (JSON Schema would take 2.0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(_checker, value) -> bool:
    """A number is a finite int or float, never a bool (NaN and infinity pass every bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


def _anchored_pattern(validator, pattern, instance, schema):
    """`pattern`, matched as a whole: Python's `$` also matches before a final newline, so an
    anchored pattern (^...$) must match the entire string (re.fullmatch)."""
    if not isinstance(instance, str):
        return
    if pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$"):
        ok = re.fullmatch(pattern[1:-1], instance) is not None
    else:
        ok = re.search(pattern, instance) is not None
    if not ok:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_TYPE_CHECKER = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
    {"integer": _is_integer, "number": _is_number}
)
StrictValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"pattern": _anchored_pattern},
    type_checker=_TYPE_CHECKER,
)


def schema_problems(instance: Any, schema: dict) -> list[str]:
    validator = StrictValidator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    problems = []
    for err in errors:
        for leaf in _leaf_errors(err):
            msg = _describe(leaf)
            if msg not in problems:
                problems.append(msg)
    return problems


def apply_defaults(schema: dict, instance: Any) -> Any:
    """Fill schema defaults into a (valid) instance, recursively for objects."""
    if not isinstance(instance, dict) or schema.get("type") != "object":
        return instance
    out = dict(instance)
    for key, sub in schema.get("properties", {}).items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = apply_defaults(sub, out[key])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in out:
            if key not in schema.get("properties", {}):
                out[key] = apply_defaults(extra, out[key])
    return out


def study_name_problem(study: Any) -> str | None:
    """Why `study` cannot name a study's results folder: it is (case-insensitively) a name the
    project itself writes under results/ (dlscale.study.results_layout.RESERVED_UNDER_RESULTS)."""
    if not isinstance(study, str):
        return None
    reserved = {name.lower(): name for name in RESERVED_UNDER_RESULTS}
    taken = reserved.get(study.lower())
    if taken is None:
        return None
    folder = STUDY_DIR.format(study=study)
    message = (
        f"study: {study!r} cannot name a study: {STUDY_DIR.format(study=taken)} is "
        f"{RESERVED_UNDER_RESULTS[taken]}. Reserved under results/ (in any letter case): "
        f"{', '.join(sorted(RESERVED_UNDER_RESULTS))}; choose another name"
    )
    if os.path.isdir(folder) and next(Path(folder).rglob("metrics.jsonl"), None) is not None:
        # a study of that name measured before the name was reserved: its cells move with their
        # folder (a study's name is not part of a cell's identity)
        message += (
            f". {folder} holds measurements: keep them by moving the folder, e.g. "
            f"`mv {folder} {folder}-study`, and name the study {study + '-study'!r}"
        )
    return message


def with_study_models(schema: dict, models) -> dict:
    """The schema with the names a study's `models:` section defines (path-safe ones:
    dlscale.models.zoo.NAME_PATTERN) among the values its model axes allow (a copy; the
    schema itself is left as the registries filled it)."""
    if not isinstance(models, dict) or not models:
        return schema
    import copy

    from dlscale.models.zoo import name_problem

    names = [n for n in models if name_problem(n) is None]
    if not names:
        return schema
    schema = copy.deepcopy(schema)

    def extend(node):
        if isinstance(node, dict):
            if node.get(REGISTRY_KEYWORD) == "models" and "enum" in node:
                node["enum"] = [*node["enum"], *(n for n in names if n not in node["enum"])]
            for sub in node.values():
                extend(sub)
        elif isinstance(node, list):
            for sub in node:
                extend(sub)

    extend(schema)
    return schema


def validate_config(config: dict, schema: dict, source: str = "config") -> dict:
    """Schema-validate the study config and return it with defaults filled in."""
    if not isinstance(config, dict):
        raise ConfigError(source, [f"(top level): must be a mapping, got {type(config).__name__}"])
    schema = with_study_models(schema, config.get("models"))
    problems = schema_problems(config, schema)
    reserved = study_name_problem(config.get("study"))
    if reserved:
        problems.append(reserved)
    if problems:
        raise ConfigError(source, problems)
    return apply_defaults(schema, config)
