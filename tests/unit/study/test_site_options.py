"""hardware.yaml `sbatch_options` and `srun_options` (dlscale.study.site_options): every token is
checked before any job, with a hostile case per rule; the tokens reach the cell job's
slurm_extra, the preflight's sbatch and the ranks' srun; an entry without them keeps its cells."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from dlscale.run.launchers import srun as srun_launcher
from dlscale.study import site_options
from dlscale.study.cell import Cell
from dlscale.study.config import ConfigError, load_schema
from dlscale.study.hardware import validate_hardware
from dlscale.study.matrix import load_study
from dlscale.study.resources import class_resources, preflight_sbatch_args, slurm_extra

from helpers.cells import cell_dict, plugin_sbatch
from helpers.recording_srun import recorded, recording_srun

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = load_schema(ROOT / "config" / "schemas" / "hardware.schema.json")
CUDA = {"device": "cuda", "gpus_per_node": 4}
CPU = {"device": "cpu"}


def validated(option_key: str, value, base: dict = CPU) -> list[str]:
    """The normalised tokens of one option key on an entry `x`."""
    return validate_hardware({"x": {**base, option_key: value}}, SCHEMA)["x"][option_key]


def refusal(option_key: str, value, base: dict = CPU) -> str:
    with pytest.raises(ConfigError) as info:
        validate_hardware({"x": {**base, option_key: value}}, SCHEMA)
    return str(info.value)


BOTH = pytest.mark.parametrize("option_key", site_options.KEYS)


# ---- rule 1: no shell, glob or control character -------------------------------------------
@BOTH
@pytest.mark.parametrize("char", list(";&|$`<>(){}'\"\\*?[]~!# "))
def test_a_shell_or_glob_character_is_refused_naming_it_and_its_token(option_key, char):
    token = f"--network=a{char}b"
    message = refusal(option_key, [token])
    assert f"x.{option_key}: {char!r}" in message and repr(token) in message, message


@BOTH
@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x00", "\x1b", "\x7f"])
def test_a_control_character_is_refused_in_a_string_and_in_a_list(option_key, char):
    # a line break in a string is not a token boundary: `--hint=x\n--nodes=2` is one token
    for value in (f"--hint=x{char}--nodes=2", [f"--hint=x{char}"]):
        message = refusal(option_key, value)
        assert f"{char!r} (a control character)" in message, message


@BOTH
def test_quotes_in_a_string_are_refused_not_interpreted(option_key):
    for value in ("--network='a b'", '--comment="x"', r"--network=a\ b"):
        assert "x." + option_key in refusal(option_key, value)


# ---- rule 2: every token is an option or its value ------------------------------------------
@BOTH
@pytest.mark.parametrize(
    "value, word",
    [
        ("nomultithread", "nomultithread"),  # nothing before it
        ("--hint=nomultithread extra", "extra"),  # the option before has its value
        ("--contiguous extra", "extra"),  # the option before takes none
        ("--switches 1 2", "2"),  # one value per option
    ],
)
def test_a_bare_word_with_nothing_to_attach_to_is_refused(option_key, value, word):
    message = refusal(option_key, value)
    assert f"x.{option_key}: {word!r} is a bare word" in message, message


@BOTH
def test_an_end_of_options_marker_a_bundle_or_a_missing_value_is_refused(option_key):
    assert "ends the options" in refusal(option_key, "--hint=x -- --nodes=2")
    assert "takes no value" in refusal(option_key, "-vN2")  # -v -N 2: a bundle hiding -N
    assert "needs a value" in refusal(option_key, "-w")
    assert "needs a value" in refusal(option_key, "-w --hint=x")
    assert "empty value" in refusal(option_key, "--hint=")
    assert "not a short option" in refusal(option_key, "-5")
    assert "is not an option" in refusal(option_key, "---hint")
    assert "takes no value" in refusal(option_key, "--contiguous=yes")


@BOTH
def test_an_option_and_its_value_are_joined_and_a_string_splits_as_a_list(option_key):
    as_list = ["--switches", "1@10:00", "--hint=nomultithread", "-w", "n1", "-xn2"]
    expected = ["--switches=1@10:00", "--hint=nomultithread", "--nodelist=n1", "--exclude=n2"]
    assert validated(option_key, as_list) == expected
    assert validated(option_key, "--switches 1@10:00  --hint=nomultithread -w n1 -xn2") == expected
    assert validated(option_key, "--propagate NONE --contiguous") == [
        "--propagate=NONE",
        "--contiguous",
    ]
    assert validated(option_key, "") == [] == validated(option_key, [])
    assert validate_hardware({"x": CPU}, SCHEMA)["x"][option_key] == []  # the default


def test_the_sites_usual_options_pass_on_both_commands():
    sbatch = (
        "--switches=1@10:00 --network=sn_all --hint=nomultithread --licenses=fluent:2,matlab "
        "--mail-type=FAIL --mail-user=me@site.org --signal=B:USR1@60 --nodelist=n01,n02 "
        "--exclude=n03 --distribution=block:block --ntasks-per-core=1 --gres-flags=enforce-binding"
    )
    assert validated("sbatch_options", sbatch, CUDA) == sbatch.split()
    srun = "--distribution=block:block --mpi=pmix_v4 --hint=nomultithread --cpu-freq=high"
    assert validated("srun_options", srun, CUDA) == srun.split()
    # binding on a CPU entry is the site's: dlscale's gpu_binding owns it on cuda entries
    assert validated("srun_options", "--cpu-bind=cores") == ["--cpu-bind=cores"]
    assert "key gpu_binding" in refusal("srun_options", "--cpu-bind=cores", CUDA)
    assert "key gpu_binding" in refusal("sbatch_options", "--gpu-bind=closest", CUDA)


# ---- rule 3: the options dlscale owns, in every form Slurm accepts ---------------------------
# (option, short letter or None, a word of its owner's message, commands: both unless named)
OWNED = [
    ("nodes", "N", "axes.nodes", site_options.KEYS),
    ("ntasks", "n", "ranks", site_options.KEYS),
    ("ntasks-per-node", None, "ranks per node", site_options.KEYS),
    ("cpus-per-task", "c", "key cpus_per_rank", site_options.KEYS),
    ("gpus", "G", "gpus_per_node", site_options.KEYS),
    ("gpus-per-node", None, "gpus_per_node", site_options.KEYS),
    ("gpus-per-task", None, "gpus_per_node", site_options.KEYS),
    ("gres", None, "gpus_per_node", site_options.KEYS),
    ("mem", None, "key mem_mb_per_rank", site_options.KEYS),
    ("mem-per-cpu", None, "key mem_mb_per_rank", site_options.KEYS),
    ("mem-per-gpu", None, "key mem_mb_per_rank", site_options.KEYS),
    ("time", "t", "key runtime_min", site_options.KEYS),
    ("output", "o", "log", site_options.KEYS),
    ("error", "e", "log", site_options.KEYS),
    ("partition", "p", "key partition", site_options.KEYS),
    ("account", "A", "key account", site_options.KEYS),
    ("qos", "q", "key qos", site_options.KEYS),
    ("reservation", None, "key reservation", site_options.KEYS),
    ("constraint", "C", "key constraint", site_options.KEYS),
    ("exclusive", None, "key exclusive", site_options.KEYS),
    ("array", "a", "job arrays", ("sbatch_options",)),
    ("job-name", "J", "executor plugin", ("sbatch_options",)),
    ("dependency", "d", "Snakemake", ("sbatch_options",)),
    ("chdir", "D", "executor plugin", ("sbatch_options",)),
    ("chdir", "D", "job folder", ("srun_options",)),
    ("wrap", None, "job script", ("sbatch_options",)),
    ("export", None, "env", site_options.KEYS),
    ("overlap", None, "executor plugin's step", ("srun_options",)),
    ("kill-on-bad-exit", "K", "failed rank", ("srun_options",)),
    ("container-image", None, "key container", site_options.KEYS),
    ("container-mounts", None, "key container", site_options.KEYS),
    ("container-workdir", None, "key container", site_options.KEYS),  # pyxis: the family
    ("cpus-per-gpu", None, "key cpus_per_rank", site_options.KEYS),
    ("ntasks-per-gpu", None, "one rank per GPU", site_options.KEYS),
    ("overcommit", "O", "key cpus_per_rank", site_options.KEYS),
    ("oversubscribe", "s", "key exclusive", site_options.KEYS),
]
OWNED_CASES = [
    pytest.param(option_key, name, letter, owner, id=f"{option_key}-{name}")
    for name, letter, owner, keys in OWNED
    for option_key in keys
]


@pytest.mark.parametrize("option_key, name, letter, owner", OWNED_CASES)
def test_an_owned_option_is_refused_long_short_and_abbreviated(option_key, name, letter, owner):
    flag = name in site_options.FLAGS[option_key]
    long = f"--{name}" if flag else f"--{name}=1"
    message = refusal(option_key, long, CUDA)
    assert f"x.{option_key}: {long!r} is refused: --{name} is dlscale's" in message, message
    assert owner in message, message
    if not flag:
        assert f"--{name} is dlscale's" in refusal(option_key, [f"--{name}", "1"], CUDA)
    if letter:
        short = f"-{letter}" if flag else f"-{letter}1"
        message = refusal(option_key, short, CUDA)
        assert f"-{letter} is --{name}, dlscale's" in message, message
    if name not in site_options.owned_options(option_key, "cuda"):
        return  # a member of an owned family (--container-*), refused by its start
    abbreviation = name[:-1]  # getopt_long takes any unambiguous prefix
    message = refusal(option_key, f"--{abbreviation}=1", CUDA)
    assert f"--{abbreviation} (an abbreviation of --" in message, message


def test_the_briefs_abbreviations_are_refused():
    assert "an abbreviation of --nodes" in refusal("sbatch_options", "--node=2")
    assert "an abbreviation of --ntasks-per-node" in refusal("srun_options", "--ntasks-per-n=1")
    assert "an abbreviation of --exclusive" in refusal("sbatch_options", "--exclu")


def _plugin_refused_options() -> list[str]:
    """Every option the installed Slurm executor plugin refuses in slurm_extra, long and short,
    read from its own patterns (snakemake-executor-plugin-slurm validate_slurm_extra)."""
    from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

    found = []
    for pattern in get_forbidden_slurm_options():
        found += [f"--{name}=1" for name in re.findall(r"--([a-z-]+)", pattern)]
        found += [f"-{letter}1" for letter in re.findall(r"(?<![a-z-])-([A-Za-z])\\s", pattern)]
    return found


@pytest.mark.parametrize("token", _plugin_refused_options())
def test_every_option_the_plugin_refuses_is_refused_first_with_dlscales_message(token):
    if token == "--parsable=1":
        token = "--parsable"
    message = refusal("sbatch_options", token)
    assert "dlscale's" in message and "executor plugin reads it" not in message, message


def test_a_value_the_plugins_patterns_would_catch_is_refused_before_submission():
    """The plugin searches the whole slurm_extra (`-J` anywhere, `-o` before a space): a value
    that passes dlscale's own rules but would match is refused here, not at submission."""
    for value in ("--licenses=a-Jb", "--network=x-o --hint=nomultithread"):
        message = refusal("sbatch_options", value)
        assert "the Slurm executor plugin reads it as its own" in message, message


# Every long option of sbatch and srun (Slurm 22.05's --help and its affinity options): what
# dlscale does not own passes, so no owned name is a prefix of a legitimate one.
SLURM_OPTIONS = """
account acctg-freq array batch bb bbf bcast bcast-exclude begin chdir cluster-constraint
clusters comment compress container container-id contiguous core-spec cores-per-socket cpu-bind
cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot dependency disable-status distribution
epilog error exact exclude exclusive export export-file extra-node-info get-user-env gid gpu-bind
gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags het-group hint hold
ignore-pbs immediate input jobid job-name kill-on-bad-exit kill-on-invalid-dep label licenses
mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus mpi multi-prog network
nice no-allocate no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
ntasks-per-node ntasks-per-socket open-mode output overcommit overlap oversubscribe parsable
partition power prefer preserve-env priority profile prolog propagate pty qos quiet
quit-on-interrupt reboot relative requeue reservation resv-ports send-libs signal slurmd-debug
sockets-per-node spread-job switches task-epilog task-prolog test-only thread-spec threads
threads-per-core time time-min tmp tres-bind tres-per-task uid unbuffered usage use-min-nodes
verbose version wait wait-all-nodes wckey wrap
""".split()


@BOTH
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_slurm_option_dlscale_does_not_own_passes(option_key, device):
    owned = site_options.owned_options(option_key, device)
    free = [
        name
        for name in SLURM_OPTIONS
        if name not in owned and not name.startswith(tuple(site_options.OWNED_FAMILIES))
    ]
    tokens = [f"--{n}" if n in site_options.FLAGS[option_key] else f"--{n}=1" for n in free]
    _, problems = site_options.check_options(tokens, option_key, device)
    assert problems == []


def test_the_schema_names_every_option_it_refuses():
    """The configuration reference (generated from the schema) lists what each key refuses:
    the tables in dlscale.study.site_options, which the checks read."""
    properties = SCHEMA["additionalProperties"]["properties"]
    for option_key, owned in (
        ("sbatch_options", site_options.SBATCH_OWNED),
        ("srun_options", site_options.SRUN_OWNED),
    ):
        text = properties[option_key]["description"]
        names = [*owned, *site_options.BINDING_OWNED]
        assert [n for n in names if not re.search(rf"[ ,]{re.escape(n)}[,.: ]", text)] == []
        assert "x-dlscale-allowed" in properties[option_key]


def test_a_wrong_type_is_the_schemas_to_say():
    message = refusal("srun_options", 3)
    assert "x.srun_options" in message and "must be" in message
    message = refusal("srun_options", ["--hint=x", 3])
    assert "x.srun_options[1]" in message and "must be" in message


# ---- where they go ---------------------------------------------------------------------------
SITE = {
    "sbatch_options": "--switches 1@10:00 --licenses=fluent:2",
    "srun_options": ["--distribution=block:block", "--mpi", "pmix"],
}
SBATCH_TOKENS = ["--switches=1@10:00", "--licenses=fluent:2"]
SRUN_TOKENS = ["--distribution=block:block", "--mpi=pmix"]


def _hardware(entry: str = "h100", **extra) -> dict:
    entries = yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text())
    entries[entry].update(extra)
    return validate_hardware(entries, SCHEMA)


def test_sbatch_options_reach_the_cell_jobs_slurm_extra_quoted_and_pass_the_plugin():
    hw = _hardware(**SITE)["h100"]
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    threads, res = class_resources(config, hw, 2)
    assert res["slurm_extra"] == slurm_extra(hw, hw["gpus_per_node"])
    assert shlex.split(res["slurm_extra"]) == [
        *SBATCH_TOKENS,
        "--ntasks-per-node=4",
        "--gpus-per-node=h100:4",
        "--exclusive",
    ]
    argv = shlex.split(plugin_sbatch(res, threads))  # the plugin's own check and command line
    assert all(token in argv for token in SBATCH_TOKENS)
    # a token is one shell word whatever it holds: quoted by shlex.join
    odd = dict(hw, sbatch_options=["--comment-like=a;b"])  # (never validated: quoting alone)
    assert shlex.split(slurm_extra(odd, 1))[0] == "--comment-like=a;b"


def test_sbatch_options_reach_the_preflight_job():
    hw = _hardware(**SITE)["h100"]
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    args = preflight_sbatch_args(config, hw, 1, 4, 5)
    assert args[-5:-3] == SBATCH_TOKENS and "--time=5" in args and "--nodes=1" in args


def test_srun_options_lead_the_ranks_srun_command():
    cell = Cell.from_dict(cell_dict(launcher="srun", srun_options=SRUN_TOKENS))
    cmd = srun_launcher.srun_command(cell, ["python", "-m", "dlscale.run.train"], Path("/r"), True)
    assert cmd[:4] == ["srun", *SRUN_TOKENS, "--overlap"]
    assert cmd[4:8] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=1"]
    plain = Cell.from_dict(cell_dict(launcher="srun"))
    assert srun_launcher.srun_command(plain, ["x"], Path("/r"))[:2] == ["srun", "--nodes=2"]


def test_start_srun_runs_the_srun_that_carries_them(tmp_path, monkeypatch):
    """The production start_srun, with a recording `srun` on PATH: the options are in the
    command it ran, before the launcher's own."""
    record = recording_srun(tmp_path, monkeypatch)
    cell = Cell.from_dict(cell_dict(launcher="srun", srun_options=SRUN_TOKENS))
    ((_, proc),) = srun_launcher.start_srun(cell, ["true"], tmp_path)
    assert proc.wait() == 0
    argv = recorded(record)["argv"]
    assert argv[:3] == [*SRUN_TOKENS, "--nodes=2"] and argv[-1] == "true"


# ---- identity ----------------------------------------------------------------------------------
def test_the_options_reach_the_cells_and_their_identity_only_when_set(tmp_path):
    """At their defaults (absent, "", []) every hash and every cell's JSON are as without the
    keys; set, the entry's hardware hash changes and its cells carry the srun options (a list in
    their JSON, read back equal)."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["axes"]["hardware"] = ["cpu", "h100"]
    site = tmp_path / "site.yaml"
    config["hardware_file"] = str(site)
    entries = yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text())

    def study_with(**extra):
        changed = copy.deepcopy(entries)
        changed["h100"].update(extra)
        site.write_text(yaml.safe_dump(changed))
        return load_study(copy.deepcopy(config), ROOT)

    before = study_with()
    for empty in ("", []):
        same = study_with(sbatch_options=empty, srun_options=empty)
        assert same.config_hash == before.config_hash
        assert [c.to_json() for c in same.cells] == [c.to_json() for c in before.cells]
    after = study_with(**SITE)
    assert after.config_hash != before.config_hash
    for old, new in zip(before.cells, after.cells, strict=True):
        assert new.path == old.path
        if new.hardware == "cpu":
            assert new.to_json() == old.to_json()
            continue
        assert new.hardware_hash != old.hardware_hash and new.config_hash != old.config_hash
        assert new.srun_options == tuple(SRUN_TOKENS)
        assert json.loads(new.to_json())["srun_options"] == SRUN_TOKENS
        assert Cell.from_json(new.to_json()) == new
        assert json.loads(json.dumps(new.identity())) == new.identity()
    # the same options as a string or as a list: the same tokens, the same identity
    as_list = study_with(sbatch_options=SBATCH_TOKENS, srun_options=" ".join(SRUN_TOKENS))
    assert as_list.config_hash == after.config_hash


def test_a_cell_takes_srun_options_as_a_list_only():
    with pytest.raises(TypeError, match="srun_options"):
        Cell.from_dict(cell_dict(srun_options="--mpi=pmix"))
    assert "srun_options" not in json.loads(Cell.from_dict(cell_dict()).to_json())


def test_the_commented_example_in_the_shipped_hardware_file_passes():
    """config/hardware.yaml's h100 entry shows both keys commented out (nothing measured
    changes); uncommented, they pass the checks as written."""
    text = (ROOT / "config" / "hardware.yaml").read_text()
    lines = [
        line.replace("  # ", "  ", 1)
        for line in text.splitlines()
        if line.startswith(("  # sbatch_options:", "  # srun_options:"))
    ]
    assert len(lines) == 2, lines
    example = yaml.safe_load("\n".join(line.strip() for line in lines))
    hw = _hardware(**example)["h100"]
    assert hw["sbatch_options"] == example["sbatch_options"].split()
    assert hw["srun_options"] == example["srun_options"].split()


def test_options_srun_refuses_beside_cpu_bind_are_refused_where_the_binding_states_it():
    closest = {**CUDA, "gpu_binding": "closest"}
    for option in ("--hint=nomultithread", "--threads-per-core=1", "--ntasks-per-c=1"):
        assert "srun refuses it beside the --cpu-bind" in refusal("srun_options", option, closest)
        assert validated("srun_options", option, CUDA) == [option]  # node states no --cpu-bind
    # the job's own --hint never reaches the ranks' srun (SLURM_HINT is dropped there)
    assert validated("sbatch_options", "--hint=nomultithread", closest)
