#!/usr/bin/env bash
# Build and install Horovod into a framework venv, reproducibly:
#
#   scripts/build-horovod.sh <venv-dir>          e.g. scripts/build-horovod.sh .venvs/horovod
#
# Horovod 0.28.1 is the last release, ships no Linux wheel on PyPI and does not build unmodified
# against PyTorch 2.13 (C++14 vs PyTorch's C++17 headers). This script
#   1. installs missing Debian build tools (cmake >= 3.13, g++, make, patch);
#   2. fetches the pinned sdist from PyPI with pip and checks its sha256 (pinned below);
#   3. applies envs/patches/horovod-0.28.1-cxx17.patch;
#   4. builds a wheel inside the venv (pip wheel --no-build-isolation --no-deps, so it compiles
#      against the venv's own torch) with PyTorch + gloo only: no MPI, TensorFlow or MXNet;
#   5. caches the wheel in ~/.cache/dlscale/wheels/horovod-<version>-<key>/ (DLSCALE_CACHE_DIR,
#      else $XDG_CACHE_HOME/dlscale: shared by every clone on the machine) with the inputs it was built
#      from (sdist sha256, patch sha256, torch version, Python version, build switches) and
#      reuses it when they match;
#   6. installs it (--no-deps: the runtime requirements come from envs/horovod.txt) and checks
#      that horovod.torch imports with gloo built.
# Idempotent: rerunning with nothing changed only checks (a stamp in the venv records the key).
# The venv must already have envs/horovod.txt installed (torch, cffi, setuptools, wheel, ...).
# Environment: MAKEFLAGS (default -j<min(nproc,8)>); HOROVOD_GPU_OPERATIONS=NCCL on a CUDA site
# (recorded in the cache key).
set -euo pipefail

HOROVOD_VERSION=0.28.1
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0

log() { printf '[build-horovod] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CUDA=0
PRINT_ONLY=0
while [ $# -gt 1 ]; do
  case $1 in
    --cuda) CUDA=1; shift ;;              # GPU operations through NCCL (a GPU site)
    --print-build-env) PRINT_ONLY=1; shift ;;  # print the build line and stop
    *) die "unknown option: $1 (allowed: --cuda, --print-build-env)" ;;
  esac
done
[ $# -eq 1 ] || die "usage: $0 [--cuda] [--print-build-env] <venv-dir>"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$(cd "$1" 2>/dev/null && pwd) || die "no such venv directory: $1"
PY=$VENV/bin/python
[ -x "$PY" ] || die "$PY not found: create the venv and install envs/horovod.txt first"
PATCH_FILE=$ROOT/envs/patches/horovod-$HOROVOD_VERSION-cxx17.patch
[ -f "$PATCH_FILE" ] || die "missing $PATCH_FILE"
# The build cache is the user's, not the checkout's (like pip's wheel cache): every clone on this
# machine reuses a wheel built from the same inputs. DLSCALE_CACHE_DIR moves it.
CACHE=${DLSCALE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dlscale}
mkdir -p "$CACHE/wheels" "$CACHE/sdist"

# ---------------------------------------------------------------- 1. Debian build tools
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v patch >/dev/null || missing+=(patch)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  # one apt at a time on this host (scripts/setup.sh installs TeX beside this build)
  $SUDO flock -w 1800 /run/lock/dlscale-apt.lock apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO flock -w 1800 /run/lock/dlscale-apt.lock \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
cmake_version=$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
[ "$(printf '%s\n' 3.13 "$cmake_version" | sort -V | head -1)" = 3.13 ] \
  || die "cmake $cmake_version is older than 3.13 (Horovod would try to pip-install one at build time)"

# ---------------------------------------------------------------- 2. the inputs and the cache key
"$PY" -c 'import torch, cffi, setuptools, wheel' 2>/dev/null \
  || die "$VENV lacks torch/cffi/setuptools/wheel: run $VENV/bin/pip install -r envs/horovod.txt first"
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)')
PY_VERSION=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PATCH_SHA256=$(sha256sum "$PATCH_FILE" | cut -d' ' -f1)
BUILD_SWITCHES="HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1"
if [ "$CUDA" = 1 ]; then
  # NCCL for every GPU collective, against pip's NCCL in the venv (nvidia-nccl-cu*, brought by
  # torch's CUDA build) unless NCCL_HOME names the site's, and the site's CUDA toolkit
  # (CUDA_HOME, default /usr/local/cuda: Horovod compiles CUDA kernels with its nvcc).
  SP=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  NCCL_SRC=${NCCL_HOME:-$SP/nvidia/nccl}
  CUDA_DIR=${CUDA_HOME:-/usr/local/cuda}
  # Horovod's FindNCCL.cmake looks for nccl.h and a library named `nccl` (libnccl.so) under
  # HOROVOD_NCCL_HOME's include/ and lib/. pip's nvidia-nccl wheel ships libnccl.so.2 only (no
  # libnccl.so), and a site's NCCL may keep lib64/: the build points at a folder inside the
  # environment that holds exactly those names, linked to the real files.
  NCCL_DIR=$VENV/.horovod-nccl
  nccl_header=$NCCL_SRC/include/nccl.h
  nccl_lib=""
  for candidate in "$NCCL_SRC"/lib/libnccl.so "$NCCL_SRC"/lib64/libnccl.so \
                   "$NCCL_SRC"/lib/libnccl.so.2 "$NCCL_SRC"/lib64/libnccl.so.2; do
    [ -e "$candidate" ] && { nccl_lib=$candidate; break; }
  done
  if [ -f "$nccl_header" ] && [ -n "$nccl_lib" ]; then
    mkdir -p "$NCCL_DIR/include" "$NCCL_DIR/lib"
    ln -sfn "$nccl_header" "$NCCL_DIR/include/nccl.h"
    ln -sfn "$nccl_lib" "$NCCL_DIR/lib/libnccl.so"
    ln -sfn "$nccl_lib" "$NCCL_DIR/lib/libnccl.so.2"
  elif [ "$PRINT_ONLY" = 0 ]; then
    die "no NCCL in $NCCL_SRC (nccl.h in include/, libnccl.so or libnccl.so.2 in lib/ or lib64/): install torch's CUDA build (envs/horovod-cuda.txt) or set NCCL_HOME to the site's NCCL"
  fi
  BUILD_SWITCHES="$BUILD_SWITCHES HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$NCCL_DIR HOROVOD_NCCL_LINK=SHARED HOROVOD_CUDA_HOME=$CUDA_DIR"
  if [ "$PRINT_ONLY" = 0 ]; then
    [ -x "$CUDA_DIR/bin/nvcc" ] || die "no nvcc in $CUDA_DIR/bin: set CUDA_HOME to the site's CUDA toolkit (module load cuda; echo \$CUDA_HOME)"
    # Horovod's CUDA kernels and torch must share a CUDA major (a CUDA 13 torch with a 12.x
    # toolkit, the usual case on an R535-R570 site, does not build or does not load)
    toolkit=$("$CUDA_DIR/bin/nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -1)
    torch_cuda=$("$PY" -c 'import torch; print(torch.version.cuda or "")')
    [ -n "$torch_cuda" ] || die "torch in $VENV is a CPU build (torch.version.cuda is None): Horovod with NCCL needs torch's CUDA build (pip install -r envs/horovod-cuda.txt)"
    [ -n "$toolkit" ] || die "could not read the CUDA release from $CUDA_DIR/bin/nvcc --version"
    [ "${toolkit%%.*}" = "${torch_cuda%%.*}" ] || die "CUDA_HOME's toolkit is CUDA $toolkit and torch in $VENV is built with CUDA $torch_cuda: they must share a major; load a CUDA ${torch_cuda%%.*}.x toolkit, or install torch's CUDA ${toolkit%%.*} line (docs/pages/gpu.md, \"CUDA lines and the driver\")"
  fi
elif [ -n "${HOROVOD_GPU_OPERATIONS:-}" ]; then
  BUILD_SWITCHES="$BUILD_SWITCHES HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS"
fi
if [ "$PRINT_ONLY" = 1 ]; then
  echo "$BUILD_SWITCHES"
  exit 0
fi
INPUTS="horovod $HOROVOD_VERSION
sdist_sha256 $SDIST_SHA256
patch_sha256 $PATCH_SHA256
torch $TORCH_VERSION
python $PY_VERSION
switches $BUILD_SWITCHES"
KEY=$(printf '%s\n' "$INPUTS" | sha256sum | cut -c1-16)
WHEEL_DIR=$CACHE/wheels/horovod-$HOROVOD_VERSION-$KEY
STAMP=$VENV/.horovod-build

installed_ok() {
  "$PY" - <<'EOF' 2>/dev/null
import os
import horovod.torch as hvd
assert hvd.gloo_built(), "gloo not built"
assert os.environ["CUDA"] != "1" or hvd.nccl_built(), "NCCL not built"
EOF
}
export CUDA

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && installed_ok; then
  log "horovod $HOROVOD_VERSION is up to date in $VENV (torch $TORCH_VERSION, key $KEY)"
  exit 0
fi

# One build at a time per cache entry (parallel setups share the cache).
exec 9>"$CACHE/wheels/.horovod-$KEY.lock"
flock 9

wheel_path() { find "$WHEEL_DIR" -maxdepth 1 -name "horovod-*.whl" 2>/dev/null | head -1; }

if [ -n "$(wheel_path)" ] && [ -f "$WHEEL_DIR/inputs.txt" ] && [ "$(cat "$WHEEL_DIR/inputs.txt")" = "$INPUTS" ]; then
  log "reusing cached wheel $(wheel_path)"
else
  # ------------------------------------------------------------ 3. fetch and check the sdist
  SDIST=$CACHE/sdist/horovod-$HOROVOD_VERSION.tar.gz
  if [ ! -f "$SDIST" ] || [ "$(sha256sum "$SDIST" | cut -d' ' -f1)" != "$SDIST_SHA256" ]; then
    rm -f "$SDIST"
    log "downloading the horovod==$HOROVOD_VERSION sdist from PyPI"
    dl=$(mktemp -d "$CACHE/sdist/.dl.XXXXXX")
    "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
      "horovod==$HOROVOD_VERSION" -d "$dl" >&2
    mv "$dl/horovod-$HOROVOD_VERSION.tar.gz" "$SDIST"
    rm -rf "$dl"
  fi
  got=$(sha256sum "$SDIST" | cut -d' ' -f1)
  [ "$got" = "$SDIST_SHA256" ] || die "sdist sha256 mismatch: got $got, pinned $SDIST_SHA256"

  # ------------------------------------------------------------ 4. patch and build the wheel
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/build-horovod.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  tar -xzf "$SDIST" -C "$WORK"
  SRC=$WORK/horovod-$HOROVOD_VERSION
  (cd "$SRC" && patch -p1 --forward --quiet < "$PATCH_FILE") || die "the patch does not apply"
  jobs=$(nproc); [ "$jobs" -le 8 ] || jobs=8
  export MAKEFLAGS=${MAKEFLAGS:--j$jobs}
  LOG=$WORK/build.log
  log "building the wheel ($BUILD_SWITCHES, MAKEFLAGS=$MAKEFLAGS, torch $TORCH_VERSION): several minutes"
  started=$(date +%s)
  # HOROVOD_LOCAL_VERSION marks the distribution as patched: pip shows 0.28.1+cxx17.
  if ! (cd "$SRC" && env $BUILD_SWITCHES HOROVOD_LOCAL_VERSION=cxx17 PATH="$VENV/bin:$PATH" \
          "$PY" -m pip wheel -v --no-build-isolation --no-deps --no-cache-dir -w "$WORK/dist" . \
          >"$LOG" 2>&1); then
    cp "$LOG" "$CACHE/wheels/horovod-$HOROVOD_VERSION-$KEY.failed.log"
    tail -n 40 "$LOG" >&2
    die "wheel build failed; full log: $CACHE/wheels/horovod-$HOROVOD_VERSION-$KEY.failed.log"
  fi
  built=$(find "$WORK/dist" -maxdepth 1 -name "horovod-*.whl" | head -1)
  [ -n "$built" ] || die "pip wheel produced no wheel (log: $LOG)"
  log "built $(basename "$built") in $(( $(date +%s) - started )) s"
  # ------------------------------------------------------------ 5. cache it (atomically)
  staging=$(mktemp -d "$CACHE/wheels/.staging.XXXXXX")
  chmod 755 "$staging"
  cp "$built" "$staging/"
  cp "$LOG" "$staging/build.log"
  printf '%s\n' "$INPUTS" > "$staging/inputs.txt"
  rm -rf "$WHEEL_DIR"
  mv "$staging" "$WHEEL_DIR"
fi

# ---------------------------------------------------------------- 6. install and check
WHEEL=$(wheel_path)
log "installing $(basename "$WHEEL") into $VENV"
"$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL" >&2
installed_ok || die "horovod.torch does not import with gloo in $VENV after installing $WHEEL"
echo "$KEY" > "$STAMP"
log "ready: horovod $("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))') (gloo, torch $TORCH_VERSION) in $VENV"
