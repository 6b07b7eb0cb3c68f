"""hardware.yaml `container`: each engine's command line against its documented flags (apptainer
exec(1), pyxis's srun options, ch-run(1)), as the production launcher builds it
(dlscale.run.launchers.srun.start_srun with a recording srun); the image digest that becomes
the cells' environment identity; the checks before any job (hostile and impossible entries);
cells without a container keep their identity."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import yaml

from dlscale.run.launchers import launcher_base
from dlscale.run.launchers import srun as srun_launcher
from dlscale.study import container_image as ci
from dlscale.study.cell import Cell
from dlscale.study.config import load_schema
from dlscale.study.errors import ConfigError
from dlscale.study.hardware import validate_hardware
from dlscale.study.matrix import build_matrix

from helpers.cells import cell_dict
from helpers.checkout import ROOT
from helpers.recording_srun import recorded, recording_srun

DIGEST = "sha256:" + "ab" * 32
HW_SCHEMA = load_schema(ROOT / "config" / "schemas" / "hardware.schema.json")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _srun_of(tmp_path, monkeypatch, container: dict, **cell) -> dict:
    record = recording_srun(tmp_path, monkeypatch)
    c = Cell.from_dict(cell_dict(launcher="srun", container=container, **cell))
    rank_dir = tmp_path / "results" / "s" / "cell" / ".ranks"
    rank_dir.mkdir(parents=True)
    argv = ["/host/venv/bin/python", "-m", "dlscale.run.train", "--cell", "x"]
    procs = srun_launcher.start_srun(c, argv, rank_dir)
    assert procs[0][1].wait() == 0
    return recorded(record)


def _covered(path: Path, binds: list[str]) -> bool:
    return any(Path(path).resolve().is_relative_to(b) for b in binds)


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_apptainer_binds_what_the_ranks_read_and_passes_the_gpus_with_nv(tmp_path, monkeypatch):
    c = {"engine": "apptainer", "image": "/images/pt.sif", "python": "/opt/env/bin/python"}
    got = _srun_of(tmp_path, monkeypatch, {**c, "binds": ["/scratch"]}, device="cuda")
    argv = got["argv"]
    start = argv.index("apptainer")
    # apptainer exec [--nv] --bind src[,src...] IMAGE CMD (apptainer exec --help)
    assert argv[start : start + 3] == ["apptainer", "exec", "--nv"]
    binds = _after(argv, "--bind").split(",")
    assert binds[0] == "/scratch"
    for path in (launcher_base.package_root(), Path.cwd(), tmp_path / "results" / "s" / "cell"):
        assert _covered(path, binds), (path, binds)
    assert _after(argv, "--pwd") == os.getcwd()  # relative paths mean what they mean outside
    image = argv.index("/images/pt.sif")
    assert argv[image + 1 :] == ["/opt/env/bin/python", "-m", "dlscale.run.train", "--cell", "x"]
    assert got["env"]["PYTHONPATH"] == str(launcher_base.package_root())
    # the engine's program runs as srun's task, after every srun option
    assert argv.index("--kill-on-bad-exit=1") < start


def test_apptainer_without_gpus_has_no_nv(tmp_path, monkeypatch):
    got = _srun_of(tmp_path, monkeypatch, {"engine": "apptainer", "image": "/i.sif"})
    assert "--nv" not in got["argv"] and got["argv"][got["argv"].index("/i.sif") + 1] == "python3"


def test_pyxis_uses_srun_s_own_container_options(tmp_path, monkeypatch):
    image = f"nvcr.io#nvidia/pytorch@{DIGEST}"
    got = _srun_of(tmp_path, monkeypatch, {"engine": "pyxis", "image": image})
    argv = got["argv"]
    # pyxis: --container-image=IMAGE --container-mounts=SRC:DST[,...] as srun options
    assert f"--container-image={image}" in argv
    mounts = next(a for a in argv if a.startswith("--container-mounts="))
    assert _covered(launcher_base.package_root(), mounts.split("=", 1)[1].split(","))
    assert argv.index(f"--container-image={image}") < argv.index("--kill-on-bad-exit=1")
    assert f"--container-workdir={os.getcwd()}" in argv
    tail = argv[argv.index("--kill-on-bad-exit=1") + 3 :]  # after --output FILE
    assert tail[0] == "python3" and "apptainer" not in argv and "ch-run" not in argv


def test_charliecloud_binds_only_onto_the_images_directories(tmp_path, monkeypatch):
    image = str(tmp_path / "img")
    checkout = "/" + launcher_base.package_root().parts[1]  # the file system of the dlscale package
    binds = [str(tmp_path), "/var/scratch", checkout]
    got = _srun_of(
        tmp_path, monkeypatch, {"engine": "charliecloud", "image": image, "binds": binds}
    )
    argv = got["argv"]
    start = argv.index("ch-run")
    # ch-run [-b SRC[:DST]]... IMAGE -- CMD (ch-run(1)): the site's binds only, each onto the
    # image's own directory
    flags = [f"--bind={b}" for b in binds]
    assert argv[start : start + 7] == ["ch-run", *flags, f"--cd={os.getcwd()}", image, "--"]
    assert argv[start + 7] == "python3"


def test_charliecloud_refuses_a_path_under_no_bind(tmp_path, monkeypatch):
    c = Cell.from_dict(
        cell_dict(launcher="srun", container={"engine": "charliecloud", "image": "/img"})
    )
    rank_dir = Path("/var/lib/nowhere/cell/.ranks")
    with pytest.raises(
        launcher_base.ContainerError, match=r"under none of the binds.*container.binds"
    ):
        launcher_base.in_container(c, ["python", "-m", "x"], rank_dir, {})


def test_a_cell_without_a_container_starts_as_before(tmp_path, monkeypatch):
    got = _srun_of(tmp_path, monkeypatch, {})
    assert got["argv"][-5:] == ["/host/venv/bin/python", "-m", "dlscale.run.train", "--cell", "x"]
    assert "PYTHONPATH" not in got["env"] or got["env"]["PYTHONPATH"] == os.environ.get(
        "PYTHONPATH"
    )


# ----------------------------------------------------------------------------- the digest
def test_a_reference_pinned_by_digest_is_its_digest_and_a_tag_is_refused():
    pinned = {"engine": "apptainer", "image": f"docker://nvcr.io/nvidia/pytorch@{DIGEST}"}
    assert ci.image_digest("h100", pinned) == DIGEST
    tag = {"engine": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3"}
    with pytest.raises(ci.ImageError, match=r"h100.container.image: .*names a tag.*@sha256"):
        ci.image_digest("h100", tag)
    assert ci.image_digest("h100", {**tag, "digest": DIGEST}) == DIGEST


def test_an_image_file_is_its_sha256_and_a_stated_digest_must_match(tmp_path):
    sif = tmp_path / "pt.sif"
    sif.write_bytes(b"not really a SIF" * 1000)
    want = "sha256:" + hashlib.sha256(sif.read_bytes()).hexdigest()
    c = {"engine": "apptainer", "image": str(sif)}
    assert ci.image_digest("x", c) == want
    with pytest.raises(ci.ImageError, match=r"x.container.digest: .* is not the image's digest"):
        ci.image_digest("x", {**c, "digest": DIGEST})
    missing = {"engine": "apptainer", "image": str(tmp_path / "gone.sif")}
    with pytest.raises(ci.ImageError, match="does not exist here"):
        ci.image_digest("x", missing)
    assert ci.image_digest("x", {**missing, "digest": DIGEST}) == DIGEST


def test_a_directory_digest_follows_content_not_timestamps(tmp_path):
    img = tmp_path / "img"
    (img / "opt" / "env").mkdir(parents=True)
    (img / "opt" / "env" / "lib.py").write_text("x = 1\n")
    (img / "link").symlink_to("opt/env")
    first = ci.local_digest(img)
    os.utime(img / "opt" / "env" / "lib.py", (1, 1))  # a new stamp, the same content
    assert ci.local_digest(img) == first
    (img / "opt" / "env" / "lib.py").write_text("x = 2\n")
    changed = ci.local_digest(img)
    assert changed != first and changed == ci.content_digest(img)
    (img / "empty").mkdir()  # a new mount point is a new image
    assert ci.local_digest(img) != changed


def test_an_unreadable_file_counts_by_size_and_time(tmp_path, monkeypatch):
    """A file the user may not read (an image's /etc/shadow for a plain user): its size and
    time count, so the digest is still the same for the same image (root reads everything, so
    the refusal is the production reader's, raised for that one file)."""
    img = tmp_path / "img"
    img.mkdir()
    secret = img / "shadow"
    secret.write_text("root:*:")
    real = ci._file_sha256

    def reader(p):
        if p == secret:
            raise PermissionError(13, "Permission denied", str(p))
        return real(p)

    monkeypatch.setattr(ci, "_file_sha256", reader)
    first = ci.content_digest(img)
    assert first.startswith("sha256:") and ci.content_digest(img) == first
    secret.write_text("root:x:")  # another size: another digest, unread all the same
    assert ci.content_digest(img) != first


# ---------------------------------------------------------------------- checks before any job
def _hw(container) -> dict:
    hw = yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text())
    hw["h100"]["container"] = container
    return hw


@pytest.mark.parametrize(
    "container, message",
    [
        ({"engine": "docker", "image": "/i.sif"}, "h100.container.engine"),
        ({"engine": "apptainer", "image": "/i.sif; rm -rf ~"}, "h100.container.image"),
        ({"engine": "apptainer", "image": "$(id).sif"}, "h100.container.image"),
        ({"engine": "apptainer"}, "image"),
        ({"engine": "apptainer", "image": "/i.sif", "python": "python3 -c x"}, "python"),
        ({"engine": "charliecloud", "image": "/i", "binds": ["scratch"]}, "binds"),
        ({"engine": "charliecloud", "image": "/i", "binds": ["/a,/b"]}, "binds"),
        ({"engine": "pyxis", "image": "/i.sqsh", "digest": "md5:00"}, "digest"),
        ({"engine": "pyxis", "image": "/i.sqsh", "mounts": ["/x"]}, "mounts"),
        ({"engine": "pyxis", "image": f"nvcr.io/nvidia/pytorch@{DIGEST}"}, "'#'"),
        ({"engine": "apptainer", "image": f"nvidia/pytorch@{DIGEST}"}, "URI"),
    ],
)
def test_hostile_or_impossible_containers_are_refused_naming_the_key(container, message):
    with pytest.raises(ConfigError) as err:
        validate_hardware(_hw(container), HW_SCHEMA)
    assert message in str(err.value), str(err.value)


def _tiny_config(launcher="local") -> dict:
    from dlscale.study.config import apply_defaults

    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    config["launcher"] = launcher
    config["workloads"] = ["throughput"]
    schema = load_schema(ROOT / "config" / "schemas" / "config.schema.json")
    return apply_defaults(schema, config)


def _cells(container, launcher="local"):
    hw = _hw(None)
    if container is not None:
        hw["cpu"]["container"] = container
    hw = validate_hardware(hw, HW_SCHEMA)
    return build_matrix(_tiny_config(launcher), hw).cells


def test_a_container_cell_s_environment_is_its_image_digest_and_the_rest_is_unchanged(tmp_path):
    plain = _cells(None)
    img = tmp_path / "img"
    (img / "opt").mkdir(parents=True)
    boxed = _cells({"engine": "charliecloud", "image": str(img), "python": "/opt/bin/python"})
    digest = ci.local_digest(img)
    assert [c.path for c in boxed] == [c.path for c in plain]
    for a, b in zip(plain, boxed, strict=True):
        assert b.environment == f"container-charliecloud:{digest[7:23]}"
        assert dict(b.container)["digest"] == digest
        assert b.config_hash != a.config_hash  # another environment: another measurement
        assert b.hardware_hash == a.hardware_hash  # the entry's hardware facts are the same
        assert "container" not in a.as_dict()  # cells without one serialise as before
        assert Cell.from_json(b.to_json()) == b


def test_pyxis_needs_srun_and_a_tag_stops_the_study_before_any_job():
    with pytest.raises(ConfigError, match=r"cpu.container.engine: pyxis starts containers only"):
        _cells({"engine": "pyxis", "image": f"nvcr.io#nvidia/pytorch@{DIGEST}"})
    with pytest.raises(ConfigError, match=r"cpu.container.image: .*names a tag"):
        _cells({"engine": "apptainer", "image": "docker://pytorch/pytorch:latest"}, "srun")
