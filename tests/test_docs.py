"""The documentation site (docs/mkdocs.yml) builds with warnings as errors: a broken link, a
missing page or a schema key without a description fails the test command; the configuration
reference is generated from the schemas, and the README stays a short entry point."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"
DOCS = ROOT / "docs"


def hooks():
    spec = importlib.util.spec_from_file_location("dlscale_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(docs: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(docs / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    proc = build(DOCS, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = (tmp_path / "site" / "configuration.html").read_text()
    assert "<code>convergence.lr_rule</code>" in reference  # generated from the schema
    assert "tensorflow" in reference  # the registries filled the allowed frameworks
    # every benchmark report a page of its own, linked from the Benchmarks page's index and by
    # the pages that cite it (a link relative to the page's file in the repository)
    benchmarks = (tmp_path / "site" / "benchmarks.html").read_text()
    reports = sorted((ROOT / "benchmarks" / "reports").glob("*.md"))
    assert reports
    for report in reports:
        assert f'href="benchmarks/reports/{report.stem}.html"' in benchmarks
        assert (tmp_path / "site" / "benchmarks" / "reports" / f"{report.stem}.html").is_file()
    testing = (tmp_path / "site" / "testing.html").read_text()
    assert 'href="benchmarks/reports/2026-11-26-time-to-results-second-pass.html"' in testing


def _copy(tmp_path: Path) -> Path:
    """A copy of the site's sources and the schemas it renders, beside each other as in the
    repository, so a test can break one of them."""
    work = tmp_path / "repo"
    shutil.copytree(DOCS, work / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "config", work / "config")
    shutil.copytree(ROOT / "benchmarks", work / "benchmarks", ignore=shutil.ignore_patterns("*.py"))
    return work


def test_a_broken_link_fails_the_build(tmp_path):
    work = _copy(tmp_path)
    page = work / "docs" / "pages" / "testing.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    proc = build(work / "docs", tmp_path / "site")
    assert proc.returncode != 0 and "no-such-page.md" in proc.stderr


def test_a_schema_key_without_description_fails_the_build(tmp_path):
    work = _copy(tmp_path)
    path = work / "config" / "schemas" / "config.schema.json"
    schema = json.loads(path.read_text())
    del schema["properties"]["steps"]["description"]
    path.write_text(json.dumps(schema))
    proc = build(work / "docs", tmp_path / "site")
    assert proc.returncode != 0 and "`steps` has no description" in proc.stderr


@pytest.mark.parametrize("name", ["config", "hardware", "references"])
def test_the_reference_names_every_schema_key(name):
    """What tests/unit/study/test_config.py and tests/unit/decisions/test_regression_check.py
    asserted of the hand-kept config/README.md tables, now of the generated reference: every key
    appears, described."""
    docs = hooks()
    text, problems = docs.render(name)
    assert problems == []
    keys = [key for key, _, _ in docs.walk(docs.load_schema(name))]
    assert len(keys) >= 3
    for key in keys:
        assert f"`{key}`" in text


def test_readme_is_short_and_names_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 10_000
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # CI runs the test command
    for page in (DOCS / "pages").glob("*.md"):
        assert f"docs/pages/{page.name}" in readme or page.name in ("index.md", "benchmarks.md")
