"""MkDocs hooks of the documentation site (docs/mkdocs.yml), run at every build.

- `<!-- schema: NAME -->` in a page becomes the reference of config/schemas/NAME.schema.json:
  one row per key with its type, default, allowed values and description, read from the schema
  at build time (the registries fill the allowed frameworks, models and formats, as when the
  workflow loads it). The schema is the one source: no page keeps a copy of a key table.
- `<!-- include: PATH -->` becomes the text of PATH (relative to the repository root), its
  headings moved one level down, so a file kept elsewhere (benchmarks/README.md) is a page too.
- Every Markdown file in a PUBLISHED folder is a page of the site at its repository path
  (benchmarks/reports/<date>-<slug>.md: the benchmark reports, listed by the index in
  benchmarks/README.md, which the Benchmarks page includes); out of the nav, the index lists
  them. A link to one, written relative to the file that holds it as on any Markdown viewer (a
  page, an included file, another report), is made relative to the page it ends up on.

A schema key without a description, or a marker naming a missing schema or file, is logged as
a warning, which `mkdocs build --strict` (the test command: tests/test_docs.py) turns into a
failed build.

Every build empties its site folder first ("Cleaning site directory"). `on_config` refuses a
site folder that holds a study's measurements (a study folder named `site` from before the name
was reserved, or a `-d` pointing into a study), before anything is removed.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "config" / "schemas"
log = logging.getLogger("mkdocs.hooks.dlscale")

SCHEMA_MARKER = re.compile(r"<!-- schema: ([a-z_]+) -->")
INCLUDE_MARKER = re.compile(r"<!-- include: (\S+) -->")
# Repository folders whose Markdown files are pages of the site at the same path
PUBLISHED = ("benchmarks/reports",)
# A Markdown link: its text's end, the target (without #anchor), the anchor, the closing bracket
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
# Keys whose entries are free-form partial cells (axis -> value), documented by their parent
# (tests/unit/study/test_config.py skips them the same way).
FREE_FORM = ("exclude",)
# Placeholders for the names a mapping's keys are (additionalProperties).
PLACEHOLDERS = {
    "hardware": "",  # one entry per hardware key: its keys are the rows
    "references": "<system>",
    "references.<system>": "<cell pattern>",
    "references.<system>.<cell pattern>": "",
    "script.scripts": "<label>",  # the script workload's scripts, by label
}


def load_schema(name: str) -> dict:
    """The schema as the workflow sees it: dlscale.study.config.load_schema fills the registries'
    enums (frameworks, models, dataset formats); without the package, the file as it is."""
    path = SCHEMAS / f"{name}.schema.json"
    try:
        from dlscale.study.config import load_schema as dlscale_load

        return dlscale_load(path)
    except ImportError:
        return json.loads(path.read_text())


def _resolve(schema: dict, root: dict) -> dict:
    """A subschema with its local $ref merged in (the referring schema's keys win)."""
    ref = schema.get("$ref")
    if not ref or not ref.startswith("#/"):
        return schema
    target = root
    for part in ref[2:].split("/"):
        target = target[part]
    merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    if "properties" in target and "properties" in schema:
        merged["properties"] = {
            k: {**target["properties"].get(k, {}), **v}
            for k, v in {**target["properties"], **schema["properties"]}.items()
        }
    return merged


def walk(schema: dict, root: dict | None = None, path: str = ""):
    """(key path, subschema, required) for every documented key, parents before children:
    properties, the items of a list of mappings (`key[].item`), and the values of a mapping
    whose keys are names (additionalProperties, shown with a placeholder such as
    `<hardware key>`)."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    required = set(schema.get("required", []))
    for key, sub in schema.get("properties", {}).items():
        shared = "$ref" in sub  # a shared definition ($defs): its keys are rows of their own
        sub = _resolve(sub, root)
        full = f"{path}.{key}" if path else key
        yield full, sub, key in required
        if full.split(".")[0] in FREE_FORM or shared:
            continue
        yield from walk(sub, root, full)
        items = sub.get("items")
        if isinstance(items, dict) and items.get("properties"):
            yield from walk(items, root, f"{full}[]")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        name = PLACEHOLDERS.get(path or _schema_name(root), "")
        full = f"{path}.{name}" if path and name else (name or path)
        if name:
            yield full, _resolve(extra, root), False
        yield from walk(extra, root, full)
    if not path:
        for name, definition in root.get("$defs", {}).items():
            yield from walk(definition, root, f"<{name}>")


def _schema_name(schema: dict) -> str:
    """`hardware` for .../hardware.schema.json (its $id)."""
    return schema.get("$id", "").rsplit("/", 1)[-1].split(".")[0]


def _fixed_unit(key: str, sub: dict) -> bool:
    # a metric's fixed unit: the reference's `unit` row describes it, the metric's row says it
    return key.endswith(".unit") and "const" in sub and "description" not in sub


def _code(value) -> str:
    return "`" + json.dumps(value, ensure_ascii=False).replace("|", "\\|") + "`"


def _type(sub: dict) -> str:
    kind = sub.get("type", "")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    words = {"array": "list", "object": "mapping", "null": "null"}
    return " or ".join(words.get(k, k) for k in kinds)


def _allowed(sub: dict) -> str:
    parts = []
    if "enum" in sub:
        parts.append("one of " + ", ".join(_code(v) for v in sub["enum"] if v is not None))
    for branch in sub.get("oneOf", []):  # a name of a registry's, or another form (gpu_binding)
        if "enum" in branch:
            parts.append("one of " + ", ".join(_code(v) for v in branch["enum"]))
    items = sub.get("items") if isinstance(sub.get("items"), dict) else {}
    if "enum" in items:
        parts.append("each one of " + ", ".join(_code(v) for v in items["enum"]))
    if "const" in sub:
        parts.append(f"exactly {_code(sub['const'])}")
    for scope, prefix in ((sub, ""), (items, "each ")):
        if "x-dlscale-allowed" in scope:
            parts.append(prefix + scope["x-dlscale-allowed"])
        elif "pattern" in scope:
            parts.append(f"{prefix}matching `{scope['pattern']}` as a whole".replace("|", "\\|"))
        for word, sign in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        ):
            if word in scope:
                parts.append(f"{prefix}{sign} {scope[word]:,}")
        for word, what in (("maxLength", "characters"), ("maxItems", "entries")):
            if word in scope:
                parts.append(f"{prefix}at most {scope[word]:,} {what}")
    if sub.get("properties") and sub.get("additionalProperties") is False and sub.get("type"):
        parts.append("no other keys")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


def render(name: str) -> tuple[str, list[str]]:
    """The Markdown reference of config/schemas/NAME.schema.json, and its problems (keys
    without a description)."""
    schema = load_schema(name)
    problems = []
    rows = [
        "| key | type | default | allowed | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, sub, required in walk(schema):
        if _fixed_unit(key, sub):
            continue
        description = sub.get("description", "")
        if not description:
            problems.append(f"{name}.schema.json: `{key}` has no description")
        unit = sub.get("properties", {}).get("unit", {})
        if "const" in unit:
            description += f" Unit `{unit['const']}`."
        default = _code(sub["default"]) if "default" in sub else "required" if required else ""
        row = [f"`{key}`", _type(sub), default, _allowed(sub), _cell(description)]
        rows.append("| " + " | ".join(row) + " |")
    head = f"*Generated from `config/schemas/{name}.schema.json`: {schema.get('title', name)}.*"
    if schema.get("description"):
        head += " " + schema["description"]
    return head + "\n\n" + "\n".join(rows) + "\n", problems


def undocumented(name: str) -> list[str]:
    return render(name)[1]


def published(path: str) -> bool:
    """Whether a repository path (relative to the root) is a page of the site at that path."""
    folder = posixpath.dirname(path)
    return folder in PUBLISHED and path.endswith(".md") and (ROOT / path).is_file()


def published_files(config) -> list:
    """The PUBLISHED folders' Markdown files as pages of the site, out of the nav."""
    from mkdocs.structure.files import File, InclusionLevel

    return [
        File.generated(
            config,
            f"{folder}/{path.name}",
            abs_src_path=str(path),
            inclusion=InclusionLevel.NOT_IN_NAV,
        )
        for folder in PUBLISHED
        for path in sorted((ROOT / folder).glob("*.md"))
    ]


def relink(text: str, source: str, page: str) -> str:
    """`text`, read from the repository file `source`, with each relative link that reaches a
    published file made relative to `page` (the path in the site it is rendered at)."""
    here = posixpath.dirname(source)

    def moved(match: re.Match) -> str:
        target = match.group(2)
        if SCHEME.match(target) or target.startswith("/"):
            return match.group(0)
        path = posixpath.normpath(posixpath.join(here, target))
        if not published(path):
            return match.group(0)
        relative = posixpath.relpath(path, posixpath.dirname(page) or ".")
        return f"{match.group(1)}{relative}{match.group(3) or ''}{match.group(4)}"

    return LINK.sub(moved, text)


def include(relative: str, page: str = "index.md") -> str:
    """A repository file's text with its headings one level down (its title becomes a
    section of the page that includes it), its links to published files made relative to
    `page`, the including page's path in the site."""
    text = (ROOT / relative).read_text()
    return relink(re.sub(r"(?m)^(#{1,5}) ", r"#\1 ", text), relative, page)


def on_config(config):
    """Refuse to build into (and so empty) a folder holding any cell's metrics."""
    from mkdocs.exceptions import Abort

    site = Path(config["site_dir"])
    if site.is_dir():
        measured = next(site.rglob("metrics.jsonl"), None)
        if measured is not None:
            raise Abort(
                f"The site folder {site} holds a study's measurements ({measured}); a build "
                "empties its site folder first, so nothing was built or removed. Move the study "
                "(e.g. `mv results/site results/site-study`, then run it with `study: "
                "site-study`), or build elsewhere with `mkdocs build -f docs/mkdocs.yml -d DIR`."
            )
    return config


def on_files(files, config):
    """Add the PUBLISHED folders' files to the site (the benchmark reports)."""
    for file in published_files(config):
        files.append(file)
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def schema(match: re.Match) -> str:
        name = match.group(1)
        if not (SCHEMAS / f"{name}.schema.json").is_file():
            log.warning("%s: no schema config/schemas/%s.schema.json", page.file.src_path, name)
            return match.group(0)
        text, problems = render(name)
        for problem in problems:
            log.warning("%s: %s", page.file.src_path, problem)
        return text

    def included(match: re.Match) -> str:
        relative = match.group(1)
        if not (ROOT / relative).is_file():
            log.warning("%s: no file %s to include", page.file.src_path, relative)
            return match.group(0)
        return include(relative, page.file.src_uri)

    # the page's own links, from the repository file it was read from (a page under docs/pages/
    # or a published report)
    # (no page: the markdown rendered outside a site build, as the configuration test does)
    file = getattr(page, "file", None)
    source = Path(file.abs_src_path).resolve() if file and file.abs_src_path else None
    if source is not None and source.is_relative_to(ROOT.resolve()):
        here = source.relative_to(ROOT.resolve()).as_posix()
        markdown = relink(markdown, here, page.file.src_uri)
    return INCLUDE_MARKER.sub(included, SCHEMA_MARKER.sub(schema, markdown))
