#!/usr/bin/env bash
# Set up everything dlscale needs on a fresh Debian 12 machine (idempotent, safe to rerun):
#   - Debian packages: TeX Live (latexmk, pdflatex) for the report, poppler-utils (pdfinfo);
#     Lmod (the tests load modules with it, as a hardware entry's `modules:` do on a site);
#     Slurm + munge (and Lmod again) are installed by scripts/slurm/cluster-up.sh when a local
#     cluster is started;
#   - .venv: the driver environment (Snakemake, the Slurm executor plugin, pandas, matplotlib,
#     seaborn, jinja2, pytest) plus the PyTorch framework (pinned CPU wheel) and dlscale itself;
#   - .venvs/<env>: one venv per other framework environment (envs/<env>.txt): tensorflow
#     (also serves keras), mxnet, horovod (Horovod is built from its patched sdist by
#     scripts/build-horovod.sh, wheel cached in ~/.cache/dlscale/wheels for every clone).
#   - on a GPU site, the CUDA builds a GPU hardware entry's cells run in (environment_variant
#     cuda): pytorch-cuda, tensorflow-cuda (also keras), horovod-cuda (Horovod built with NCCL:
#     needs CUDA_HOME, the site's CUDA toolkit), mxnet-cuda (CUDA 11.7, pre-Hopper GPUs);
#     installed from PyPI with pip --isolated (no local CPU wheel can stand in) and checked
#     to be CUDA builds (python -m dlscale.workflow.capability) before they are marked ready;
#   - PyTorch's CUDA 12 lines for drivers older than CUDA 13 wants (R525-R570): pytorch-cu128,
#     pytorch-cu126, from PyTorch's wheel index ($DLSCALE_TORCH_INDEX, default
#     https://download.pytorch.org/whl) and PyPI ($DLSCALE_PYPI_INDEX); docs/pages/gpu.md.
# Usage: setup.sh [ENV ...]   (default: every CPU framework environment; `setup.sh none` builds
# only the driver; e.g. `setup.sh pytorch-cuda tensorflow-cuda horovod-cuda` on a GPU site).
# Needs root (or sudo) for apt. A venv is rebuilt only when its inputs change.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { printf '[setup] %s\n' "$*" >&2; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# The environments asked for, checked before anything is installed (pytorch's CPU build is part
# of .venv; workflow.txt is .venv's own list).
# The frameworks' records (dlscale.registry.frameworks) name them: read with the system Python's
# standard library alone, before any venv exists.
registry_envs() { PYTHONPATH=scripts python3 -m dlscale.registry environments "$1"; }
registry_pip_index() { PYTHONPATH=scripts python3 -m dlscale.registry pip-index "$1"; }
registry_line_cuda() { PYTHONPATH=scripts python3 -m dlscale.registry line-cuda "$1"; }
mapfile -t CPU_ENVS < <(registry_envs cpu)
mapfile -t CUDA_ENVS < <(registry_envs cuda)
[ ${#CPU_ENVS[@]} -gt 0 ] && [ ${#CUDA_ENVS[@]} -gt 0 ] || {
  log "could not read the environments from dlscale.registry (python3 -m dlscale.registry)"; exit 2; }
ENVS=("$@")
[ ${#ENVS[@]} -gt 0 ] || ENVS=("${CPU_ENVS[@]}")
for env in "${ENVS[@]}"; do
  [ "$env" = none ] && continue
  [[ " ${CPU_ENVS[*]} ${CUDA_ENVS[*]} " == *" $env "* ]] && [ -f "envs/$env.txt" ] || {
    log "unknown environment '$env'; allowed: ${CPU_ENVS[*]} ${CUDA_ENVS[*]} none"; exit 2; }
done

APT_PACKAGES=(latexmk texlive-latex-base texlive-latex-recommended texlive-fonts-recommended
              lmodern poppler-utils git lmod)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
APT_LOCK=/run/lock/dlscale-apt.lock   # one apt at a time (build-horovod.sh, cluster-up.sh)
apt_install() {
  $SUDO flock -w 1800 "$APT_LOCK" apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO flock -w 1800 "$APT_LOCK" \
    apt-get install -y -q --no-install-recommends "$@"
}
# The venvs need python3-venv first; TeX and the rest install while the venvs build (apt and
# pip wait on the network and the disk more than on the CPUs): waited for at the end.
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  log "installing Debian package python3-venv"
  apt_install python3-venv
fi
mkdir -p "$ROOT/.cache"
APT_LOG=$ROOT/.cache/setup-apt.log
apt_pid=""
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages in the background: ${missing[*]} (log: $APT_LOG)"
  apt_install "${missing[@]}" >"$APT_LOG" 2>&1 &
  apt_pid=$!
fi
wait_for_apt() {
  [ -n "$apt_pid" ] || return 0
  if wait "$apt_pid"; then
    log "Debian packages installed: ${missing[*]}"
  else
    tail -n 30 "$APT_LOG" >&2
    log "installing ${missing[*]} failed (log above, whole: $APT_LOG)"; exit 1
  fi
  apt_pid=""
}

VENV=$ROOT/.venv
STAMP=$VENV/.dlscale-setup
want=$(cat envs/workflow.txt envs/pytorch.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  log ".venv is up to date"
else
  log "building .venv (Snakemake, analysis stack, torch==2.13.0 CPU, dlscale)"
  python3 -m venv "$VENV"
  # The venv's bundled pip (23.2) crashes byte-compiling the torch 2.13 wheel: upgrade it first.
  "$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
  "$VENV/bin/python" -m pip install -q -r envs/workflow.txt -r envs/pytorch.txt
  "$VENV/bin/python" -m pip install -q --no-deps -e .
  echo "$want" > "$STAMP"
fi
# (versions from the installed metadata: importing snakemake or torch here would cost seconds
# on every run of the demo and the tests)
log "driver ready: $("$VENV/bin/python" -c 'from importlib.metadata import version as v; print("snakemake", v("snakemake") + ", torch", v("torch"))')"

# One venv per framework environment (keras runs in the tensorflow one), built side by side
# (each pip install waits on downloads and the disk; Horovod's build is the one that computes),
# each with its own log; a failure prints its log's tail and fails the set-up.
build_env() {
  local env=$1 req target base inputs pip_args want package start
  req=envs/$env.txt
  target=$ROOT/.venvs/$env
  base=${env%-cuda}
  inputs=("$req")
  pip_args=()
  mapfile -t line_index < <(registry_pip_index "$env" | grep -v '^$')
  if [ ${#line_index[@]} -gt 0 ]; then
    # a CUDA line of its own (pytorch-cu128, ...): torch from PyTorch's index for the line (or
    # the site's mirror, DLSCALE_TORCH_INDEX), the rest from PyPI (DLSCALE_PYPI_INDEX); its -r
    # include is part of its inputs
    base=${env%-cu*}
    inputs+=("envs/$base-cuda.txt")
    pip_args=(--isolated "${line_index[@]}")
  elif [ "$base" != "$env" ]; then
    # a CUDA build: its -r include is part of its inputs; PyPI only, no local CPU wheel or cap
    [ -f "envs/$base.txt" ] && inputs+=("envs/$base.txt")
    pip_args=(--isolated)
  fi
  [ "$base" = horovod ] && inputs+=(scripts/build-horovod.sh envs/patches/*.patch)
  want=$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)
  package=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -x "$target/bin/python" ] && [ "$(cat "$target/.dlscale-setup" 2>/dev/null)" = "$want" ]; then
    # the requirements are built; a pyproject change (entry points, metadata) only needs the
    # editable dlscale package reinstalled, not the environment rebuilt
    if [ "$(cat "$target/.dlscale-package" 2>/dev/null)" != "$package" ]; then
      log ".venvs/$env: reinstalling the dlscale package (pyproject.toml changed)"
      "$target/bin/python" -m pip install -q --no-deps -e .
      echo "$package" > "$target/.dlscale-package"
    fi
    log ".venvs/$env is up to date"
    return 0
  fi
  log "building .venvs/$env from $req"
  start=$(date +%s)
  rm -rf "$target"
  python3 -m venv "$target"
  "$target/bin/python" -m pip install -q --upgrade "pip>=24"
  "$target/bin/python" -m pip install -q "${pip_args[@]}" -r "$req"
  "$target/bin/python" -m pip install -q --no-deps -e .
  if [ "$env" = horovod ]; then bash scripts/build-horovod.sh "$target"; fi
  if [ "$env" = horovod-cuda ]; then bash scripts/build-horovod.sh --cuda "$target"; fi
  if [ "$base" != "$env" ]; then
    # the environment must drive a GPU (read from its files: no GPU needed on this host)
    line_cuda=()
    [ ${#line_index[@]} -gt 0 ] && line_cuda=(--expect-cuda-version "$(registry_line_cuda "$env")")
    "$target/bin/python" -m dlscale.workflow.capability --env-dir "$target" --framework "$base" --expect-cuda "${line_cuda[@]}" \
      || { log ".venvs/$env is not a CUDA build (see above); not marked ready"; return 1; }
  fi
  echo "$want" > "$target/.dlscale-setup"
  echo "$package" > "$target/.dlscale-package"
  log ".venvs/$env ready in $(( $(date +%s) - start )) s, $(du -sh "$target" | cut -f1)"
}

pids=() names=()
for env in "${ENVS[@]}"; do
  [ "$env" = none ] && continue
  build_env "$env" >"$ROOT/.cache/setup-$env.log" 2>&1 &
  pids+=($!) names+=("$env")
done
failed=()
for i in "${!pids[@]}"; do
  env=${names[$i]}
  if wait "${pids[$i]}"; then
    cat "$ROOT/.cache/setup-$env.log" >&2
  else
    tail -n 40 "$ROOT/.cache/setup-$env.log" >&2
    log ".venvs/$env failed (log above, whole: .cache/setup-$env.log)"
    failed+=("$env")
  fi
done
wait_for_apt
[ ${#failed[@]} -eq 0 ] || { log "set-up failed for: ${failed[*]}"; exit 1; }
