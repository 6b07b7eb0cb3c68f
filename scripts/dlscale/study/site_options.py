"""hardware.yaml `sbatch_options` and `srun_options`: the Slurm options a site needs that the
hardware schema does not name (`--switches=1@10:00`, `--network=...`, `--hint=nomultithread`,
`--distribution=block:block`, `--licenses=...`, `--mpi=pmix`, ...), checked token by token
before any job, with the rule each one breaks:

- a token is made of letters, digits and `_ . , : = @ / + % -` only: no shell metacharacter,
  quote, backslash, glob character, space or control character (SAFE_CHARACTER);
- every token is an option (`--name`, `--name=value`, `-x`, `-xVALUE`) or the value of the
  option before it: `--switches 1` becomes `--switches=1`, `-w n1` becomes `--nodelist=n1`; a
  bare word with no option to take it is refused, and so is a value after an option that takes
  none (FLAGS: Slurm would read the word as the job's script or the step's program);
- the options the project sets itself are refused with the key or mechanism that owns them
  (SBATCH_OWNED, SRUN_OWNED; on a cuda entry also BINDING_OWNED), under any abbreviation Slurm
  accepts (getopt_long takes an unambiguous prefix: `--node=2` may mean `--nodes=2`): a name
  that is a prefix of an owned option is refused too. Every option the Slurm executor plugin
  refuses in `slurm_extra` (snakemake-executor-plugin-slurm `validate_slurm_extra`) is in
  SBATCH_OWNED, and a token that would match one of its patterns all the same (a value with
  `-J` in it) is refused here first (plugin_problems).

Options dlscale leaves to the site (its business, and hashed with the entry): placement
(`--nodelist`, `--exclude`, `--switches`, `--contiguous`, `--distribution`), binding on CPU
entries (`--cpu-bind`, `--hint`, `--mem-bind`, `--ntasks-per-core`, `--ntasks-per-socket`),
node selection (`--sockets-per-node`, `--threads-per-core`, `--mincpus`, `--tmp`), the network,
licences, MPI type, frequencies, signals, mail and scheduling priority, and any option of a
site's SPANK plugin that does not start with `container`.
"""

from __future__ import annotations

import re
import shlex

SBATCH_KEY = "sbatch_options"
SRUN_KEY = "srun_options"
KEYS = (SBATCH_KEY, SRUN_KEY)

# What a token may be made of: enough for Slurm's values (1@10:00, block:cyclic, map_cpu:0,1,
# fluent:2, user@site.org, B:USR1@60), nothing a shell, a glob or a log line reads specially.
SAFE_CHARACTER = re.compile(r"[A-Za-z0-9_.,:=@/+%-]")
ALLOWED_TEXT = "letters, digits and _ . , : = @ / + % -"
# How a refused character is named in a message.
CHARACTER_NAMES = {
    ";": "a command separator",
    "&": "a shell operator",
    "|": "a pipe",
    "$": "a variable or command substitution",
    "`": "a command substitution",
    "<": "a redirection",
    ">": "a redirection",
    "(": "a subshell",
    ")": "a subshell",
    "{": "a brace expansion",
    "}": "a brace expansion",
    "'": "a quote",
    '"': "a quote",
    "\\": "a backslash",
    "*": "a glob",
    "?": "a glob",
    "[": "a glob: write a host list as names, n01,n02",
    "]": "a glob: write a host list as names, n01,n02",
    "~": "a home-folder expansion",
    "!": "a history expansion",
    "#": "a comment",
    " ": "a space: one list item is one token",
}

# ---- what the project sets itself: long option -> the key or mechanism that owns it
_GPUS = "keys gpus_per_node, gpu_request, gpu_type and gpu_binding (the GPU request)"
_MEMORY = "key mem_mb_per_rank (memory per node: ranks per node x mem_mb_per_rank)"
_TIME = "key runtime_min (a retried cell gets twice the time)"
_CONTAINER = "key container (the ranks' container: its engine, image and mounts)"
# Both commands: the cell's geometry and resources (dlscale.study.resources.class_resources,
# dlscale.run.launchers.srun.start_srun) and the entry's scheduling keys.
_BOTH_OWNED = {
    "nodes": "the cell's node count (config axes.nodes)",
    "ntasks": "the cell's ranks (nodes x ranks per node)",
    "ntasks-per-node": "the cell's ranks per node (config axes.ranks_per_node; one per GPU on "
    "GPU hardware)",
    "ntasks-per-gpu": "the cell's ranks per node: one rank per GPU (key gpus_per_node)",
    "cpus-per-task": "key cpus_per_rank",
    "cpus-per-gpu": "key cpus_per_rank",
    "overcommit": "key cpus_per_rank (it would give the ranks fewer cores than they ask for)",
    "gpus": _GPUS,
    "gpus-per-node": _GPUS,
    "gpus-per-task": _GPUS,
    "gpus-per-socket": _GPUS,
    "gres": _GPUS,
    "tres-per-task": "keys cpus_per_rank and gpus_per_node",
    "mem": _MEMORY,
    "mem-per-cpu": _MEMORY,
    "mem-per-gpu": _MEMORY,
    "time": _TIME,
    "time-min": _TIME,
    "partition": "key partition",
    "account": "key account",
    "qos": "key qos",
    "reservation": "key reservation",
    "constraint": "key constraint",
    "exclusive": "key exclusive (whole nodes for the cell)",
    "oversubscribe": "key exclusive (whether the cell shares its nodes' cores with other jobs)",
    "container": _CONTAINER,
    "container-image": _CONTAINER,
    "container-mounts": _CONTAINER,
    "clusters": "the cluster the executor plugin submits to (its `clusters` resource)",
    "help": "it prints and exits: no job would run",
    "usage": "it prints and exits: no job would run",
    "version": "it prints and exits: no job would run",
    "test-only": "it only tests: no job would run",
}
_PLUGIN = "the Slurm executor plugin sets it for every cell job"
SBATCH_OWNED = {
    **_BOTH_OWNED,
    "job-name": _PLUGIN,
    "output": "the executor plugin's job log (results/logs/slurm/)",
    "error": "the executor plugin's job log (results/logs/slurm/)",
    "parsable": "the executor plugin reads sbatch's answer",
    "comment": _PLUGIN + " (the rule and its wildcards)",
    "export": _PLUGIN + " (--export=ALL): the ranks' variables are the entry's key env",
    "export-file": "the executor plugin exports ALL: the ranks' variables are the entry's key env",
    "get-user-env": "the job's environment is the entry's keys modules and env",
    "chdir": _PLUGIN + " (-D, the workflow's folder)",
    "workdir": _PLUGIN + " (-D, the workflow's folder)",
    "array": "the executor plugin's job arrays (one task per cell)",
    "dependency": "Snakemake orders the jobs (and the preflight's afterok)",
    "wrap": "the executor plugin's job script",
    "hold": "Snakemake submits each job to run: a held job never starts",
    "wait": "the executor plugin submits and polls: sbatch would not return",
    "requeue": "the executor plugin's requeue setting (profile: slurm-requeue)",
    "no-requeue": "the executor plugin's requeue setting (profile: slurm-requeue)",
}
_LOGS = "the launcher's rank logs (rank%t.log, which the diagnosis reads)"
_STEP = "the launcher's step for the ranks"
SRUN_OWNED = {
    **_BOTH_OWNED,
    "output": _LOGS,
    "error": _LOGS,
    "label": _LOGS,
    "pty": _LOGS,
    "overlap": _STEP + " (it shares the executor plugin's step: --overlap)",
    "kill-on-bad-exit": _STEP + " (one failed rank ends the cell: --kill-on-bad-exit=1)",
    "export": "the launcher passes the ranks' environment (the entry's keys modules and env)",
    "preserve-env": _STEP + " (it states the node and task counts)",
    "chdir": _STEP + " (the ranks run in the cell's job folder)",
    "jobid": _STEP + " (it runs in the cell's own job)",
    "het-group": _STEP + " (it runs in the cell's own job)",
    "relative": _STEP + " (it runs on all of the cell's nodes)",
    "no-allocate": _STEP + " (it runs in the cell's own job)",
    "multi-prog": "the launcher runs the ranks' program (dlscale.run.train)",
}
# On a cuda entry, how the ranks are bound to GPUs and cores is key gpu_binding's; on a CPU
# entry, the site's (srun_options: --cpu-bind=cores, ...).
_BINDING = "key gpu_binding (the launcher binds a cuda cell's ranks to GPUs and cores)"
BINDING_OWNED = {"gpu-bind": _BINDING, "cpu-bind": _BINDING, "tres-bind": _BINDING}
# srun refuses these beside --cpu-bind (Slurm 22.05 srun(1): mutually exclusive), which
# gpu_binding closest and the maps state: refused in srun_options of such an entry only
# (node and task state no --cpu-bind; the ranks' srun drops an inherited SLURM_HINT).
CPU_BIND_EXCLUSIVE = {
    name: _BINDING + ": srun refuses it beside the --cpu-bind that closest and maps state"
    for name in ("hint", "threads-per-core", "ntasks-per-core")
}
# Option families owned whole: pyxis's (and enroot's) --container-*, --no-container-*.
OWNED_FAMILIES = {"container": _CONTAINER, "no-container": _CONTAINER}

# Long options that take no value: a word after one would be Slurm's script or program.
_BOTH_FLAGS = {
    "contiguous",
    "hold",
    "overcommit",
    "oversubscribe",
    "quiet",
    "reboot",
    "spread-job",
    "test-only",
    "use-min-nodes",
    "verbose",
    "help",
    "usage",
    "version",
}
FLAGS = {
    SBATCH_KEY: _BOTH_FLAGS | {"ignore-pbs", "parsable", "requeue", "no-requeue", "wait"},
    SRUN_KEY: _BOTH_FLAGS
    | {
        "disable-status",
        "exact",
        "label",
        "multi-prog",
        "no-allocate",
        "overlap",
        "preserve-env",
        "pty",
        "quit-on-interrupt",
        "resv-ports",
        "unbuffered",
    },
}

# Short options: letter -> (long name, takes a value). A short option that takes none is a
# flag; one that takes a value has it attached (-wn1) or as the next token (-w n1).
_BOTH_SHORT = {
    "A": ("account", True),
    "b": ("begin", True),
    "B": ("extra-node-info", True),
    "c": ("cpus-per-task", True),
    "C": ("constraint", True),
    "d": ("dependency", True),
    "D": ("chdir", True),
    "e": ("error", True),
    "G": ("gpus", True),
    "H": ("hold", False),
    "h": ("help", False),
    "i": ("input", True),
    "J": ("job-name", True),
    "k": ("no-kill", False),
    "L": ("licenses", True),
    "M": ("clusters", True),
    "m": ("distribution", True),
    "n": ("ntasks", True),
    "N": ("nodes", True),
    "o": ("output", True),
    "O": ("overcommit", False),
    "p": ("partition", True),
    "q": ("qos", True),
    "Q": ("quiet", False),
    "s": ("oversubscribe", False),
    "S": ("core-spec", True),
    "t": ("time", True),
    "V": ("version", False),
    "v": ("verbose", False),
    "w": ("nodelist", True),
    "x": ("exclude", True),
}
SHORT = {
    SBATCH_KEY: {
        **_BOTH_SHORT,
        "a": ("array", True),
        "F": ("nodefile", True),
        "W": ("wait", False),
    },
    SRUN_KEY: {
        **_BOTH_SHORT,
        "E": ("preserve-env", False),
        "I": ("immediate", False),
        "K": ("kill-on-bad-exit", False),
        "l": ("label", False),
        "r": ("relative", True),
        "T": ("threads", True),
        "u": ("unbuffered", False),
        "W": ("wait", True),
        "X": ("disable-status", False),
        "Z": ("no-allocate", False),
    },
}
LONG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
RULE = (
    "every token is an option (--name, --name=value, -x, -xVALUE) or the value of the option "
    "before it"
)


def owned_options(option_key: str, device: str) -> dict[str, str]:
    """The long options the project owns on `option_key`'s command, for an entry's device."""
    owned = dict(SBATCH_OWNED if option_key == SBATCH_KEY else SRUN_OWNED)
    if device == "cuda":
        owned.update(BINDING_OWNED)
    return owned


def owner(name: str, owned: dict[str, str]) -> tuple[str, str] | None:
    """(the owned option, its owner) that long option `name` is or may abbreviate (Slurm's
    getopt_long accepts an unambiguous prefix), or None."""
    if name in owned:
        return name, owned[name]
    for full, why in owned.items():
        if full.startswith(name):
            return full, why
    for family, why in OWNED_FAMILIES.items():
        if name.startswith(family):
            return name, why
    return None


def character_name(char: str) -> str:
    """What a refused character is, for a message."""
    if char in CHARACTER_NAMES:
        return CHARACTER_NAMES[char]
    return "a control character" if ord(char) < 32 or ord(char) == 127 else "not allowed"


def character_problem(token: str) -> str | None:
    """Why `token` holds a character no site option may hold, naming it, or None."""
    bad = next((c for c in token if not SAFE_CHARACTER.fullmatch(c)), None)
    if bad is None:
        return None
    return (
        f"{bad!r} ({character_name(bad)}) in token {token!r}: a token may hold {ALLOWED_TEXT} "
        "only (no shell, glob or control characters)"
    )


def split_options(value) -> tuple[list[str], list[str]]:
    """(tokens, problems) of an `sbatch_options`/`srun_options` value: a list is its tokens; a
    string is split as a shell splits a command line (shlex.split), after every character but
    the spaces between tokens is checked, so quotes, backslashes, tabs and line breaks are
    refused and what stands between spaces is a token."""
    if not isinstance(value, str):
        return [str(token) for token in value], []
    for word in value.split(" "):
        why = character_problem(word)
        if why:
            return [], [why]
    return shlex.split(value), []


def check_options(
    value, option_key: str, device: str, binds_cpus: bool = False
) -> tuple[list[str], list[str]]:
    """(normalised tokens, problems) of an entry's `sbatch_options` or `srun_options`
    (`option_key`) on a hardware entry of `device`: see the module's rules. The tokens are what
    the job or step gets: `--name value` joined as `--name=value`, short options in their long
    form (`-w n1` -> `--nodelist=n1`). `binds_cpus`: the entry's gpu_binding states a
    --cpu-bind in the ranks' srun (closest, maps), beside which srun refuses CPU_BIND_EXCLUSIVE."""
    tokens, problems = split_options(value)
    owned, short = owned_options(option_key, device), SHORT[option_key]
    if binds_cpus and option_key == SRUN_KEY:
        owned.update(CPU_BIND_EXCLUSIVE)
    out: list[str] = []
    waiting = False  # the last option may take the next word as its value
    needs_value = False  # ... and must (a short option whose value is the next token)
    for token in tokens:
        why = character_problem(token)
        if why is None and token in ("-", "--"):
            why = (
                f"{token!r} ends the options: what follows would be the job's script or the "
                "step's program"
            )
        elif why is None and not token.startswith("-"):  # a bare word: the value before?
            if waiting:
                out[-1] = f"{out[-1]}={token}"
                waiting = needs_value = False
                continue
            why = _bare_word(token, out)
        elif why is None:
            if needs_value:
                problems.append(f"{out[-1]!r} needs a value (--name=value)")
            option, waiting, needs_value, why = parse_option(token, owned, short, option_key)
            if why is None:
                out.append(option)
                continue
        problems.append(why)
        waiting = needs_value = False
    if needs_value:
        problems.append(f"{out[-1]!r} needs a value (--name=value)")
    problems += [f"{o!r}: {o.partition('=')[0]} has an empty value" for o in out if o[-1] == "="]
    if option_key == SBATCH_KEY and not problems:
        problems += plugin_problems(out)
    return out, problems


def parse_option(token: str, owned: dict, short: dict, option_key: str):
    """(the option in its long form, whether it may take the next word as its value, whether it
    must, None) of one token starting with `-`; (None, False, False, why) where it is refused."""
    refused = None, False, False
    if token.startswith("--"):
        name, has_value, _ = token[2:].partition("=")
        flag = name in FLAGS[option_key]
        if not LONG_NAME.fullmatch(name):
            return *refused, f"{token!r} is not an option ({RULE})"
        hit = owner(name, owned)
        if hit:
            said = f"--{name}" if hit[0] == name else f"--{name} (an abbreviation of --{hit[0]})"
            return *refused, f"{token!r} is refused: {said} is dlscale's: {hit[1]}"
        if has_value and flag:
            return *refused, f"{token!r}: --{name} takes no value"
        return token, not (has_value or flag), False, None
    letter, value = token[1], token[2:]
    if letter not in short:
        command = option_key.split("_")[0]
        return *refused, (
            f"{token!r}: -{letter} is not a short option of {command} that dlscale knows; write "
            "its long form (--name=value)"
        )
    name, takes_value = short[letter]
    hit = owner(name, owned)
    if hit:
        return *refused, f"{token!r} is refused: -{letter} is --{name}, dlscale's: {hit[1]}"
    if not takes_value and value:
        return *refused, (
            f"{token!r}: -{letter} (--{name}) takes no value; write each short option as a "
            "token of its own"
        )
    if not takes_value:
        return f"--{name}", False, False, None
    return (f"--{name}={value}", False, False, None) if value else (f"--{name}", True, True, None)


def _bare_word(token: str, out: list[str]) -> str:
    after = f" after {out[-1]!r}, which has its value or takes none" if out else ""
    return f"{token!r} is a bare word{after}: {RULE} (--switches 1 is --switches=1)"


def plugin_problems(tokens: list[str]) -> list[str]:
    """Tokens the Slurm executor plugin would refuse in the cell job's `slurm_extra` although
    they pass the checks above (its patterns search the whole text: `-J` anywhere, a value that
    ends in `-o` before a space), found with the plugin's own patterns, so a job is never
    refused at submission. Nothing where the plugin is not installed (no Slurm route)."""
    try:
        from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options
    except ImportError:
        return []
    problems = []
    for token in tokens:
        text = f"{shlex.quote(token)} "  # as slurm_extra has it: followed by another argument
        for pattern, what in get_forbidden_slurm_options().items():
            if re.search(pattern, text):
                problems.append(
                    f"{token!r}: the Slurm executor plugin reads it as its own {what} option "
                    f"(its pattern {pattern!r} matches) and would refuse the job; rewrite the "
                    "value"
                )
    return problems
