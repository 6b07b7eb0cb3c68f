"""No name in the package is defined and used nowhere: vulture (pinned in envs/workflow.txt)
over scripts/dlscale.

- At full confidence (vulture's 100 %: an unused argument or local variable, unreachable code)
  over the package alone: nothing. An argument a protocol requires but the body does not read
  (a descriptor's instance, a type checker's checker) starts with an underscore.
- At vulture's lowest confidence (60 %: functions, classes, methods, attributes, constants) over
  the package, with every reader of the package counted as a use: the executor plugin, the
  tests, the benchmarks, and the words of the files that are not Python but name the package's
  functions and constants (the Snakefile, the rules, config/, profiles/, the report template,
  the JSON schemas). What remains is a name nothing reads, unless ALLOWED names it with its
  reason (a library reads it, not this repository); an allowance vulture no longer reports
  fails too, so the list stays as short as the truth.

Both read the files git tracks (what a clone holds), as they are in the working tree.

Vulture matches names, not objects: a name defined twice is used once both are unused, so this
check finds only names that appear where they are defined and nowhere else."""

from __future__ import annotations

import keyword
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VULTURE = Path(sys.executable).parent / "vulture"
PACKAGE = "scripts/dlscale"
# Python that uses the package, read by vulture beside it
PYTHON_READERS = ("scripts/snakemake_executor_plugin_dlscale", "tests", "benchmarks")
# Files that name the package's functions and constants but are not Python: their words count
# as uses (a rule's `from dlscale... import x`, a template's {{ x }}, a schema's key)
TEXT_READERS = (
    "Snakefile",
    "rules",
    "config",
    "profiles",
    "scripts/dlscale/templates",
    "scripts/dlscale/schemas",
)
FINDING = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): unused (?P<kind>[\w ]+) '(?P<name>[^']+)' "
    r"\((?P<confidence>\d+)% confidence"
)

_TARINFO = "a tarfile.TarInfo header field, which tarfile.addfile writes into the member"
_HYBRID = "MXNet's HybridBlock calls hybrid_forward (forward, hybridized or not)"
_REPR = "a reprlib.Repr limit, which its repr() reads"
_AUTO_SHARD = "a tf.data option, read by tf.distribute when it distributes the dataset"
# (path under scripts/dlscale, name) -> why the name is used although nothing here reads it
ALLOWED = {
    ("data/tf_data.py", "auto_shard_policy"): _AUTO_SHARD,
    ("frameworks/keras.py", "auto_shard_policy"): _AUTO_SHARD,
    ("data/writers.py", "mtime"): _TARINFO,
    ("data/writers.py", "gid"): _TARINFO,
    ("data/writers.py", "gname"): _TARINFO,
    ("store/study_archive.py", "mtime"): _TARINFO,
    ("store/study_archive.py", "gid"): _TARINFO,
    ("store/study_archive.py", "gname"): _TARINFO,
    ("frameworks/mxnet.py", "_kvstore"): "MXNet's Trainer's own reference to its kvstore, "
    "cleared so the kvstore is freed at shutdown",
    ("frameworks/mxnet.py", "_trainer"): "MXNet's Parameter's own reference to its trainer, "
    "cleared so the kvstore is freed at shutdown",
    ("models/mxnet/cnn.py", "hybrid_forward"): _HYBRID,
    ("models/mxnet/resnet.py", "hybrid_forward"): _HYBRID,
    ("models/mxnet/transformer.py", "hybrid_forward"): _HYBRID,
    ("study/config.py", "maxstring"): _REPR,
    ("study/config.py", "maxother"): _REPR,
    ("study/config.py", "maxlevel"): _REPR,
    ("workflow/config_option.py", "__wrapped__"): "read by inspect.signature and "
    "functools.unwrap: the wrapped Snakemake function stays reachable",
}


def tracked(*paths: str) -> list[Path]:
    """The files git tracks under `paths` that the working tree holds."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", *paths],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"`git ls-files` failed: {proc.stderr.strip()}"
    files = [ROOT / p for p in proc.stdout.split("\0") if p]
    return [f for f in files if f.is_file() and not f.is_symlink()]


def python_files(*paths: str) -> list[Path]:
    return [f for f in tracked(*paths) if f.suffix == ".py"]


def findings(files: list[Path], confidence: int, package: Path = ROOT / PACKAGE) -> list[dict]:
    """Vulture's findings in `package` among `files`, each a dict of FINDING's groups (its
    path relative to the package)."""
    proc = subprocess.run(
        [str(VULTURE), *map(str, files), "--min-confidence", str(confidence)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # 0: nothing found, 3: unused code found; anything else (a file it cannot parse) fails here
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    found = []
    for line in proc.stdout.splitlines():
        match = FINDING.match(line)
        assert match, f"a line of vulture's output this test cannot read: {line}"
        path = (ROOT / match["path"]).resolve()
        if path.is_relative_to(package.resolve()):
            found.append({**match.groupdict(), "path": path.relative_to(package).as_posix()})
    return found


def words_of(files: list[Path]) -> list[str]:
    """Every identifier-like word of `files`, less Python's keywords."""
    words: set[str] = set()
    for path in files:
        words.update(re.findall(r"\b[A-Za-z_]\w*", path.read_text(errors="replace")))
    return sorted(w for w in words if not keyword.iskeyword(w))


def shown(found: list[dict]) -> str:
    return "\n".join(
        f"{PACKAGE}/{f['path']}:{f['line']}: {f['kind']} {f['name']} ({f['confidence']} %)"
        for f in found
    )


def test_vulture_at_full_confidence_finds_nothing_in_the_package():
    found = findings(python_files(PACKAGE), confidence=100)
    assert found == [], "unused at full confidence (remove, or start the name with _):\n" + shown(
        found
    )


def test_every_name_the_package_defines_is_read_somewhere(tmp_path):
    text_uses = tmp_path / "words_of_the_text_readers.py"
    text_uses.write_text("\n".join(words_of(tracked(*TEXT_READERS))) + "\n")
    found = findings([*python_files(PACKAGE, *PYTHON_READERS), text_uses], confidence=60)
    unused = [f for f in found if (f["path"], f["name"]) not in ALLOWED]
    assert unused == [], (
        "defined in the package and read nowhere in the repository (remove it, or add it to "
        "ALLOWED with the library that reads it):\n" + shown(unused)
    )
    reported = {(f["path"], f["name"]) for f in found}
    stale = sorted(set(ALLOWED) - reported)
    assert stale == [], f"allowances vulture no longer reports (remove them): {stale}"


def test_the_check_sees_a_dead_name_an_unused_argument_and_a_use_elsewhere(tmp_path):
    """A planted package: a constant and a function nothing reads, an argument its function
    ignores, and a function only a reader outside the package calls."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        "DEAD = 1\n\n\ndef dead():\n    return 2\n\n\n"
        "def ignores(value, unread):\n    return value\n\n\n"
        "def read_elsewhere():\n    return ignores(1, 2)\n"
    )
    (tmp_path / "reader.py").write_text("from pkg.mod import read_elsewhere\nread_elsewhere()\n")
    module = [package / "mod.py"]
    full = findings(module, confidence=100, package=package)
    assert [(f["name"], f["confidence"]) for f in full] == [("unread", "100")]
    every = findings([*module, tmp_path / "reader.py"], confidence=60, package=package)
    assert {f["name"] for f in every} == {"DEAD", "dead", "unread"}
