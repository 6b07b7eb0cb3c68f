"""Can each planned cell's environment drive its device? Checked before any job.

A GPU cell whose environment is a CPU build would fail inside its job, after its queue wait.
The driver checks every planned cell on the login node (no GPU needed, nothing imported): it
reads what each framework's installed build says of itself in the environment's site-packages:

- PyTorch (and Horovod's torch): `torch/version.py` names the CUDA release it was built with
  (`cuda = None` in a CPU build);
- TensorFlow and Keras: `tensorflow/python/platform/build_info.py` (`is_cuda_build`);
- Horovod: its torch extension links NCCL's collectives (built with HOROVOD_GPU_OPERATIONS=NCCL)
  or not (gloo only);
- MXNet: the distribution installed is a CUDA build (`mxnet-cu117`, ...) or the CPU `mxnet`.

A CPU cell runs in any build. Problems name the cells, the environment, what is missing and the
command that builds the right one; the workflow stops before any job (dry runs included).
`python -m dlscale.workflow.capability --env-dir DIR --framework F` prints one environment's answer
(scripts/setup.sh checks each CUDA environment it builds with it). Each framework's probe is named
by its record (dlscale.registry.frameworks, Framework.cuda_probe; dlscale.registry.cuda_probes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dlscale.registry.cuda_drivers import driver_jits, driver_runs, fitting_lines
from dlscale.registry.cuda_probes import built_cuda_version, site_packages
from dlscale.registry.frameworks import FRAMEWORKS, environments_folder
from dlscale.study.container_image import image_environment_dir, image_mount_problems

SETUP = "bash scripts/setup.sh"
CELLS_NAMED = 3  # cells listed by path per problem; the rest are counted


def cuda_build(framework: str, env_dir: Path) -> tuple[bool, str]:
    """(drives CUDA, what the environment says) for one framework's environment."""
    sp = site_packages(env_dir)
    if sp is None:
        return False, f"{env_dir} is not a Python environment (no lib/python3*/site-packages)"
    return FRAMEWORKS[framework].cuda_probe(sp)


def _cells_text(paths: list[str]) -> str:
    named = ", ".join(paths[:CELLS_NAMED])
    more = len(paths) - CELLS_NAMED
    return f"{len(paths)} cell(s) ({named}{f', and {more} more' if more > 0 else ''})"


def environment_problems(cells, hardware: dict, env_dir, *, route: str = "venv") -> list[str]:
    """What stops the planned cells before any job: a missing environment, a GPU cell whose
    environment cannot drive CUDA, or a framework whose CUDA build cannot drive the hardware.
    `env_dir(name)`: the folder of environment `name` (None: the driver's own environment);
    `route`: "venv" (dlscale's venvs) or the deployment method (conda, apptainer)."""
    from dlscale.study.hardware import environment_variant

    groups: dict[tuple[str, str, str], list[str]] = {}
    for cell in cells:
        variant = environment_variant(hardware[cell.hardware])
        groups.setdefault((cell.framework, variant, cell.hardware), []).append(cell.path)
    problems, checked = [], {}
    for (framework, variant, hw_key), paths in sorted(groups.items()):
        hw = hardware[hw_key]
        limit = FRAMEWORKS[framework].cuda_limit
        capability = hw.get("compute_capability")
        if hw["device"] == "cuda" and limit and capability is not None and capability > limit[0]:
            problems.append(
                f"{_cells_text(paths)} of {framework} on {hw_key!r} (compute capability "
                f"{capability}): {limit[1]}. Leave {framework} out of this hardware's cells "
                "(config `exclude`)"
            )
            continue
        if hw.get("container"):
            problems += _container_problems(framework, hw, hw_key, paths)
            continue
        name = FRAMEWORKS[framework].environment_for(variant, hw)
        if route != "venv":
            if hw["device"] == "cuda":
                problems.append(
                    f"{_cells_text(paths)} of {framework} on {hw_key!r} are GPU cells, but the "
                    f"{route} route builds CPU environments only (envs/<framework>.yaml). Run "
                    f"GPU cells in dlscale's venvs: {SETUP} {name}, then snakemake without "
                    "--sdm; or name the site's GPU image in the hardware entry (container: "
                    "{engine: apptainer, image: ...}; docs/pages/slurm.md, \"Containers\")"
                )
            continue
        folder = env_dir(name)
        shown = f"{environments_folder()}/{name}"  # .venvs/<env>, or under $DLSCALE_ENVS_DIR
        if folder is not None and not (Path(folder) / "bin" / "python").exists():
            problems.append(
                f"{_cells_text(paths)} of {framework} run in {shown}, which does not "
                f"exist; build it with: {SETUP} {name}"
            )
            continue
        if hw["device"] != "cuda":
            continue  # a CPU cell runs in any build
        key = (framework, name)
        if key not in checked:  # each environment's files read once, whatever its entries
            env = Path(folder or sys.prefix)
            sp = site_packages(env)
            cuda = built_cuda_version(sp) if sp is not None else None
            checked[key] = (*cuda_build(framework, env), cuda)
        ok, says, cuda = checked[key]
        where = shown if folder is not None else f"the driver environment ({sys.prefix})"
        if not ok:
            problems.append(
                f"{_cells_text(paths)} of {framework} on {hw_key!r} (device cuda) run in "
                f"{where}, which cannot drive a GPU: {says}. Build the CUDA environment with: "
                f"{SETUP} {name}"
            )
            continue
        problem = _driver_problem(framework, name, cuda, hw, hw_key) if cuda else None
        if problem:
            problems.append(f"{_cells_text(paths)} of {framework} run in {where}: {problem}")
    return problems


def _container_problems(framework: str, hw: dict, hw_key: str, paths: list[str]) -> list[str]:
    """A container entry's cells run in its image, whatever the route. Where the login node can
    read the image (a Charliecloud directory): its mount points and interpreter, and for GPU
    cells its framework build's CUDA (the probe of a venv, on the image's environment). Where it
    cannot (a SIF or SquashFS file, a registry reference), the entry's preflight checks the
    build inside the container on a node (dlscale.run.preflight_job)."""
    c = hw["container"]
    problems = [
        f"{_cells_text(paths)} of {framework}: {p}" for p in image_mount_problems(hw_key, c)
    ]
    env = image_environment_dir(c)
    if problems or env is None or hw["device"] != "cuda":
        return problems
    ok, says = cuda_build(framework, env)
    if not ok:
        return [
            f"{_cells_text(paths)} of {framework} on {hw_key!r} (device cuda) run in the "
            f"{c['engine']} image {c['image']}, whose environment ({c.get('python')}) cannot "
            f"drive a GPU: {says}. Install the framework's CUDA build in the image"
        ]
    sp = site_packages(env)
    cuda = built_cuda_version(sp) if sp is not None else None
    problem = _driver_problem(framework, "", cuda, hw, hw_key) if cuda else None
    return [f"{_cells_text(paths)} of {framework} in {c['image']}: {problem}"] if problem else []


def _driver_problem(framework: str, name: str, cuda: str, hw: dict, hw_key: str) -> str | None:
    """Why the entry's nodes cannot run the environment's CUDA `cuda` build (the driver table,
    dlscale.registry.cuda_drivers) and what to do; None where they can or nothing is stated."""
    record = FRAMEWORKS[framework]
    runs, why = driver_runs(hw, cuda)
    ptx = record.ptx_only_from
    capability = hw.get("compute_capability")
    if runs and ptx and capability is not None and capability >= ptx[0]:
        jits, short = driver_jits(hw, cuda)
        if not jits:
            return (
                f"{ptx[1]}: on compute capability {capability} ({hw_key!r}) the driver must "
                f"support CUDA {cuda} in full, and {short}. Leave {framework} out of this "
                "hardware's cells (config `exclude`), or upgrade the nodes' driver "
                '(docs/pages/gpu.md, "CUDA lines and the driver")'
            )
    if runs:
        return None
    where = f"hardware {hw_key!r}: nvidia_driver/max_cuda in the hardware file"
    if name in record.line_environments():
        return (
            f"{why} ({where}), and this environment is the {name.rsplit('-', 1)[1]} line's: it "
            f"holds another build; rebuild it with: {SETUP} {name}"
        )
    lines = fitting_lines(hw) if record.cuda_lines else []
    fix = (
        f"no CUDA line of {framework} that dlscale sets up runs on that driver "
        f"(lines: {', '.join(record.cuda_lines) or 'one, CUDA ' + cuda}); leave {framework} out "
        "of this hardware's cells (config `exclude`)"
        if not lines
        else f"the lines that run there: {', '.join(lines)}"
    )
    return (
        f"{why} ({where}). {fix[0].upper()}{fix[1:]}, or upgrade the nodes' driver, or state "
        "cuda_forward_compat: true where the nodes carry NVIDIA's forward-compatibility package "
        '(docs/pages/gpu.md, "CUDA lines and the driver")'
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlscale.workflow.capability", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--env-dir", type=Path, required=True, help="the environment's folder")
    parser.add_argument("--framework", required=True, choices=sorted(FRAMEWORKS))
    parser.add_argument(
        "--expect-cuda", action="store_true", help="exit 1 unless the build drives CUDA"
    )
    parser.add_argument(
        "--expect-cpu",
        action="store_true",
        help="exit 1 if the build drives CUDA (the driver's .venv: a CPU build)",
    )
    parser.add_argument(
        "--expect-cuda-version",
        default=None,
        help="exit 1 unless the build is for this CUDA version (e.g. 12.8: a CUDA line's)",
    )
    args = parser.parse_args(argv)
    ok, says = cuda_build(args.framework, args.env_dir)
    sp = site_packages(args.env_dir)
    built = built_cuda_version(sp) if sp is not None else None
    if args.expect_cuda_version is not None and built != args.expect_cuda_version:
        ok, says = (
            False,
            f"{says}; expected a build for CUDA {args.expect_cuda_version}, not {built}",
        )
    print(
        json.dumps(
            {
                "framework": args.framework,
                "env_dir": str(args.env_dir),
                "cuda": ok,
                "cuda_version": built,
                "detail": says,
            }
        )
    )
    if args.expect_cpu:
        return 1 if ok else 0
    return 1 if (args.expect_cuda or args.expect_cuda_version) and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
