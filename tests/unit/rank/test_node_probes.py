"""System-description probes (dlscale.rank.node_probes) on this CPU machine, the GPU parser on
recorded
nvidia-smi output (a fake nvidia-smi on PATH), and the Systems table
(dlscale.analysis.systems_table)."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import dlscale
from dlscale.analysis.systems_table import cell_systems, systems_table
from dlscale.rank import node_probes as sysprobe

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probes"


def fake_nvidia_smi(tmp_path, monkeypatch, query="query-h100x4.csv", topo="topo-h100x4.txt"):
    """An `nvidia-smi` first on PATH that prints recorded output (or fails, for None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    q = f"cat {FIXTURES / query}" if query else "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    t = f"cat {FIXTURES / topo}" if topo else "exit 3"
    script.write_text(f'#!/bin/sh\nif [ "$1" = topo ]; then {t}; else {q}; fi\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_node_description_on_this_cpu_machine():
    desc = sysprobe.node_description(ask_controller=False)
    assert set(sysprobe.SECTIONS) <= set(desc)
    for name in sysprobe.SECTIONS:
        section = desc[name]
        assert isinstance(section["available"], bool), name
        assert section["available"] or section["reason"], name  # unavailable says why
    assert desc["os"]["kernel"] and desc["os"]["name"]
    cpu = desc["cpu"]
    assert cpu["logical_cpus"] >= 1 and cpu["sockets"] >= 1
    assert (
        cpu["sockets"] * cpu["cores_per_socket"] * cpu["threads_per_core"] == (cpu["logical_cpus"])
    )
    assert desc["memory"]["total_mib"] > 0
    assert len(desc["packages"]["sha256"]) == 64 and desc["packages"]["count"] > 5
    assert desc["framework_build"] == {
        "available": False,
        "reason": "no framework in this process",
    }
    assert 0 < desc["probe_seconds"] < 1.0
    json.dumps(desc)  # JSON-able as it is written into rank_start


def test_cpu_affinity_is_this_process_binding():
    assert sysprobe.cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert sysprobe.cpu_list({5}) == "5"
    expected = sysprobe.cpu_list(os.sched_getaffinity(0))
    assert sysprobe.cpu_affinity() == expected
    code = "from dlscale.rank.node_probes import cpu_affinity; print(cpu_affinity())"
    pinned = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True
    )
    if pinned.returncode == 0:
        assert pinned.stdout.strip() == "0"


def test_package_list_hash_is_the_hash_of_the_list():
    text = sysprobe.package_list()
    lines = text.splitlines()
    assert lines == sorted(lines) and all("==" in line for line in lines)
    assert any(line.startswith("pytest==") for line in lines)
    facts = sysprobe.package_facts(text)
    import hashlib

    assert facts["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert facts["count"] == len(lines)


def test_gpu_parser_on_recorded_nvidia_smi_output(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch)
    gpu = sysprobe.gpu_facts()
    assert gpu["available"] and gpu["count"] == 4
    assert gpu["models"] == ["NVIDIA H100 80GB HBM3"] and gpu["drivers"] == ["550.54.15"]
    assert gpu["devices"][3] == {
        "index": 3,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-5e1b2c3d-0000-1111-2222-333344445558",
        "memory_mib": 81559,
        "driver": "550.54.15",
        "pci_bus_id": "00000000:5D:00.0",
    }
    topo = gpu["topology"]
    assert topo["available"] and topo["links"] == ["NV18"]
    assert topo["matrix"]["GPU0"] == {"GPU1": "NV18", "GPU2": "NV18", "GPU3": "NV18"}
    assert topo["cpu_affinity"]["GPU2"] == "48-95,144-191"
    assert topo["numa_affinity"] == {"GPU0": "0", "GPU1": "0", "GPU2": "1", "GPU3": "1"}
    assert "Legend" in topo["text"]


def test_gpu_probe_unavailable_says_why_and_never_raises(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, query=None)
    gpu = sysprobe.gpu_facts()
    assert gpu == {
        "available": False,
        "reason": "no NVIDIA GPU description: nvidia-smi --query-gpu="
        f"{sysprobe.GPU_QUERY} --format=csv,noheader,nounits exited with 9: "
        "NVIDIA-SMI has failed",
    }
    fake_nvidia_smi(tmp_path, monkeypatch, topo=None)  # GPUs, but no topology
    gpu = sysprobe.gpu_facts()
    assert gpu["count"] == 4 and not gpu["topology"]["available"]
    assert "topo -m exited with 3" in gpu["topology"]["reason"]
    fake_nvidia_smi(tmp_path, monkeypatch, query="topo-h100x4.txt")  # garbage for the query
    gpu = sysprobe.gpu_facts()
    assert not gpu["available"] and "unexpected nvidia-smi line" in gpu["reason"]
    # a memory column with units is kept as unknown rather than failing
    (dev,) = sysprobe.parse_gpu_query((FIXTURES / "query-bad-units.csv").read_text())
    assert dev["name"] == "Tesla V100-SXM2-16GB" and dev["memory_mib"] is None


def test_a_probe_that_raises_is_recorded_not_raised(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(sysprobe, "cpu_facts", broken)
    desc = sysprobe.node_description(ask_controller=False, build_info=broken)
    assert desc["cpu"] == {"available": False, "reason": "probe failed: RuntimeError('boom')"}
    assert desc["framework_build"]["available"] is False
    assert desc["os"]["available"]


def test_network_and_rdma_from_sysfs(tmp_path):
    net = tmp_path / "net"
    for name, kind, speed in (("lo", "772", "-1"), ("ib0", "32", "100000"), ("eth0", "1", "-1")):
        (net / name).mkdir(parents=True)
        (net / name / "type").write_text(kind)
        (net / name / "speed").write_text(speed)
        (net / name / "operstate").write_text("up")
        (net / name / "mtu").write_text("2044")
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "state").write_text("4: ACTIVE\n")
    (tmp_path / "ib" / "mlx5_0" / "fw_ver").write_text("20.31.1014\n")
    facts = sysprobe.network_facts(str(net), str(tmp_path / "ib"))
    assert [i["name"] for i in facts["interfaces"]] == ["eth0", "ib0"]  # no loopback
    assert facts["interfaces"][0]["speed_mbps"] is None  # -1: the link reports none
    assert facts["interfaces"][1]["type"] == "infiniband"
    assert facts["interfaces"][1]["speed_mbps"] == 100000
    assert facts["rdma"] == [
        {
            "device": "mlx5_0",
            "port": "1",
            "link_layer": "InfiniBand",
            "rate": "200 Gb/sec (4X HDR)",
            "state": "4: ACTIVE",
            "firmware": "20.31.1014",
        }
    ]
    none = sysprobe.network_facts(str(net), str(tmp_path / "absent"))
    assert none["rdma"]["available"] is False and "absent" in none["rdma"]["reason"]


def test_scontrol_job_keeps_the_allocation_not_paths():
    job = sysprobe.parse_scontrol_job((FIXTURES / "scontrol-job.txt").read_text())
    assert job["NumNodes"] == "2" and job["NumCPUs"] == "4" and job["CPUs/Task"] == "2"
    assert job["TresPerNode"] == "gres:gpu:4" and job["NodeList"] == "c[1-2]"
    assert job["TRES"] == "cpu=4,mem=2000M,node=2,billing=4"
    assert "Command" not in job and "WorkDir" not in job and "StdOut" not in job


def test_slurm_section_outside_a_job(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    facts = sysprobe.slurm_facts(ask_controller=True)
    assert facts["job"] == {"available": False, "reason": "not in a Slurm job (SLURM_JOB_ID unset)"}
    assert facts["available"] == (facts["version"] is not None)


# ----------------------------------------------------------------------------- the Systems table
def _cell_records(hardware="gpu", nodes=2, cell_rep=1, driver_of_node=("550.54.15", "550.54.15")):
    base = sysprobe.node_description(ask_controller=False)
    base["gpu"] = {
        "available": True,
        "count": 4,
        "models": ["NVIDIA H100 80GB HBM3"],
        "drivers": ["550.54.15"],
        "devices": [{"memory_mib": 81559}],
        "topology": {"available": True, "links": ["NV18"]},
    }
    starts = []
    for n in range(nodes):
        system = copy.deepcopy(base)
        system["gpu"]["drivers"] = [driver_of_node[n]]
        for local in range(2):
            value = {
                "node": f"c{n + 1}",
                "node_index": n,
                "local_rank": local,
                "python": "3.11.7",
                "cpu_affinity": f"{local * 8}-{local * 8 + 7}",
                "environment": {"NCCL_DEBUG": "WARN", "SLURM_JOB_ID": "1"},
            }
            if local == 0:
                value["system"] = system
            starts.append({"event": "rank_start", "rank": 2 * n + local, "value": value})
    start = {
        "event": "run_start",
        "value": {
            "cell": {"hardware": hardware, "nodes": nodes},
            "provenance": {"libraries": {"torch": "2.13.0"}, "slurm_job_id": "1"},
        },
    }
    return [start, *starts]


def test_systems_table_flags_nodes_of_one_cell_that_disagree():
    rows = cell_systems(_cell_records(), "gpu/a/r1")
    rows += cell_systems(_cell_records(driver_of_node=("550.54.15", "535.104.05")), "gpu/b/r1")
    table = systems_table(rows)
    driver = table[table["field"] == "GPU driver"]
    assert sorted(driver["value"]) == ["535.104.05", "550.54.15"]
    assert set(driver["cells_nodes_differ"]) == {1}
    assert set(driver["differing_cells"]) == {"gpu/b/r1"}
    model = table[table["field"] == "Accelerator model"]
    assert list(model["value"]) == ["NVIDIA H100 80GB HBM3"]
    assert list(model["cells_nodes_differ"]) == [0] and list(model["nodes"]) == [4]
    binding = table[table["field"] == "CPU binding per rank"]
    assert list(binding["value"]) == ["0-7; 8-15"]
    env = table[table["field"] == "Performance environment"]
    assert list(env["value"]) == ["NCCL_DEBUG=WARN"]  # SLURM_* is not performance-shaping
    assert list(table[table["field"] == "GPU interconnect"]["value"]) == ["GPU-GPU links: NV18"]
    assert table["mlperf_fields"].notna().all()


def test_cells_from_before_the_probes_say_so():
    records = _cell_records(nodes=1)
    for rec in records[1:]:
        rec["value"].pop("system", None)
    table = systems_table(cell_systems(records, "old"))
    assert "not recorded (measured before the system probes)" in set(table["value"])


def test_probe_cost_per_node_is_well_under_a_second():
    out = subprocess.run(
        [sys.executable, "-m", "dlscale.rank.node_probes", "--repeat", "5"],
        capture_output=True,
        text=True,
        check=True,
    )
    cost = json.loads(out.stdout)
    assert cost["n"] == 5 and cost["median_s"] < 1.0, cost


@pytest.mark.parametrize("section", sysprobe.SECTIONS)
def test_every_section_is_named_in_the_metrics_schema(section):
    schema = json.loads(
        (Path(dlscale.__file__).parent / "schemas" / "metrics.schema.json").read_text()
    )
    assert section in schema["$defs"]["rank_start"]["properties"]["system"]["properties"]


# ----------------------------------------------------- placement: a GPU rank next to its GPU (46)
def _h100_node() -> dict:
    """The recorded 2-socket, 4-GPU H100 node: GPUs 0-1 on NUMA node 0 (CPUs 0-47,96-143),
    GPUs 2-3 on NUMA node 1 (CPUs 48-95,144-191)."""
    return {
        "gpu": {
            "available": True,
            "devices": sysprobe.parse_gpu_query((FIXTURES / "query-h100x4.csv").read_text()),
            "topology": {
                "available": True,
                **sysprobe.parse_topology((FIXTURES / "topo-h100x4.txt").read_text()),
            },
        }
    }


def _gpu_rank(local: int, cpus: str, **board) -> dict:
    return {"local_rank": local, "cpu_affinity": cpus, "gpu": {"gres_index": None, **board}}


def test_a_rank_whose_cpus_are_off_its_gpus_numa_node_is_named():
    from dlscale.analysis.systems_table import gpu_placement

    node = _h100_node()
    uuid2 = node["gpu"]["devices"][2]["uuid"]
    near = [
        _gpu_rank(0, "0-11", uuid=node["gpu"]["devices"][0]["uuid"]),
        _gpu_rank(1, "48-59", pci_bus_id="0000:3a:00.0"),  # torch's spelling of GPU 2's bus
        _gpu_rank(2, "150-155", gres_index=3),  # Slurm's index where no UUID is known
    ]
    assert gpu_placement(node, near) == "all 3 on their GPU's NUMA node"
    away = [*near[:1], _gpu_rank(1, "12-23", uuid=uuid2)]  # GPU 2's host work on socket 0
    assert gpu_placement(node, away) == (
        "AWAY from their GPU's NUMA node: local rank 1 on CPUs 12-23, its GPU 2 on NUMA node 1 "
        "(CPUs 48-95,144-191)"
    )
    # what cannot be checked says so, and CPU ranks have nothing to check
    assert gpu_placement(node, [_gpu_rank(0, None, uuid=uuid2)]).startswith("not checked")
    one = {
        "gpu": {
            "available": True,
            "devices": [],
            "topology": {"available": False, "reason": "fewer than 2 GPUs"},
        }
    }
    assert gpu_placement(one, near) == "not checked (fewer than 2 GPUs)"
    assert gpu_placement(node, [{"local_rank": 0, "cpu_affinity": "0", "gpu": None}]) == (
        "no GPU ranks"
    )


def test_the_systems_table_carries_the_placement_of_each_node(tmp_path):
    records = _cell_records()
    for rec in records[1:]:
        st = rec["value"]
        st["gpu"] = {"gres_index": st["local_rank"] + 2}  # GPUs 2, 3: NUMA node 1
        if "system" in st:
            st["system"]["gpu"] = _h100_node()["gpu"] | {
                "count": 4,
                "models": ["NVIDIA H100 80GB HBM3"],
                "drivers": ["550.54.15"],
            }
    table = systems_table(cell_systems(records, "gpu/a/r1"))
    (row,) = table[table["field"] == "GPU ranks on their GPU's NUMA node"].itertuples()
    assert row.value.startswith("AWAY from their GPU's NUMA node: local rank 0 on CPUs 0-7")
    assert row.nodes == 2 and row.mlperf_fields == "sw_notes"
    # the report's Systems section says so before its table
    from dlscale.outputs.report import write_systems_table

    write_systems_table(table, str(tmp_path / "systems.tex"))
    tex = (tmp_path / "systems.tex").read_text()
    assert "Placement: GPU ranks ran on CPUs away from their GPU's NUMA node on 2 node" in tex


def test_the_systems_table_shows_an_entrys_modules_and_env_only_where_it_has_them():
    """A hardware entry's modules and env: each rank's `site_env` (the hardware entry's modules and
    env as it saw them) becomes a Modules row (asked for, and LOADEDMODULES) and an env row per
    hardware entry."""
    plain = systems_table(cell_systems(_cell_records(), "gpu/a/r1"))
    assert not {"Modules", "Site environment (env:)"} & set(plain["field"])
    records = _cell_records()
    for rec in records[1:]:
        rec["value"]["site_env"] = {
            "modules": ["cuda/12.4", "nccl"],
            "module_list": "Currently Loaded Modules:\n  1) cuda/12.4   2) nccl/2.21",
            "module_init": "/etc/profile.d/lmod.sh",
            "module_vars": {"LOADEDMODULES": "cuda/12.4:nccl/2.21", "PATH": "/opt/cuda/bin"},
            "env": {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "ib0"},
        }
    table = systems_table(cell_systems(records, "gpu/a/r1")).set_index("field")
    assert table.loc["Modules", "value"] == "cuda/12.4 nccl (loaded: cuda/12.4 nccl/2.21)"
    env = table.loc["Site environment (env:)"]
    assert env["value"] == "NCCL_IB_HCA=mlx5 NCCL_SOCKET_IFNAME=ib0" and env["nodes"] == 2


def test_a_container_cell_names_its_image_and_digest_once_per_cell():
    records = _cell_records(nodes=1)
    digest = "sha256:" + "cd" * 32
    records[0]["value"]["cell"]["container"] = {"engine": "charliecloud", "image": "/img/pt"}
    records[0]["value"]["cell"]["container"]["digest"] = digest
    table = systems_table(cell_systems(records, "boxed/r1") + cell_systems(_cell_records(), "x"))
    row = table[table["field"] == "Container"]
    assert list(row["value"]) == [f"charliecloud /img/pt ({digest})"]
    assert list(row["mlperf_fields"]) == ["other_software_stack"]
