"""Every explanation stands inside the repository: no tracked file (code, comment, docstring,
test, doc page, benchmark report or fixture) cites an issue or ticket number, or a path that
leaves the checkout. A reader has the repository and nothing else, so a comment states the rule
that holds now; where a decision needs its history, a note under docs/pages/decisions/ says what
was decided and why, and the code names that note by its path.

Every file `git ls-files` lists is read; one that is not UTF-8 text fails the check rather than
being passed over. The only lines allowed to match are the ones ALLOWED names, each with its
reason, and an allowance that no longer matches anything fails too. The last test feeds the
checker a small tree with one hit of each kind, so a checker that stopped seeing fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a line may not say. The patterns are written so that their own text does not match them
# (a character class in the middle of a path's name), which keeps this file under its own check.
PATTERNS = {
    # the word issue (or issues) and a number, with or without "#", in any letter case
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    # a hash sign and a number standing alone (not a Markdown anchor, a colour, a Slurm step or
    # an upstream project's "owner/name" before it, which names where to look it up)
    "a bare reference number": re.compile(r"(?<![\w/.&#-])#\d{1,5}(?![\w#])"),
    # a file beside the checkout, a folder of one developer's machine, or a scratch script
    # (a /tmp or /var/tmp *.py or *.sh) that no clone has
    "a path outside the repository": re.compile(
        r"\.\./share[d]\b"
        r"|\bROUN[D]\.md\b"
        r"|(?<![\w.~-])/wor[k]/"
        r"|(?<![\w.~-])/hom[e]/[^/\s]+"
        r"|(?<![\w.~-])/roo[t]/"
        r"|(?<![\w.~-])/User[s]/"
        r"|\b[A-Za-z]:\\User[s]\\"
        r"|(?<![\w.~-])(/var)?/tm[p]/[\w./-]+\.(py|sh)\b"
    ),
}

# A Markdown link's relative target: checked to resolve inside the repository.
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)

# (path, kind, reason): the lines of `path` that may match `kind`, and why they must.
ALLOWED = (
    (
        "tests/fixtures/probes/scontrol-job.txt",
        "a path outside the repository",
        "a recorded `scontrol show job` reply, whose job script and log paths sit in a cluster "
        "user's home folder: test_node_probes checks that the probe drops exactly these paths",
    ),
)


def tracked_files(root: Path) -> list[str]:
    proc = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"`git ls-files` failed in {root}: {proc.stderr.strip()}"
    return [p for p in proc.stdout.split("\0") if p]


def link_leaves(root: Path, source: Path, target: str) -> bool:
    """Whether a Markdown link's relative target resolves outside `root`."""
    if SCHEME.match(target) or target.startswith(("#", "/")):
        return False
    path = (source.parent / target.split("#", 1)[0]).resolve()
    return not path.is_relative_to(root.resolve())


def hits(root: Path, paths: list[str]) -> list[tuple[str, int, str, str]]:
    """Every (path, line, kind, text) in `paths` under `root` that says what PATTERNS forbid,
    or whose Markdown link leaves the repository; a file that is not UTF-8 text is a hit."""
    found = []
    for rel in paths:
        source = root / rel
        if source.is_symlink() or not source.is_file():
            continue  # a link or a submodule: its target is a tracked file or another repo
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            found.append((rel, 0, "not UTF-8 text (cannot be checked)", ""))
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for kind, pattern in PATTERNS.items():
                if pattern.search(line):
                    found.append((rel, number, kind, line.strip()))
            if rel.endswith(".md"):
                for target in MARKDOWN_LINK.findall(line):
                    if link_leaves(root, source, target):
                        found.append((rel, number, "a link out of the repository", line.strip()))
    return found


def split_allowed(found, allowed=ALLOWED):
    allowances = {(path, kind) for path, kind, _ in allowed}
    kept = [h for h in found if (h[0], h[2]) not in allowances]
    used = {(h[0], h[2]) for h in found}
    stale = sorted(a for a in allowances if a not in used)
    return kept, stale


def listing(found) -> str:
    return "\n".join(
        f"  {path}:{number}: {kind}: {text[:140]}" for path, number, kind, text in found
    )


def test_no_tracked_file_cites_an_issue_or_a_path_outside_the_repository():
    kept, stale = split_allowed(hits(ROOT, tracked_files(ROOT)))
    assert not kept, (
        f"{len(kept)} line(s) point outside the repository; state the rule that holds now, or "
        "write a note under docs/pages/decisions/ and name it by its path:\n" + listing(kept)
    )
    assert not stale, f"allowances in ALLOWED that match nothing any more: {stale}"


def test_the_checker_sees_each_kind(tmp_path):
    """A deliberate hit of each kind, in a small tree: each is reported with its file and line,
    an allowance exempts only its own file and kind, and a stale allowance is named."""

    def joined(*parts: str) -> str:  # the examples, kept out of this file's own text
        return "".join(parts)

    files = {
        "a.py": joined(
            '"""See ', "Issue", " 48's fix.", '"""\n', "x = 1  # ", "issues", " 49 and 51\n"
        ),
        "b.md": joined(
            "# Title\n\nAs in ",
            "#",
            "48. [up](",
            "../",
            "../elsewhere.md",
            ") [in](a.py) ",
            "[web](https://example.org/x) [anchor](#title)\n",
        ),
        "c.txt": joined("read ", "../", "shared/", "ROUND", ".md\nthen ", "/", "work/", "main\n"),
        "g.md": joined("ran `", "/", "tmp/x/", "identity.py`; kept /var/tmp/dlscale-images\n"),
        "d.json": joined('{"a": "', "/", "home/", "dev/x", '"}\n'),
        "e.txt": "colour #333333, step 0cc066bd-001#0, keras-team/keras#20585, gpu.md#2-x\n",
        "f.bin": "",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "f.bin").write_bytes(b"\xff\xfe\x00")
    found = hits(tmp_path, sorted(files))
    where = {(path, number, kind) for path, number, kind, _ in found}
    assert where == {
        ("a.py", 1, "an issue number"),
        ("a.py", 2, "an issue number"),
        ("b.md", 3, "a bare reference number"),
        ("b.md", 3, "a link out of the repository"),
        ("c.txt", 1, "a path outside the repository"),
        ("c.txt", 2, "a path outside the repository"),
        ("d.json", 1, "a path outside the repository"),
        ("g.md", 1, "a path outside the repository"),
        ("f.bin", 0, "not UTF-8 text (cannot be checked)"),
    }
    assert "  a.py:2: an issue number: x = 1" in listing(found)
    allowed = (
        ("d.json", "a path outside the repository", "why"),
        ("e.txt", "an issue number", "why"),
    )
    kept, stale = split_allowed(found, allowed)
    assert len(kept) == len(found) - 1 and stale == [("e.txt", "an issue number")]
