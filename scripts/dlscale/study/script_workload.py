"""A user's training script as a cell: the `script` workload (config `script`).

A study names its scripts under `script.scripts`, each by a label of its own: the label is its
cells' `framework`, so a script is a series of the scaling study like any framework's. A script
is an argv list, never a shell line, whose placeholders (PLACEHOLDERS: the batch, the steps, the
cell's output folder, ...) are filled per cell by the launcher (dlscale.run.script_cell); its
ranks start through the project's launcher with torchrun's environment (dlscale.run.script_rank),
and its throughput is read from what it writes: JSON lines with the minimal record of
JSON_RECORD, or a pattern on its standard output with a unit, as ReFrame's performance patterns.

Everything here runs when the study is parsed, before any job: an unknown placeholder, shell
text in the argv, a missing script, a relative path out of the checkout, a pattern that does not
compile, lacks its groups or nests quantifiers (catastrophic backtracking) is refused naming the
key, and nothing of the script runs. The content hash of the script and of its `files` (default:
the script's folder) is part of each of its cells' identity (Cell.script), with its argv:
editing the script re-measures its cells, and every earlier measurement is kept
(dlscale.store.measurements).

The pattern's check: dlscale.study.script_patterns; the script's files and their content hash:
dlscale.study.script_files. Pure Python, no Snakemake: the matrix (dlscale.study.matrix) and its
checks call it.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import string
from pathlib import Path

from dlscale.study.script_files import content_hash, hashed_files, resolve_path
from dlscale.study.script_patterns import pattern_problem

SCRIPT_WORKLOAD = "script"
# What a placeholder of `command` becomes, per cell (dlscale.run.script_cell.fill_command).
PLACEHOLDERS = {
    "python": "the interpreter of the script's environment (`environment`)",
    "script": "the script's path as the study names it (`script`)",
    "per_rank_batch": "samples per rank per step",
    "global_batch": "samples per step over all ranks",
    "steps": "timed steps (script.steps, else the study's steps)",
    "warmup_steps": "warm-up steps (script.warmup_steps, else the study's warmup_steps)",
    "seq_len": "the sequence length (script.seq_len, else the study's seq_len; refused if none)",
    "precision": "the cell's precision (script.axes.precision)",
    "parallelism": "the cell's parallelism (script.axes.parallelism)",
    "output_dir": "the cell's output folder (absolute; kept with the measurement)",
    "seed": "script.seed",
    "nodes": "the cell's node count",
    "ranks_per_node": "ranks per node",
    "world_size": "nodes x ranks per node",
}
# (the units samples, tokens, images; the launches ranks, torchrun; the scopes global, rank:
# the schema's enums, config/schemas/config.schema.json `script`)
# The minimal JSON record a script writes, one per line: its step, how many units the step
# processed (the key is the unit) and its seconds.
JSON_RECORD = '{"step": 3, "samples": 256, "seconds": 0.125}'
MAX_ARGS, MAX_ARG_CHARS = 256, 4096
# Programs that would run a shell line: refused as the command's program.
SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "fish", "env", "eval", "xargs")
# Shell syntax no argv item may hold: the command is never run by a shell, so it would reach
# the script as literal text.
_SHELL_TEXT = re.compile(r"[;|&`<>\n]|\$[({A-Za-z_]")
_LABEL = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclasses.dataclass(frozen=True)
class Script:
    """One script as its cells carry it (Cell.script): label, argv template, the script's path,
    the content hash of it and its files, where its throughput is read and how."""

    label: str
    command: tuple[str, ...]
    script: str
    sha256: str
    files: int
    environment: str
    model: str
    launch: str
    source: str  # "json" or "pattern"
    read: str  # the JSON file's name in the output folder, or the pattern
    unit: str
    scope: str
    warmup: int
    seed: int
    listed: tuple[str, ...] | None = None  # `files` as the study lists them (None: its folder)

    def carried(self) -> dict:
        """The mapping a cell carries (Cell.script): everything but the label (its framework),
        the model (its model) and the listed files (their content is in the hash)."""
        out = dataclasses.asdict(self)
        for key in ("label", "model", "listed"):
            del out[key]
        out["command"] = list(self.command)
        return out


def section(config: dict) -> dict:
    return config.get("script") or {}


def used(config: dict) -> bool:
    return SCRIPT_WORKLOAD in config.get("workloads", ())


def cell_count(config: dict) -> int:
    """How many combinations of script.axes are cells: a script's cells have its own model
    only (the product over the model axis would count the others'), exclusions not applied."""
    from dlscale.study.cell import AXES
    from dlscale.study.workloads import script_axes

    axes = script_axes(config)
    ranks = len(axes.get("ranks_per_node") or [None])
    others = [a for a in AXES if a not in ("framework", "model")]
    per_script = 1
    for axis in others:
        per_script *= len(axes[axis] or ())
    return per_script * len(axes["framework"]) * ranks


def _placeholders(item: str) -> tuple[list[str], str | None]:
    """The placeholder names in one argv item, or why it cannot be read (a conversion, a format
    spec, an attribute or index: str.format would reach into objects)."""
    names = []
    try:
        parsed = list(string.Formatter().parse(item))
    except ValueError as exc:
        return [], f"unbalanced braces ({exc}); a literal brace is written {{{{ or }}}}"
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if conversion or spec or not field.isidentifier():
            return [], (
                f"{{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
                " is not a placeholder: write {name} only"
            )
        names.append(field)
    return names, None


def command_problems(key: str, command, seq_len: int | None) -> list[str]:
    """Why an argv list cannot be a script's command: not a list of strings, shell text, a shell
    as its program, unknown placeholders, {seq_len} without a sequence length."""
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        return [
            f"{key}: must be a list of strings, the program and its arguments (argv; never a "
            'shell line), e.g. ["{python}", "{script}", "--batch-size", "{per_rank_batch}"]'
        ]
    problems = []
    if len(command) > MAX_ARGS or any(len(a) > MAX_ARG_CHARS or not a for a in command):
        problems.append(f"{key}: at most {MAX_ARGS} items of 1 to {MAX_ARG_CHARS} characters each")
    program = Path(command[0]).name
    if program in SHELLS:
        problems.append(
            f"{key}[0]: {command[0]!r} would run a shell line; the command is an argv list run "
            "without a shell: name the program itself, e.g. {python}"
        )
    for i, item in enumerate(command):
        shell = _SHELL_TEXT.search(item)
        if shell:
            problems.append(
                f"{key}[{i}]: {item[:60]!r} holds shell syntax ({shell.group(0)!r}); the command "
                "runs without a shell, so it would reach the script as literal text: write each "
                "argument as its own item, with placeholders for what varies "
                f"({', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
            )
            continue
        names, why = _placeholders(item)
        if why:
            problems.append(f"{key}[{i}]: {why}")
        for name in names:
            if name not in PLACEHOLDERS:
                problems.append(
                    f"{key}[{i}]: unknown placeholder {{{name}}}; allowed: "
                    f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                )
            elif name == "seq_len" and seq_len is None:
                problems.append(
                    f"{key}[{i}]: {{seq_len}} needs a sequence length: set script.seq_len (or "
                    "the study's seq_len)"
                )
    return problems


def files_of(script: Script, workflow_dir: str | Path) -> list[Path]:
    """The files a script's content hash covers (the script first), as read_scripts found them."""
    workflow_dir = Path(workflow_dir)
    path, _ = resolve_path("script", script.script, workflow_dir, kind="file")
    if path is None:
        return []
    if script.listed is None:
        listed = [path.parent]
    else:
        found = [resolve_path("files", f, workflow_dir, kind="any")[0] for f in script.listed]
        listed = [p for p in found if p is not None]
    return hashed_files("files", path, listed)[0]


# ---- the section as a whole ---------------------------------------------------------------
def _throughput_problems(key: str, spec: dict, launch: str) -> list[str]:
    problems = []
    has_json, has_pattern = spec.get("json") is not None, spec.get("pattern") is not None
    if has_json == has_pattern:
        problems.append(
            f"{key}: name exactly one of `json` (a JSON-lines file the script writes in its "
            f"output folder, one record per step: {JSON_RECORD}) and `pattern` (a regular "
            "expression on its standard output)"
        )
    if has_pattern:
        problem = pattern_problem(f"{key}.pattern", spec["pattern"])
        if problem:
            problems.append(problem)
        if spec.get("scope") == "rank" and launch == "torchrun":
            problems.append(
                f"{key}.scope: 'rank' reads each rank's standard output, and under launch "
                "torchrun a node's ranks share one; allowed with torchrun: global (or a `json` "
                "file per rank)"
            )
    if has_json:
        name = spec["json"]
        per_rank = isinstance(name, str) and "{rank}" in name
        bare = name.replace("{rank}", "") if isinstance(name, str) else ""
        if not bare or "/" in bare or bare.startswith(".") or "{" in bare or "}" in bare:
            problems.append(
                f"{key}.json: {name!r} must be a file name in the cell's output folder (no "
                "folder, not hidden; {rank} for one file per rank), e.g. steps.jsonl"
            )
        elif per_rank != (spec.get("scope") == "rank"):
            problems.append(
                f"{key}.json: scope {spec.get('scope')!r} reads "
                + (
                    "one file per rank: its name holds {rank}, e.g. steps-{rank}.jsonl"
                    if spec.get("scope") == "rank"
                    else "one file of the whole job: its name holds no {rank}"
                )
            )
    return problems


def read_scripts(config: dict, workflow_dir: str | Path) -> tuple[dict[str, Script], list[str]]:
    """Every script of the study, checked and hashed: ({label: Script}, problems). Nothing of a
    script runs; its files are only read."""
    from dlscale.models import names as model_names
    from dlscale.registry.frameworks import FRAMEWORKS

    workflow_dir = Path(workflow_dir)
    sec = section(config)
    scripts = sec.get("scripts") or {}
    problems, out = [], {}
    if not scripts:
        return {}, [
            "script.scripts: the workload `script` needs at least one script, e.g. "
            'script: {scripts: {my_ddp: {script: train.py, command: ["{python}", '
            '"{script}"], throughput: {pattern: "throughput: (?P<value>[0-9.]+)"}}}}'
        ]
    seq_len = sec.get("seq_len") or config.get("seq_len")
    for label, spec in scripts.items():
        key = f"script.scripts.{label}"
        if not _LABEL.fullmatch(label):
            problems.append(
                f"script.scripts: {label[:40]!r} cannot label a script (its cells' framework "
                "and a folder of their path): lower-case letters, digits and _, starting with a "
                "letter, at most 32 characters"
            )
            continue
        if label in FRAMEWORKS:
            problems.append(
                f"{key}: {label!r} is a framework of dlscale's; a script's label names its own "
                f"series: choose another (not {', '.join(FRAMEWORKS)})"
            )
        model = spec.get("model", "script")
        if not isinstance(model, str) or not _LABEL.fullmatch(model):
            problems.append(
                f"{key}.model: {str(model)[:40]!r}: lower-case letters, digits and _, starting "
                "with a letter, at most 32 characters"
            )
        elif model in model_names():
            problems.append(
                f"{key}.model: {model!r} is a model of dlscale's registry, whose facts (its "
                "parameters, FLOPs) the analysis would take for the script's; name the script's "
                "model otherwise"
            )
        launch = spec.get("launch", "ranks")
        problems += command_problems(f"{key}.command", spec.get("command"), seq_len)
        path, why = resolve_path(f"{key}.script", spec.get("script"), workflow_dir, kind="file")
        if why:
            problems.append(why)
        extra = []
        for i, f in enumerate(spec.get("files") or ()):
            resolved, why = resolve_path(f"{key}.files[{i}]", f, workflow_dir, kind="any")
            if why:
                problems.append(why)
            else:
                extra.append(resolved)
        throughput = spec.get("throughput") or {}
        problems += _throughput_problems(f"{key}.throughput", throughput, launch)
        if path is None or problems:
            continue
        files, why = hashed_files(
            f"{key}.files", path, extra if spec.get("files") is not None else [path.parent]
        )
        if why:
            problems.append(why)
            continue
        source = "json" if throughput.get("json") is not None else "pattern"
        out[label] = Script(
            label=label,
            command=tuple(spec["command"]),
            script=spec["script"],
            sha256=content_hash(path, files),
            files=len(files),
            environment=spec.get("environment", "pytorch"),
            model=model,
            launch=launch,
            source=source,
            read=throughput[source],
            unit=throughput.get("unit", "samples"),
            scope=throughput.get("scope", "global"),
            warmup=int(throughput.get("warmup", 0)),
            seed=int(sec.get("seed", 0)),
            listed=None if spec.get("files") is None else tuple(spec["files"]),
        )
    from dlscale.study.workloads import script_axes

    axes = script_axes(config)
    for i, label in enumerate(axes["framework"]):
        if label not in scripts:
            problems.append(
                f"script.axes.framework[{i}]: {label!r} is not a script of script.scripts; "
                f"allowed values: {', '.join(scripts)}"
            )
    return out, problems


def environment_framework(cell) -> str:
    """The framework whose environment a cell's ranks run in: a script cell's `environment`,
    else its framework (the capability check, the preflight and the interpreter read it)."""
    script = dict(cell.script) if getattr(cell, "script", ()) else {}
    return script.get("environment", cell.framework)


def script_columns(cell: dict, run_start: dict, throughput: float) -> dict:
    """A script cell's columns in cells.csv (dlscale.analysis.collect): the unit its
    throughput_samples_per_s is in, its content hash, its command as a template and as run, how
    the value was read and what was printed; throughput_tokens_per_s is its value where the unit
    is tokens (a script's throughput is never multiplied by a sequence length)."""
    script = cell.get("script") or {}
    ran = run_start.get("script") or {}
    unit = script.get("unit", "samples")
    out = {
        "throughput_unit": f"{unit}/s",
        "script": script.get("script"),
        "script_sha256": script.get("sha256"),
        "script_files": script.get("files"),
        "script_environment": script.get("environment"),
        "script_launch": script.get("launch"),
        "script_command": " ".join(script.get("command") or ()),
        "script_argv": " ".join(ran.get("argv") or ()),
        "script_printed": ran.get("printed"),
        "throughput_read": run_start.get("timing", {}).get("throughput"),
    }
    if unit == "tokens":
        out["throughput_tokens_per_s"] = throughput
    return out


def units_of(config: dict) -> dict[str, str]:
    """label -> the unit of its throughput (samples, tokens, images)."""
    return {
        label: ((spec or {}).get("throughput") or {}).get("unit", "samples")
        for label, spec in (section(config).get("scripts") or {}).items()
    }


def figures_in_units(layout: list[dict], units: dict[str, str]) -> list[dict]:
    """The figure layout (dlscale.outputs.figure_layout) with the throughput figures of script
    series in their unit: a page whose series are all scripts of one unit says it on its axis;
    every page with a script series names each script's unit in its caption."""
    out = []
    for spec in layout:
        frameworks = {s[0] for s in spec["series"]}
        mine = {f: units[f] for f in frameworks if f in units}
        if spec["family"] in ("throughput", "frameworks") and mine:
            spec = dict(spec)
            only = set(mine.values())
            if frameworks == set(mine) and len(only) == 1:
                spec["ylabel"] = f"Throughput ({only.pop()}/s)"
            else:
                spec["ylabel"] = "Throughput (samples/s; scripts: own unit)"
            spec["caption"] = spec["caption"].rstrip(".") + (
                "; scripts in their own unit: "
                + ", ".join(f"{f} {u}/s" for f, u in sorted(mine.items()))
                + "."
            )
        out.append(spec)
    return out


# What an edit of the script changes in its cells' identity: its content hash and file count.
EDITED = ("sha256", "files")


def split_script_edits(changed: list) -> tuple[list, list]:
    """(cells whose script's content changed and nothing else, the other changed cells) of
    dlscale.store.measurements.changed_cells' [(cell, {field: (measured, planned)})]: an edited
    script re-measures its cells without being asked (each earlier measurement stays in its
    cell's measurements/ folder); any other change stops the run as for every cell."""
    edited, rest = [], []
    for cell, diff in changed:
        old, new = diff.get("script", (None, None))
        if (
            set(diff) == {"script"}
            and isinstance(old, dict)
            and isinstance(new, dict)
            and {k for k in {*old, *new} if old.get(k) != new.get(k)} <= set(EDITED)
        ):
            edited.append((cell, diff))
        else:
            rest.append((cell, diff))
    return edited, rest


def edits_notice(edited: list) -> str:
    """The line a run prints when it re-measures the cells of edited scripts."""
    scripts = {}
    for cell, diff in edited:
        old, new = diff["script"]
        scripts.setdefault(cell.framework, (old["sha256"][:12], new["sha256"][:12], []))[2].append(
            cell.path
        )
    return "; ".join(
        f"script {label} changed (sha256 {a} -> {b}): re-measuring its {len(paths)} cell(s), "
        "each earlier measurement kept in its measurements/ folder"
        for label, (a, b, paths) in scripts.items()
    )


def environment_cells(cells: list) -> list:
    """The cells as the environment checks see them (dlscale.workflow.capability, the
    preflight): a script cell as a cell of the framework whose environment it runs in."""
    return [
        dataclasses.replace(c, framework=environment_framework(c)) if c.script else c for c in cells
    ]


def environments_of(config: dict) -> dict[str, str]:
    """label -> the framework whose environment the script runs in."""
    return {
        label: (spec or {}).get("environment", "pytorch")
        for label, spec in (section(config).get("scripts") or {}).items()
    }


def script_cells(
    config: dict,
    hardware: dict,
    axes: dict,
    shared: dict,
    reps: int,
    scripts: dict[str, Script],
    cell_environment_key,
) -> list:
    """The script workload's cells: every combination of its axes (a script with its own
    model), minus `exclude`, one per repetition. `shared`: what build_matrix gives every
    workload's cells (hardware hashes, environments, containers, common fields);
    `cell_environment_key`: dlscale.study.matrix's, passed by its caller (build_matrix)."""
    from dlscale.study.cell import AXES, Cell
    from dlscale.study.cell_fields import placement_fields
    from dlscale.study.workloads import (
        excluded,
        ranks_per_node,
        ranks_per_node_values,
        strong_global_batch,
        workload_batches,
    )

    sec = section(config)
    per_rank_setting, _ = workload_batches(config, SCRIPT_WORKLOAD)
    fixed = {
        "warmup_steps": sec.get("warmup_steps")
        if sec.get("warmup_steps") is not None
        else config["warmup_steps"],
        "steps": sec.get("steps") if sec.get("steps") is not None else config["steps"],
        "learning_rate": config["optimizer"]["learning_rate"],
        "first_step_timeout_s": config["first_step_timeout_s"],
        "workload": SCRIPT_WORKLOAD,
    }
    seq_len = sec.get("seq_len") or config.get("seq_len")
    cells = []
    for values in itertools.product(*(axes[a] for a in AXES)):
        combo = dict(zip(AXES, values))
        script = scripts[combo["framework"]]
        if combo["model"] != script.model:
            continue
        hw = hardware[combo["hardware"]]
        for rpn in ranks_per_node_values(config, hw, SCRIPT_WORKLOAD):
            if excluded({**combo, "ranks_per_node": rpn}, config["exclude"]):
                continue
            world = combo["nodes"] * rpn
            if combo["policy"] == "weak":
                per_rank, global_batch = per_rank_setting, per_rank_setting * world
            else:
                global_batch = strong_global_batch(config, hw, SCRIPT_WORKLOAD)
                per_rank = global_batch // world
            env_key = cell_environment_key({**combo, "framework": script.environment}, hw)
            extra = {"ranks_in_path": True} if rpn != ranks_per_node(config, hw) else {}
            cells += [
                Cell(
                    **combo,
                    rep=rep,
                    **placement_fields(
                        combo["hardware"], hw, shared, env_key, rpn, per_rank, global_batch
                    ),
                    seq_len=seq_len,
                    script=script.carried(),
                    **fixed,
                    **shared["common"],
                    **extra,
                )
                for rep in range(1, reps + 1)
            ]
    return cells
