"""Load and validate the study configuration and the site hardware map.

Every problem is reported before any job runs, all at once, each message naming the key
(as a dotted path, e.g. ``axes.nodes[0]``) and, where there is a closed set, the allowed values.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .cell import AXES  # noqa: F401  (re-exported: the axes of a study's matrix)


class ConfigError(ValueError):
    """A configuration problem; the message lists every problem found."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid {source}:\n{lines}")


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        with path.open() as fh:
            return yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(str(path), [f"file not found: {path}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {exc}"]) from None


REGISTRY_KEYWORD = "x-dlscale-registry"


def _registry_names(registry: str) -> list[str]:
    """The names a registry defines: `models` (dlscale.models) or `frameworks`."""
    if registry == "models":
        from .models import names
    elif registry == "frameworks":
        from .frameworks import names
    else:
        raise ValueError(f"{REGISTRY_KEYWORD}: unknown registry {registry!r}")
    return names()


def _fill_registries(schema: Any) -> None:
    """Give every subschema marked {"x-dlscale-registry": R} the enum of R's names, so the
    registries (not the schema file) say which models and frameworks exist."""
    if isinstance(schema, dict):
        if REGISTRY_KEYWORD in schema:
            schema["enum"] = _registry_names(schema[REGISTRY_KEYWORD])
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
    if v == "enum":
        allowed = error.validator_value
        return (
            f"{key}: {val!r} is not allowed; allowed values: "
            f"{', '.join(map(str, allowed))}{_suggest(val, allowed)}"
        )
    if v == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(val) - set(allowed))
        bits = [f"unknown key {k!r}{_suggest(k, allowed)}" for k in extra]
        where = f" in {key}" if path else ""
        return f"{'; '.join(bits)}{where}; allowed keys: {', '.join(allowed)}"
    if v == "type":
        want = error.validator_value
        want = [want] if isinstance(want, str) else want
        return f"{key}: {val!r} must be {' or '.join(_TYPE_WORDS.get(w, w) for w in want)}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[v]
        return f"{key}: {val!r} must be {op} {error.validator_value}"
    if v == "uniqueItems":
        seen, dup = set(), []
        for item in val:
            marker = json.dumps(item, sort_keys=True)
            if marker in seen:
                dup.append(item)
            seen.add(marker)
        return f"{key}: duplicated values {dup!r}; list each value once"
    if v == "minItems":
        return f"{key}: must list at least {error.validator_value} value(s)"
    if v == "minProperties":
        return f"{key}: must name at least {error.validator_value} key(s)"
    if v == "pattern":
        return (
            f"{key}: {val!r} is not a valid name (allowed: letters, digits and "
            f"_ . - as matched by {error.validator_value!r})"
        )
    if v == "propertyNames":
        return f"{key}: key {val!r} is not a valid name"
    if v == "required":
        return f"{key}: {error.message}"
    if v == "maxLength":
        return f"{key}: longer than {error.validator_value} characters"
    return f"{key}: {error.message}"


def _leaf_errors(error):
    if error.context:
        for sub in error.context:
            yield from _leaf_errors(sub)
    else:
        yield error


def schema_problems(instance: Any, schema: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
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


def validate_config(config: dict, schema: dict, source: str = "config") -> dict:
    """Schema-validate the study config and return it with defaults filled in."""
    if not isinstance(config, dict):
        raise ConfigError(source, [f"(top level): must be a mapping, got {type(config).__name__}"])
    problems = schema_problems(config, schema)
    if problems:
        raise ConfigError(source, problems)
    return apply_defaults(schema, config)


def validate_hardware(hardware: dict, schema: dict, source: str = "hardware file") -> dict:
    if not isinstance(hardware, dict):
        raise ConfigError(source, ["(top level): must be a mapping of hardware keys"])
    problems = schema_problems(hardware, schema)
    for key, entry in hardware.items():
        if not isinstance(entry, dict):
            continue
        device, gpus = entry.get("device"), entry.get("gpus_per_node", 0)
        if device == "cuda" and not gpus:
            problems.append(f"{key}.gpus_per_node: device 'cuda' needs gpus_per_node >= 1")
        if device == "cpu" and gpus:
            problems.append(
                f"{key}.gpus_per_node: {gpus} GPUs on a 'cpu' hardware key; "
                "set device: cuda or gpus_per_node: 0"
            )
    if problems:
        raise ConfigError(source, problems)
    return apply_defaults(schema, hardware)


def config_hash(config: dict, hardware: dict) -> str:
    """Short, stable hash of the validated config and the hardware entries it uses."""
    used = {k: hardware[k] for k in config["axes"]["hardware"] if k in hardware}
    # Presentation and launcher settings do not change what is measured.
    measured = {k: v for k, v in config.items() if k not in ("report", "launcher", "remeasure")}
    blob = json.dumps({"config": measured, "hardware": used}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
