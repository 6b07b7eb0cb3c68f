#!/usr/bin/env bash
# Set up everything dlscale needs, as a plain user on a login node or as root on a fresh Debian 12
# machine (idempotent, safe to rerun):
#   - .venv: the driver environment (Snakemake, the Slurm executor plugin, pandas, matplotlib,
#     seaborn, jinja2, pytest) plus the PyTorch framework (pinned CPU wheel) and dlscale itself;
#     on a GPU site whose index serves PyTorch's CUDA build, DLSCALE_DRIVER_TORCH_INDEX names a
#     CPU wheel index for the driver's torch (e.g. https://download.pytorch.org/whl/cpu): the
#     same pin, a CPU build, without ~3 GB of CUDA libraries (the environment's identity, the
#     hash of envs/pytorch.txt, does not change); installed with uv (envs/installer.txt's pin,
#     fetched once per machine by pip into ~/.cache/dlscale) where pip's indexes serve it and it
#     can follow every setting of pip's configuration (the same packages: indexes, find-links,
#     constraints, certificates translated by dlscale.workflow.installer), else with pip;
#     DLSCALE_INSTALLER=pip: pip always;
#   - <envs>/<env>: one venv per other framework environment (envs/<env>.txt), in .venvs/ or in
#     $DLSCALE_ENVS_DIR (project or scratch space; the workflow looks there too): tensorflow
#     (also serves keras), mxnet, horovod (Horovod is built from its patched sdist by
#     scripts/build-horovod.sh, wheel cached in ~/.cache/dlscale/wheels for every clone).
#   - on a GPU site, the CUDA builds a GPU hardware entry's cells run in (environment_variant
#     cuda): pytorch-cuda, tensorflow-cuda (also keras), horovod-cuda (Horovod built with NCCL:
#     needs CUDA_HOME, the site's CUDA toolkit), mxnet-cuda (CUDA 11.7, pre-Hopper GPUs);
#     installed with the user's and the site's pip configuration (pip.conf, PIP_* variables: a
#     site's mirror) and checked to be CUDA builds (python -m dlscale.workflow.capability)
#     before they are marked ready: a CPU wheel that stood in (a find-links folder, an index of
#     +cpu builds) is refused there;
#   - PyTorch's CUDA 12 lines for drivers older than CUDA 13 wants (R525-R570): pytorch-cu128,
#     pytorch-cu126, from PyTorch's wheel index ($DLSCALE_TORCH_INDEX, default
#     https://download.pytorch.org/whl) and PyPI ($DLSCALE_PYPI_INDEX); docs/pages/gpu.md.
# No root and no apt unless asked: --system-packages installs the Debian packages (TeX Live and
# latexmk for the report PDF, poppler-utils, git, python3-venv, and Lmod, which the tests load
# modules with as a hardware entry's `modules:` do on a site) with apt-get (through sudo when
# not root); the demo and test commands ask for it when run as root. Otherwise the tools are
# looked for on PATH (e.g. after a site's `module load texlive`): without TeX every study builds
# everything but its PDF and says so at the start of each run.
# The interpreter: --python PATH, else $DLSCALE_PYTHON, else python3; Python >= 3.11 (pyproject's
# requires-python), with venv and ensurepip.
# Usage: setup.sh [--system-packages] [--check] [--python PATH] [ENV ...]   (default: every CPU framework
# environment; `setup.sh none` builds only the driver; e.g.
# `setup.sh pytorch-cuda tensorflow-cuda horovod-cuda` on a GPU site).
# --check builds and installs nothing: it says what a set-up would build, and exits 0 when
# everything asked for is up to date, 1 otherwise.
# A venv is rebuilt only when its inputs or its interpreter change.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { printf '[setup] %s\n' "$*" >&2; }
usage() { sed -n '2,/^# A venv is rebuilt/s/^# \{0,1\}//p' "$0" >&2; }

SYSTEM_PACKAGES=0
CHECK=0
PYTHON=${DLSCALE_PYTHON:-python3}
ENVS=()
while [ $# -gt 0 ]; do
  case $1 in
    --system-packages) SYSTEM_PACKAGES=1 ;;
    --check) CHECK=1 ;;
    --python) [ $# -ge 2 ] || { log "--python needs an interpreter (a path or a name on PATH)"; exit 2; }
              PYTHON=$2; shift ;;
    --python=*) PYTHON=${1#--python=} ;;
    -h|--help) usage; exit 0 ;;
    -*) log "unknown option '$1'; allowed: --system-packages, --check, --python PATH, -h"; exit 2 ;;
    *) ENVS+=("$1") ;;
  esac
  shift
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
APT_LOCK=/run/lock/dlscale-apt.lock   # one apt at a time (build-horovod.sh, cluster-up.sh)
apt_install() {
  $SUDO flock -w 1800 "$APT_LOCK" apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO flock -w 1800 "$APT_LOCK" \
    apt-get install -y -q --no-install-recommends "$@"
}

# The interpreter, checked before anything is built: Python >= pyproject's requires-python, with
# venv and ensurepip (Debian's python3-venv: installed with --system-packages).
MIN_PYTHON=$(sed -n 's/^requires-python = ">=\([0-9.]*\)"$/\1/p' pyproject.toml)
PYTHON_PATH=$(command -v "$PYTHON" || true)
[ -n "$PYTHON_PATH" ] || {
  log "no Python interpreter '$PYTHON' (--python / DLSCALE_PYTHON, default python3); pick one with --python PATH, e.g. after \`module load python/$MIN_PYTHON\`"
  exit 2; }
# One look at the interpreter, as it says itself: its version, the binary it runs
# (sys._base_executable resolved: the base interpreter behind a venv; a pyenv shim, conda,
# uv-managed or module Python names its real binary, so a venv built from it compares equal and
# is rebuilt only when the interpreter really changes: a shim is a script, and resolving its path
# would never match the venv's link) and whether it has venv and ensurepip. Everything after
# runs that binary, not the shim (a shim costs ~0.1 s a call).
PROBE='import os, sys
print("%d.%d" % sys.version_info[:2])
print(int(sys.version_info >= tuple(map(int, "'"$MIN_PYTHON"'".split(".")))))
print(os.path.realpath(sys._base_executable))
try:
    import ensurepip, venv
    print(1)
except ImportError:
    print(0)'
mapfile -t probe < <("$PYTHON_PATH" -c "$PROBE" 2>/dev/null || true)
[ ${#probe[@]} -eq 4 ] || {
  log "$PYTHON_PATH did not run as a Python interpreter (--python / DLSCALE_PYTHON, default python3); pick one with --python PATH"
  exit 2; }
PYTHON_VERSION=${probe[0]}
INTERPRETER=${probe[2]}
[ "${probe[1]}" = 1 ] || {
  log "$PYTHON_PATH is Python $PYTHON_VERSION; dlscale needs Python >= $MIN_PYTHON (Snakemake 9, pandas 3). Pick another with --python PATH or DLSCALE_PYTHON=PATH, e.g. after \`module load python/$MIN_PYTHON\`: --python python$MIN_PYTHON"
  exit 2; }
if [ "${probe[3]}" != 1 ]; then
  if [ "$SYSTEM_PACKAGES" = 1 ]; then
    log "installing Debian package python3-venv"
    apt_install python3-venv
  else
    log "$PYTHON_PATH (Python $PYTHON_VERSION) has no venv/ensurepip: install Debian's python3-venv (as root: bash scripts/setup.sh --system-packages) or pick another interpreter with --python PATH"
    exit 2
  fi
fi
# the base interpreter a venv was built from, as its own python says (empty: no venv there)
interpreter_of() {
  if [ -x "$1/bin/python" ]; then
    "$1/bin/python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))' 2>/dev/null || true
  fi; }

# The environments asked for, checked before anything is installed (pytorch's CPU build is part
# of .venv; workflow.txt is .venv's own list).
# The frameworks' records (dlscale.registry.frameworks) name them: read with the chosen Python's
# standard library alone, before any venv exists.
registry() { PYTHONPATH=scripts "$INTERPRETER" -m dlscale.registry "$@"; }
# all of it in one interpreter's start (`registry setup`: a line per list, then the folder)
mapfile -t facts < <(registry setup)
read -ra CPU_ENVS <<< "${facts[0]:-}"
read -ra CUDA_ENVS <<< "${facts[1]:-}"
# layered environments (a venv over another one's site-packages: pytorch-hf, transformers and
# accelerate over the driver's torch; dlscale.registry.model_sources): one over .venv is built
# beside the framework environments, one over another environment after it
read -ra LAYERED_CPU <<< "${facts[2]:-}"
read -ra LAYERED_CUDA <<< "${facts[3]:-}"
LAYERED_ENVS=("${LAYERED_CPU[@]}" "${LAYERED_CUDA[@]}")
# where the framework environments go: .venvs/ or $DLSCALE_ENVS_DIR (the workflow reads the same)
ENVS_DIR=${facts[4]:-}
[ ${#CPU_ENVS[@]} -gt 0 ] && [ ${#CUDA_ENVS[@]} -gt 0 ] && [ -n "$ENVS_DIR" ] || {
  log "could not read the environments from dlscale.registry ($INTERPRETER -m dlscale.registry)"; exit 2; }
DEFAULT_ENVS=0
[ ${#ENVS[@]} -gt 0 ] || { ENVS=("${CPU_ENVS[@]}" "${LAYERED_CPU[@]}"); DEFAULT_ENVS=1; }
for env in "${ENVS[@]}"; do
  [ "$env" = none ] && continue
  [[ " ${CPU_ENVS[*]} ${CUDA_ENVS[*]} ${LAYERED_ENVS[*]} " == *" $env "* ]] && [ -f "envs/$env.txt" ] || {
    log "unknown environment '$env'; allowed: ${CPU_ENVS[*]} ${CUDA_ENVS[*]} ${LAYERED_ENVS[*]} none"; exit 2; }
done

# System tools: installed with --system-packages (TeX and the rest while the venvs build: apt and
# pip wait on the network and the disk more than on the CPUs; waited for at the end), else looked
# for on PATH and named once when missing.
# charliecloud-runtime (ch-run) and debootstrap: the container entry the tests run
# (tests/slurm/test_containers.py, its image built by scripts/build-image.sh); postgresql: the
# PostgreSQL server the results database's tests run against (scripts/postgres/up.sh)
APT_PACKAGES=(latexmk texlive-latex-base texlive-latex-recommended texlive-fonts-recommended
              lmodern poppler-utils git lmod charliecloud-runtime debootstrap postgresql)
mkdir -p "$ROOT/.cache"
APT_LOG=$ROOT/.cache/setup-apt.log
apt_pid=""
stale=()   # what --check found out of date
if [ "$SYSTEM_PACKAGES" = 1 ]; then
  missing=()
  # one dpkg-query for all of them (a package it does not know is not listed: missing too)
  installed=" $(dpkg-query -W -f='${Package} ${Status}\n' "${APT_PACKAGES[@]}" 2>/dev/null \
               | awk '/ install ok installed$/ {printf "%s ", $1}')"
  for pkg in "${APT_PACKAGES[@]}"; do
    [[ $installed == *" $pkg "* ]] || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ] && [ "$CHECK" = 1 ]; then
    log "would install Debian packages: ${missing[*]}"
    stale+=("${missing[@]}")
  elif [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages in the background: ${missing[*]} (log: $APT_LOG)"
    apt_install "${missing[@]}" >"$APT_LOG" 2>&1 &
    apt_pid=$!
  fi
else
  tex_missing=()
  for tool in latexmk pdflatex; do command -v "$tool" >/dev/null || tex_missing+=("$tool"); done
  if [ ${#tex_missing[@]} -gt 0 ]; then
    log "no TeX on PATH (${tex_missing[*]}): studies build everything but the report PDF and say so at the start of each run; for the PDF put TeX Live on PATH (e.g. \`module load texlive\`) or, as root, run bash scripts/setup.sh --system-packages"
  fi
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

# The driver's .venv stays in the checkout (the documented commands run .venv/bin/...).
VENV=$ROOT/.venv
# The driver's installer: uv (envs/installer.txt's pin), installed once per machine by the
# interpreter's pip into the user's dlscale cache, where pip's configuration has nothing uv cannot
# follow (dlscale.workflow.installer check) and pip's indexes serve it; else pip, as always with
# DLSCALE_INSTALLER=pip. Asked before the venv exists (uv's venv needs no pip of its own to start
# with). Prints uv's path, or fails (and says why) for pip.
uv_for_driver() {
  local pin dir tmp why
  [ "${DLSCALE_INSTALLER:-uv}" = uv ] || { log "installing with pip (DLSCALE_INSTALLER=$DLSCALE_INSTALLER)"; return 1; }
  why=$(PYTHONPATH=scripts "$INTERPRETER" -m dlscale.workflow.installer check 2>&1) || {
    log "installing with pip: ${why:-no pip beside $INTERPRETER}"; return 1; }
  pin=$(grep -o '^uv==[^ #]*' envs/installer.txt) || return 1
  dir=${DLSCALE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dlscale}/${pin/==/-}
  if ! "$dir/bin/uv" --version >/dev/null 2>&1; then
    mkdir -p "${dir%/*}"
    tmp=$(mktemp -d "$dir.XXXXXX")
    if ! "$INTERPRETER" -m pip install -q --target "$tmp" "$pin" >"$ROOT/.cache/setup-uv.log" 2>&1; then
      rm -rf "$tmp"
      log "installing with pip: pip gave no $pin (.cache/setup-uv.log)"
      return 1
    fi
    if mv -T "$tmp" "$dir" 2>/dev/null; then :
    elif "$dir/bin/uv" --version >/dev/null 2>&1; then rm -rf "$tmp"   # another set-up's came first
    else dir=$tmp   # a copy there that does not run: this set-up uses its own
    fi
  fi
  echo "$dir/bin/uv"
}
uv_install() { PYTHONPATH=scripts "$INTERPRETER" -m dlscale.workflow.installer install --venv "$VENV" --uv "$uv" "$@"; }
STAMP=$VENV/.dlscale-setup
TORCH_PIN=$(sed -n 's/^\(torch==[^ #]*\).*/\1/p' envs/pytorch.txt)
# the driver's torch: envs/pytorch.txt's pin from the site's CPU wheel index where one is named
# (a change of index rebuilds .venv; it is no part of the environment's identity)
driver_torch_index=${DLSCALE_DRIVER_TORCH_INDEX:-}
want=$( { cat envs/workflow.txt envs/pytorch.txt pyproject.toml
          [ -z "$driver_torch_index" ] || echo "torch from $driver_torch_index"; } | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
   && [ "$(interpreter_of "$VENV")" = "$INTERPRETER" ]; then
  log ".venv is up to date"
elif [ "$CHECK" = 1 ]; then
  log "would build .venv with $PYTHON_PATH ($INTERPRETER, Python $PYTHON_VERSION; now: $(interpreter_of "$VENV" | grep . || echo none), inputs $( [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] && echo unchanged || echo changed))"
  stale+=(.venv)
else
  log "building .venv with $PYTHON_PATH (Python $PYTHON_VERSION): Snakemake, analysis stack, $TORCH_PIN CPU, dlscale"
  clear=()
  [ ! -e "$VENV/bin/python" ] || [ "$(interpreter_of "$VENV")" = "$INTERPRETER" ] || clear=(--clear)
  if uv=$(uv_for_driver); then
    # the same packages as pip's lines below (pip's configuration translated; pip itself
    # installed as pip upgrades itself there), faster, then byte-compiled as pip compiles
    # (the packages' test suites aside: dlscale.workflow.installer)
    log "installing with uv ($uv)"
    "$PYTHON_PATH" -m venv --without-pip "${clear[@]}" "$VENV"
    if [ -n "$driver_torch_index" ]; then
      log "the driver's torch from $driver_torch_index (DLSCALE_DRIVER_TORCH_INDEX)"
      uv_install --index-url "$driver_torch_index" -- --no-deps "$TORCH_PIN"
    fi
    uv_install -- "pip>=24" -r envs/workflow.txt -r envs/pytorch.txt
    uv_install -- --no-deps -e .
    PYTHONPATH=scripts "$INTERPRETER" -m dlscale.workflow.installer compile --venv "$VENV"
  else
    "$PYTHON_PATH" -m venv "${clear[@]}" "$VENV"
    # The venv's bundled pip (23.2) crashes byte-compiling the torch 2.13 wheel: upgrade it first.
    "$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
    if [ -n "$driver_torch_index" ]; then
      log "the driver's torch from $driver_torch_index (DLSCALE_DRIVER_TORCH_INDEX)"
      "$VENV/bin/python" -m pip install -q --no-deps --index-url "$driver_torch_index" "$TORCH_PIN"
    fi
    "$VENV/bin/python" -m pip install -q -r envs/workflow.txt -r envs/pytorch.txt
    "$VENV/bin/python" -m pip install -q --no-deps -e .
  fi
  # dlscale's own modules byte-compiled once, as the installers compile site-packages: every
  # process of a study imports them (the driver, each cell's launcher and ranks), and where
  # PYTHONDONTWRITEBYTECODE is set none of them would keep what it compiled
  # (a file that does not compile fails where it is imported, not here)
  "$VENV/bin/python" -m compileall -q -j0 scripts >/dev/null || true
  # the driver runs PyTorch's CPU cells and the workflow: a CUDA build there is GBs for nothing
  if ! torch_build=$(PYTHONPATH=scripts "$INTERPRETER" -m dlscale.workflow.capability \
                     --env-dir "$VENV" --framework pytorch --expect-cpu); then
    if [ -n "$driver_torch_index" ]; then
      log "$driver_torch_index gave .venv a CUDA build of torch ($torch_build); name a CPU wheel index in DLSCALE_DRIVER_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu)"
      exit 1
    fi
    log "note: .venv's torch is a CUDA build (your pip index serves one: several GB); DLSCALE_DRIVER_TORCH_INDEX=<a CPU wheel index> (e.g. https://download.pytorch.org/whl/cpu) gives the driver the same pin as a CPU build"
  fi
  echo "$want" > "$STAMP"
fi
# (versions from the installed metadata, named by their dist-info folders: importing snakemake
# or torch here would cost seconds, and even importlib.metadata an interpreter's start, on every
# run of the demo and the tests)
installed_version() {
  local info
  for info in "$VENV"/lib/python*/site-packages/"$1"-*.dist-info; do
    [ -d "$info" ] && { info=${info##*/}; info=${info%.dist-info}; echo "${info#"$1"-}"; return 0; }
  done
  echo "not installed"
}
[ "$CHECK" = 1 ] || log "driver ready: snakemake $(installed_version snakemake), torch $(installed_version torch)"

# One venv per framework environment (keras runs in the tensorflow one), built side by side
# (each pip install waits on downloads and the disk; Horovod's build is the one that computes),
# each with its own log; a failure prints its log's tail and fails the set-up.
build_env() {
  local env=$1 req target base inputs pip_args want package start
  req=envs/$env.txt
  target=$ENVS_DIR/$env
  base=${env%-cuda}
  inputs=("$req")
  pip_args=()
  mapfile -t line_index < <(registry pip-index "$env" | grep -v '^$')
  if [ ${#line_index[@]} -gt 0 ]; then
    # a CUDA line of its own (pytorch-cu128, ...): torch from PyTorch's index for the line (or
    # the site's mirror, DLSCALE_TORCH_INDEX), the rest from PyPI (DLSCALE_PYPI_INDEX); its -r
    # include is part of its inputs
    base=${env%-cu*}
    inputs+=("envs/$base-cuda.txt")
    pip_args=("${line_index[@]}")
  elif [ "$base" != "$env" ]; then
    # a CUDA build: its -r include is part of its inputs
    [ -f "envs/$base.txt" ] && inputs+=("envs/$base.txt")
  fi
  [ "$base" = horovod ] && inputs+=(scripts/build-horovod.sh envs/patches/*.patch)
  want=$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)
  package=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -x "$target/bin/python" ] && [ "$(cat "$target/.dlscale-setup" 2>/dev/null)" = "$want" ] \
     && [ "$(interpreter_of "$target")" = "$INTERPRETER" ]; then
    # the requirements are built; a pyproject change (entry points, metadata) only needs the
    # editable dlscale package reinstalled, not the environment rebuilt
    if [ "$(cat "$target/.dlscale-package" 2>/dev/null)" != "$package" ]; then
      log "$target: reinstalling the dlscale package (pyproject.toml changed)"
      "$target/bin/python" -m pip install -q --no-deps -e .
      echo "$package" > "$target/.dlscale-package"
    fi
    log "$target is up to date"
    return 0
  fi
  if [ "$CHECK" = 1 ]; then
    log "would build $target from $req with $INTERPRETER"
    return 3
  fi
  log "building $target from $req"
  start=$(date +%s)
  rm -rf "$target"
  mkdir -p "$ENVS_DIR"
  "$PYTHON_PATH" -m venv "$target"
  "$target/bin/python" -m pip install -q --upgrade "pip>=24"
  "$target/bin/python" -m pip install -q "${pip_args[@]}" -r "$req"
  "$target/bin/python" -m pip install -q --no-deps -e .
  if [ "$env" = horovod ]; then bash scripts/build-horovod.sh "$target"; fi
  if [ "$env" = horovod-cuda ]; then bash scripts/build-horovod.sh --cuda "$target"; fi
  if [ "$base" != "$env" ]; then
    # the environment must drive a GPU (read from its files: no GPU needed on this host); pip
    # installed it with the user's and the site's configuration, so a CPU wheel it found there
    # (a find-links folder, an index of +cpu builds) is refused here
    line_cuda=()
    [ ${#line_index[@]} -gt 0 ] && line_cuda=(--expect-cuda-version "$(registry line-cuda "$env")")
    "$target/bin/python" -m dlscale.workflow.capability --env-dir "$target" --framework "$base" --expect-cuda "${line_cuda[@]}" || {
      log "$target is not a CUDA build (see above); not marked ready. pip's configuration (pip config list):"
      "$target/bin/python" -m pip config list >&2 || true
      log "a CPU wheel from it stood in for the CUDA build: rerun without it, e.g. PIP_FIND_LINKS= (empty) for a find-links folder of CPU wheels, or PIP_INDEX_URL=<an index with the CUDA build>"
      return 1; }
  fi
  echo "$want" > "$target/.dlscale-setup"
  echo "$package" > "$target/.dlscale-package"
  log "$target ready in $(( $(date +%s) - start )) s, $(du -sh "$target" | cut -f1)"
}

# A layered environment: a venv without pip of its own whose .pth file adds its base's
# site-packages (the driver's .venv, or <envs>/<base>) with site.addsitedir (so the base's own
# .pth files, the editable dlscale among them, count too); pip (the base's) installs only what
# envs/<env>.txt names and the base lacks. Rebuilt when its requirements, its base or the
# interpreter change; seconds where pip's cache holds the wheels.
build_layered() {
  local env=$1 base base_dir target want start site
  base=$(registry layered-base "$env")
  base_dir=$VENV
  [ -z "$base" ] || base_dir=$ENVS_DIR/$base
  target=$ENVS_DIR/$env
  [ -x "$base_dir/bin/python" ] || {
    log "$target: its base $base_dir is not built (bash scripts/setup.sh ${base:-none} first)"; return 1; }
  want=$(cat "envs/$env.txt" "$base_dir/.dlscale-setup" 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [ -x "$target/bin/python" ] && [ "$(cat "$target/.dlscale-setup" 2>/dev/null)" = "$want" ] \
     && [ "$(interpreter_of "$target")" = "$INTERPRETER" ]; then
    log "$target is up to date"
    return 0
  fi
  if [ "$CHECK" = 1 ]; then
    log "would build $target from envs/$env.txt over $base_dir"
    return 3
  fi
  log "building $target from envs/$env.txt, layered over $base_dir"
  start=$(date +%s)
  rm -rf "$target"
  mkdir -p "$ENVS_DIR"
  "$INTERPRETER" -m venv --without-pip "$target"
  site=$("$base_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$site')" \
    > "$("$target/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_dlscale_base.pth"
  "$target/bin/python" -m pip install -q -r "envs/$env.txt"
  "$target/bin/python" -c 'import transformers, accelerate, torch, dlscale' || {
    log "$target cannot import its packages (see above)"; return 1; }
  echo "$want" > "$target/.dlscale-setup"
  log "$target ready in $(( $(date +%s) - start )) s, $(du -sh "$target" | cut -f1)"
}

# An environment's build has ended with RC (3: stale under --check): its log shown, and it
# counted as stale or failed
built() {
  local env=$1 rc=$2
  if [ "$rc" = 0 ] || { [ "$rc" = 3 ] && [ "$CHECK" = 1 ]; }; then
    cat "$ROOT/.cache/setup-$env.log" >&2
    [ "$rc" = 0 ] || stale+=("$env")
  else
    tail -n 40 "$ROOT/.cache/setup-$env.log" >&2
    log "$ENVS_DIR/$env failed (log above, whole: .cache/setup-$env.log)"
    failed+=("$env")
  fi
}
# torchao for the float8 tests on a CPU (tests/unit/frameworks/test_llm_step.py): a package
# folder over the driver's torch, never in .venv (envs/pytorch.txt is in every PyTorch cell's
# identity); built with the default environments, rebuilt when its pins change
FLOAT8_DIR=$ENVS_DIR/pytorch-float8
build_float8() {
  local want
  want=$(cat envs/pytorch-float8.txt "$VENV/.dlscale-setup" 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$FLOAT8_DIR/.dlscale-setup" 2>/dev/null)" = "$want" ]; then
    log "$FLOAT8_DIR is up to date"; return 0
  fi
  if [ "$CHECK" = 1 ]; then log "would build $FLOAT8_DIR from envs/pytorch-float8.txt"; return 3; fi
  rm -rf "$FLOAT8_DIR"
  "$VENV/bin/python" -m pip install -q --no-deps --target "$FLOAT8_DIR" -r envs/pytorch-float8.txt
  echo "$want" > "$FLOAT8_DIR/.dlscale-setup"
  log "$FLOAT8_DIR ready (torchao for the float8 tests)"
}
pids=() names=() layered=()
start_build() {  # ENV BUILDER: in the background, with its own log
  "$2" "$1" >"$ROOT/.cache/setup-$1.log" 2>&1 &
  pids+=($!) names+=("$1")
}
for env in "${ENVS[@]}"; do
  [ "$env" = none ] && continue
  if [[ " ${LAYERED_ENVS[*]} " == *" $env "* ]]; then
    # layered over the driver's .venv (built above): beside the others; over another
    # environment: after it
    if [ -z "$(registry layered-base "$env")" ]; then start_build "$env" build_layered
    else layered+=("$env"); fi
    continue
  fi
  start_build "$env" build_env
done
[ "$DEFAULT_ENVS" = 0 ] || start_build pytorch-float8 build_float8
failed=()
for i in "${!pids[@]}"; do
  env=${names[$i]}
  rc=0
  wait "${pids[$i]}" || rc=$?
  built "$env" "$rc"
done
for env in "${layered[@]}"; do   # over another environment: after it
  rc=0
  build_layered "$env" >"$ROOT/.cache/setup-$env.log" 2>&1 || rc=$?
  built "$env" "$rc"
done
wait_for_apt
[ ${#failed[@]} -eq 0 ] || { log "set-up failed for: ${failed[*]}"; exit 1; }
if [ "$CHECK" = 1 ]; then
  [ ${#stale[@]} -eq 0 ] || { log "not up to date: ${stale[*]} (bash scripts/setup.sh builds them)"; exit 1; }
  log "everything asked for is up to date"
fi
