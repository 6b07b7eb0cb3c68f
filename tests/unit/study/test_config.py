"""Configuration validation and the matrix: every bad input stops early and names its key."""

from __future__ import annotations

import copy
import json

import pytest

from dlscale import models
from dlscale.registry import frameworks
from dlscale.study.cell import CELL_PATTERN, PARALLEL_CELL_PATTERNS
from dlscale.study.config import AXES, ConfigError, load_schema, load_yaml, validate_config
from dlscale.study.matrix import load_study


def study(root, config):
    return load_study(copy.deepcopy(config), root)


def problems_of(root, config) -> str:
    with pytest.raises(ConfigError) as info:
        study(root, config)
    return str(info.value)


def with_(config, path, value):
    out = copy.deepcopy(config)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (
            ("axes", "framework"),
            ["pytorch", "tensorflw"],
            ["axes.framework[1]", "'tensorflw'", "allowed values: pytorch"],
        ),
        (
            ("axes", "model"),
            ["resnet5"],
            ["axes.model[0]", "'resnet5'", "resnet50", "did you mean 'resnet50'"],
        ),
        (
            ("axes", "hardware"),
            ["tpu"],
            [
                "axes.hardware[0]",
                "'tpu'",
                "not defined in",
                "allowed values: a100, cpu, h100, h200, v100",
            ],
        ),
        (("axes", "nodes"), [0, 1], ["axes.nodes[0]", "must be >= 1"]),
        (("axes", "nodes"), [1, 1.5], ["axes.nodes[1]", "1.5", "must be an integer"]),
        (("axes", "nodes"), [1, 2, 2], ["axes.nodes", "duplicated values [2]"]),
        (("axes", "nodes"), [], ["axes.nodes", "at least 1"]),
        (("axes", "nodes"), [1, 4], ["axes.nodes", "exceed max_nodes=2", "'cpu'"]),
        (("axes", "policy"), ["weak", "both"], ["axes.policy[1]", "allowed values: weak, strong"]),
        (("axes", "precision"), ["fp16"], ["axes.precision", "'fp16' needs a GPU", "fp32, bf16"]),
        (("per_rank_batch",), -4, ["per_rank_batch", "-4", "must be >= 1"]),
        (("per_rank_batch",), 0, ["per_rank_batch", "must be >= 1"]),
        (("per_rank_batch",), "32", ["per_rank_batch", "'32'", "must be an integer"]),
        (("per_rank_batch",), 16.5, ["per_rank_batch", "must be an integer"]),
        (("repetitions",), 0, ["repetitions", "must be >= 1"]),
        (("steps",), True, ["steps", "must be an integer"]),
        (
            ("global_batch",),
            15,
            ["global_batch", "15", "not divisible by world size(s) [2]", "multiple of 2"],
        ),
        (
            ("exclude",),
            [{"model": "resnet50"}],
            ["exclude[0].model", "'resnet50'", "allowed values: cnn_small, gpt2_tiny"],
        ),
        (
            ("exclude",),
            [{"modell": "cnn_small"}],
            ["unknown key 'modell'", "did you mean 'model'", "exclude[0]"],
        ),
        (("exclude",), [{}], ["exclude[0]", "at least 1"]),
        (("exclude",), [{"nodes": 3}], ["exclude[0].nodes", "allowed values: 1, 2"]),
        (("study",), "a;rm -rf ~", ["study", "not a valid name"]),
        (("launcher",), "mpirun", ["launcher", "allowed values: local, srun"]),
    ],
)
def test_bad_input_names_key_and_allowed_values(root, base_config, path, value, expected):
    message = problems_of(root, with_(base_config, path, value))
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_misspelt_top_level_key(root, base_config):
    config = copy.deepcopy(base_config)
    config["repetitons"] = config.pop("repetitions")
    message = problems_of(root, config)
    assert "unknown key 'repetitons'" in message and "did you mean 'repetitions'" in message
    assert "allowed keys:" in message and "steps" in message


def test_all_problems_reported_at_once(root, base_config):
    config = with_(with_(base_config, ("axes", "nodes"), [0]), ("per_rank_batch",), -1)
    message = problems_of(root, config)
    assert "axes.nodes[0]" in message and "per_rank_batch" in message


def test_everything_excluded_is_an_error(root, base_config):
    config = with_(base_config, ("exclude",), [{"framework": "pytorch"}])
    assert "every cell of the matrix is excluded" in problems_of(root, config)


def test_hardware_file_errors_name_the_key(root, base_config, tmp_path):
    hw = tmp_path / "hw.yaml"
    hw.write_text("cpu: {device: cpu, gpus_per_node: 2, partiton: x}\n")
    message = problems_of(root, with_(base_config, ("hardware_file",), str(hw)))
    assert "unknown key 'partiton'" in message and "did you mean 'partition'" in message
    assert "cpu.gpus_per_node" in message


@pytest.mark.parametrize(
    "exclude, removed",
    [
        ([], 0),
        ([{"model": "gpt2_tiny", "policy": "strong"}], 4),  # 2 nodes x 2 reps
        ([{"nodes": 2}], 8),
        ([{"nodes": 2, "policy": "weak"}, {"nodes": 2}], 8),  # overlapping entries
    ],
)
def test_matrix_size_is_product_minus_exclusions(root, base_config, exclude, removed):
    config = with_(base_config, ("exclude",), exclude)
    s = study(root, config)
    axes = config["axes"]
    product = 1
    for axis in AXES:
        product *= len(axes.get(axis, ["ddp"]))  # parallelism: the schema's default
    product *= config["repetitions"]
    # the throughput cells (the demo's convergence block: tests/unit/study/test_convergence.py)
    assert len(s.cells_of("throughput")) == product - removed
    assert len({c.path for c in s.cells}) == len(s.cells)  # one path per cell


def test_cell_path_names_every_axis(root, base_config):
    cell = study(root, base_config).cells[0]
    for field in (*AXES, "rep"):
        # a ddp cell's path has no parallelism segment (every cell measured before the axis)
        assert (f"{{{field}}}" in CELL_PATTERN) == (field != "parallelism")
        assert f"{{{field}}}" in PARALLEL_CELL_PATTERNS["throughput"]
    assert cell.path == (
        f"results/{cell.study}/runs/{cell.hardware}/{cell.framework}/{cell.model}/"
        f"{cell.policy}/{cell.precision}/{cell.mode}/n{cell.nodes}/r{cell.rep}/metrics.jsonl"
    )


def test_batch_policies(root, base_config):
    config = with_(base_config, ("ranks_per_node",), 2)
    config["global_batch"] = 64
    cells = study(root, config).cells_of("throughput")
    for c in cells:
        assert c.world_size == 2 * c.nodes
        if c.policy == "weak":
            assert c.per_rank_batch == 16 and c.global_batch == 16 * c.world_size
        else:
            assert c.global_batch == 64 and c.per_rank_batch * c.world_size == 64


def test_strong_default_global_batch(root, base_config):
    cells = study(root, base_config).cells
    strong = [c for c in cells if c.policy == "strong"]
    assert {c.global_batch for c in strong} == {16}  # per_rank_batch x ranks at 1 node
    assert {(c.nodes, c.per_rank_batch) for c in strong} == {(1, 16), (2, 8)}


def test_gpu_hardware_runs_one_rank_per_gpu(root, base_config):
    config = with_(base_config, ("axes", "hardware"), ["h100"])
    config["axes"]["precision"] = ["bf16", "fp16"]
    cells = study(root, config).cells_of("throughput")  # the demo's convergence cells: cpu
    assert {c.ranks_per_node for c in cells} == {4}
    assert {c.device for c in cells} == {"cuda"}


def test_config_hash_tracks_measured_settings_only(root, base_config):
    a = study(root, base_config).config_hash
    b = study(root, with_(base_config, ("report",), {"title": "Other"})).config_hash
    c = study(root, with_(base_config, ("steps",), 11)).config_hash
    assert a == b != c


def test_schema_enums_match_registries(root):
    schema = load_schema(root / "config" / "schemas" / "config.schema.json")
    axes = schema["properties"]["axes"]["properties"]
    assert axes["framework"]["items"]["enum"] == frameworks.names()
    assert axes["model"]["items"]["enum"] == models.names()


def _walk_properties(schema, path=""):
    for key, sub in schema.get("properties", {}).items():
        yield f"{path}{key}", sub
        yield from _walk_properties(sub, f"{path}{key}.")


@pytest.mark.parametrize("name", ["config.schema.json"])
def test_every_key_has_description_and_default(root, name):
    schema = load_schema(root / "config" / "schemas" / name)
    for key, sub in _walk_properties(schema):
        if key.startswith("exclude"):
            continue  # exclusion entries are free-form partial cells
        assert sub.get("description"), f"{key} lacks a description"
        assert "default" in sub, f"{key} lacks a default"


def _configuration_reference(root) -> str:
    """The docs' configuration reference as the site renders it from the schemas (docs/hooks.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", root / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (root / "docs" / "pages" / "configuration.md").read_text()
    return hooks.on_page_markdown(page, None, None, None)


def test_config_reference_documents_every_key(root):
    reference = _configuration_reference(root)
    schema = load_schema(root / "config" / "schemas" / "config.schema.json")
    for key, _ in _walk_properties(schema):
        if not key.startswith("exclude"):
            assert f"`{key}`" in reference, f"the configuration reference lacks `{key}`"


def test_shipped_configs_are_valid(root):
    schema = load_schema(root / "config" / "schemas" / "config.schema.json")
    for path in [root / "config" / "config.yaml", root / "tests" / "fixtures" / "tiny.yaml"]:
        validate_config(load_yaml(path), schema, source=str(path))


def test_defaults_fill_an_empty_config(root):
    s = study(root, {})
    assert s.config["axes"]["framework"] == ["pytorch"] and s.config["steps"] == 20
    json.dumps(s.config)


def test_a_later_hardware_key_at_its_default_keeps_measured_cells_current():
    """gpus_allocated_only at its default asks what an entry without it asked: the
    cells' hardware hash and the config hash stay those measured before the key existed."""
    from dlscale.study.hashes import hashed_hardware

    entry = {"device": "cpu", "partition": None, "cpus_per_rank": 1}
    assert hashed_hardware(dict(entry, gpus_allocated_only=False)) == entry
    assert hashed_hardware(dict(entry, gpus_allocated_only=True)) != entry
    assert hashed_hardware(dict(entry, node_hour_cost=2.0)) == entry  # planning only


def test_stage_dir_is_checked_early_carried_by_convergence_cells_and_hashed_nowhere(
    root, base_config, tmp_path
):
    """A hardware entry's stage_dir: a relative path is refused naming the key; an absolute
    path, ~ or $VARIABLE is taken, reaches every convergence cell of that hardware (none of
    the throughput cells) and changes no hash: moving the copy re-measures nothing."""
    hw = (root / "config" / "hardware.yaml").read_text()
    site = tmp_path / "site.yaml"  # the hardware file's path is part of the config hash
    site.write_text(hw)
    bad = tmp_path / "bad.yaml"
    bad.write_text(hw.replace("  runtime_min: 20\n", "  runtime_min: 20\n  stage_dir: x/y\n", 1))
    message = problems_of(root, with_(base_config, ("hardware_file",), str(bad)))
    assert "cpu.stage_dir" in message and "'x/y'" in message and "$TMPDIR" in message
    before = study(root, with_(base_config, ("hardware_file",), str(site)))
    for value in ("$TMPDIR", "${SLURM_TMPDIR}/dl", "~/stage", "/local/scratch"):
        site.write_text(
            hw.replace("  runtime_min: 20\n", f"  runtime_min: 20\n  stage_dir: '{value}'\n", 1)
        )
        after = study(root, with_(base_config, ("hardware_file",), str(site)))
        conv = after.cells_of("convergence")
        assert conv and {c.stage_dir for c in conv} == {value}
        assert {c.stage_dir for c in after.cells_of("throughput")} == {None}
        assert after.config_hash == before.config_hash
        assert [c.config_hash for c in after.cells] == [c.config_hash for c in before.cells]


def test_a_gres_gpu_type_the_slurm_plugin_would_refuse_is_an_early_error(root):
    from dlscale.study.config import ConfigError, load_schema
    from dlscale.study.hardware import validate_hardware

    schema = load_schema(root / "config" / "schemas" / "hardware.schema.json")
    entry = dict(device="cuda", gpus_per_node=4, gpu_request="gres", gpu_type="a100-80g")
    with pytest.raises(ConfigError, match=r"gpu_type: 'a100-80g' cannot be a GRES type"):
        validate_hardware({"a100": entry}, schema)
    assert validate_hardware({"a100": dict(entry, gpu_request="gpus")}, schema)
    assert validate_hardware({"a100": dict(entry, gpu_type="a100_80g")}, schema)


# Only study folders live directly under results/; the project's own names are refused.
@pytest.mark.parametrize(
    "name", ["data", "DATA", "Site", "logs", "report.zip", "README.md", "runs", "Report"]
)
def test_a_name_the_project_writes_under_results_is_refused_as_a_study(root, name):
    from dlscale.study.matrix import load_workflow_study
    from dlscale.study.results_layout import RESERVED_UNDER_RESULTS

    with pytest.raises(ConfigError) as exc:
        load_workflow_study({"study": name}, root)
    message = str(exc.value)
    assert f"study: {name!r} cannot name a study" in message
    listed = ", ".join(sorted(RESERVED_UNDER_RESULTS))
    assert f"Reserved under results/ (in any letter case): {listed}" in message


@pytest.mark.parametrize("name", ["site-2", "data.v2", "Logs2", "archive", "partial", "demo"])
def test_names_that_only_look_reserved_are_studies(root, name):
    from dlscale.study.matrix import load_workflow_study

    assert load_workflow_study({"study": name}, root).config["study"] == name


# A hardware entry's modules and env.
@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"modules": "cuda/12.4"}, ["x.modules", "must be a list"]),
        ({"modules": ["cuda 12.4"]}, ["x.modules[0]", "'cuda 12.4'", "a module name"]),
        ({"modules": ["cuda;rm -rf ~"]}, ["x.modules[0]", "no spaces or shell characters"]),
        ({"modules": ["$(id)"]}, ["x.modules[0]", "'$(id)'"]),
        ({"modules": ["--force"]}, ["x.modules[0]", "not starting with - or ."]),
        ({"modules": ["cuda/12.4", "cuda/12.4"]}, ["x.modules", "duplicated values"]),
        ({"env": ["NCCL_DEBUG=INFO"]}, ["x.env", "must be a mapping"]),
        ({"env": {"1NCCL": "x"}}, ["x.env.1NCCL", "not a variable name", "letters, digits"]),
        ({"env": {"NCCL-DEBUG": "x"}}, ["x.env.NCCL-DEBUG", "not a variable name"]),
        ({"env": {"NCCL_NTHREADS": 4}}, ["x.env.NCCL_NTHREADS", "must be a string"]),
        ({"env": {"NCCL_DEBUG": "INFO\nrm"}}, ["x.env.NCCL_DEBUG", "without NUL or line breaks"]),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, ["x.env.CUDA_VISIBLE_DEVICES", "gpu_binding"]),
        ({"env": {"SLURM_CPU_BIND": "none"}}, ["x.env.SLURM_CPU_BIND", "Slurm's own"]),
        ({"env": {"DLSCALE_RANK": "0"}}, ["x.env.DLSCALE_RANK", "rank variables"]),
        ({"env": {"MASTER_ADDR": "n1"}}, ["x.env.MASTER_ADDR", "rendezvous"]),
        ({"env": {"WORLD_SIZE": "2"}}, ["x.env.WORLD_SIZE", "who it is"]),
        ({"env": {"OMP_NUM_THREADS": "8"}}, ["x.env.OMP_NUM_THREADS", "cpus_per_rank"]),
        ({"env": {"PYTHONPATH": "/opt"}}, ["x.env.PYTHONPATH", "code the ranks run"]),
        ({"env": {"PATH": "/opt/bin"}}, ["x.env.PATH", "modulefile"]),
    ],
)
def test_bad_modules_and_env_are_refused_naming_the_key(root, extra, expected):
    from dlscale.study.hardware import validate_hardware

    schema = load_schema(root / "config" / "schemas" / "hardware.schema.json")
    with pytest.raises(ConfigError) as info:
        validate_hardware({"x": {"device": "cpu", **extra}}, schema)
    for fragment in expected:
        assert fragment in str(info.value), f"{fragment!r} not in:\n{info.value}"


def test_site_modules_and_env_are_taken_and_default_to_none(root):
    from dlscale.study.hardware import validate_hardware

    schema = load_schema(root / "config" / "schemas" / "hardware.schema.json")
    site = {
        "modules": ["cuda/12.4", "NCCL/2.18.3-GCCcore-12.3.0-CUDA-12.1.1", "cuda/.12.4", "gcc"],
        "env": {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5", "UCX_TLS": "rc,sm", "X": ""},
    }
    hw = validate_hardware({"x": {"device": "cpu", **site}, "y": {"device": "cpu"}}, schema)
    assert {k: hw["x"][k] for k in site} == site
    assert hw["y"]["modules"] == [] and hw["y"]["env"] == {}


def test_the_schema_names_every_variable_env_refuses(root):
    """The configuration reference (generated from the schema) lists what `env:` refuses: the
    list in dlscale.study.env_names, which the checks read."""
    from dlscale.study.env_names import RESERVED_ENV

    schema = load_schema(root / "config" / "schemas" / "hardware.schema.json")
    text = schema["additionalProperties"]["properties"]["env"]["description"]
    assert [name for name in RESERVED_ENV if name not in text] == []


def test_modules_and_env_reach_the_cells_and_enter_their_identity_only_when_set(
    root, base_config, tmp_path
):
    """An entry's modules and env reach every cell of that hardware (Cell.to_json carries them,
    a mapping for env, and reads back equal); at their defaults ([] and {}, written out or not)
    every hash and every cell's JSON are as without the keys, so measured cells stay current."""
    from dlscale.study.cell import Cell

    hw = (root / "config" / "hardware.yaml").read_text()
    site = tmp_path / "site.yaml"  # the hardware file's path is part of the config hash
    config = with_(base_config, ("hardware_file",), str(site))
    marker = "  runtime_min: 20\n"
    site.write_text(hw)
    before = study(root, config)
    site.write_text(hw.replace(marker, marker + "  modules: []\n  env: {}\n", 1))
    defaults = study(root, config)
    assert defaults.config_hash == before.config_hash
    assert [c.to_json() for c in defaults.cells] == [c.to_json() for c in before.cells]
    site.write_text(
        hw.replace(marker, marker + "  modules: [testmod]\n  env: {NCCL_DEBUG: INFO}\n", 1)
    )
    after = study(root, config)
    assert after.config_hash != before.config_hash
    for old, new in zip(before.cells, after.cells, strict=True):
        assert new.path == old.path  # the same cells, measured in another environment
        assert new.hardware_hash != old.hardware_hash and new.config_hash != old.config_hash
        assert new.modules == ("testmod",) and new.env == (("NCCL_DEBUG", "INFO"),)
        as_json = json.loads(new.to_json())
        assert as_json["modules"] == ["testmod"] and as_json["env"] == {"NCCL_DEBUG": "INFO"}
        assert Cell.from_json(new.to_json()) == new
        # a measured cell's identity is read back from JSON: it must compare equal
        assert json.loads(json.dumps(new.identity())) == new.identity()
