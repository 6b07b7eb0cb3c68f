#!/usr/bin/env bash
# build-image.sh -- build a Charliecloud image directory holding a framework environment, with
# no container registry: Debian's debootstrap (--variant=minbase, Python 3) plus a venv of the
# framework's pinned requirements (envs/<framework>.txt) at /opt/dlscale/<framework>.
#
# Usage: build-image.sh CACHE_DIR [--framework pytorch] [--mount-point DIR]...
#
# The image is CACHE_DIR/<framework>-<key>, <key> a hash of this script, the requirements and
# the mount points: built once, then reused (its path is printed on the last line either way).
# A hardware entry names it as `container: {engine: charliecloud, image: <path>, python:
# /opt/dlscale/<framework>/bin/python, binds: [<mount points>]}`, and any user runs it with
# ch-run, unprivileged. Building needs root (debootstrap, chroot); the tests build it once per
# machine and share it (tests/slurm/test_containers.py). --mount-point creates a directory in
# the image that ch-run can bind a host file system onto (it binds only onto existing
# directories): the file system holding the checkout and the results, e.g. /work or /scratch.
# The Debian mirror: $DLSCALE_DEBIAN_MIRROR, else http://deb.debian.org/debian; pip reads the
# host's configuration (PIP_INDEX_URL, PIP_FIND_LINKS, pip.conf) and installs into the image's
# venv for the image's Python version.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "build-image.sh: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: build-image.sh CACHE_DIR [--framework pytorch] [--mount-point DIR]..."
CACHE=$1; shift
FRAMEWORK=pytorch
MOUNTS=()
while [ $# -gt 0 ]; do
  case $1 in
    --framework) FRAMEWORK=${2:?}; shift 2 ;;
    --mount-point)
      [[ ${2:?} =~ ^/[A-Za-z0-9_./+-]+$ ]] || die "--mount-point: an absolute path, not '$2'"
      MOUNTS+=("$2"); shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
REQ=$ROOT/envs/$FRAMEWORK.txt
[ -f "$REQ" ] || die "--framework $FRAMEWORK: no $REQ (allowed: $(cd "$ROOT/envs" && ls ./*.txt | sed 's|./||;s|.txt||' | tr '\n' ' '))"
[ "$(id -u)" -eq 0 ] || die "building an image needs root (debootstrap, chroot); running it does not"
for tool in debootstrap chroot; do
  command -v "$tool" >/dev/null || die "$tool not found: apt-get install debootstrap"
done
PY=${DLSCALE_IMAGE_PIP_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3

KEY=$( (cat "$0" "$REQ"; printf '%s\n' "${MOUNTS[@]+"${MOUNTS[@]}"}") | sha256sum | cut -c1-12)
IMAGE=$CACHE/$FRAMEWORK-$KEY
mkdir -p "$CACHE"
chmod 755 "$CACHE"
exec 9>"$CACHE/.$FRAMEWORK-$KEY.lock"
flock 9   # one build at a time; a second caller waits and reuses it
if [ -d "$IMAGE" ]; then
  echo "image (cached): $IMAGE"
  echo "$IMAGE"
  exit 0
fi
TMP=$CACHE/.$FRAMEWORK-$KEY.building
rm -rf "$TMP"
MIRROR=${DLSCALE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECONDS=0
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$TMP" "$MIRROR" \
  > "$CACHE/.$FRAMEWORK-$KEY.debootstrap.log" 2>&1 \
  || { tail -20 "$CACHE/.$FRAMEWORK-$KEY.debootstrap.log" >&2; die "debootstrap failed"; }
echo "debootstrap: ${SECONDS}s" >&2
ENV=/opt/dlscale/$FRAMEWORK
chroot "$TMP" /usr/bin/python3 -m venv --without-pip "$ENV"
PYVER=$(chroot "$TMP" "$ENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
SITE=$TMP$ENV/lib/python$PYVER/site-packages
# pip runs on the host (its network, index and wheel folders), for the image's interpreter;
# binary wheels only, so nothing is compiled against the host
"$PY" -m pip install --quiet --only-binary=:all: --python-version "$PYVER" \
  --target "$SITE" -r "$REQ"
chroot "$TMP" "$ENV/bin/python" -c "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in m.distributions()))" >&2
for dir in "${MOUNTS[@]+"${MOUNTS[@]}"}"; do mkdir -p "$TMP$dir"; done
# ch-run binds the host's /etc/hosts, /etc/resolv.conf and /etc/machine-id onto these files where
# the image has them (ch-run(1), "bind-mounted only if path exists"): the ranks then resolve the
# nodes' names as the host does
touch "$TMP/etc/hosts" "$TMP/etc/resolv.conf" "$TMP/etc/machine-id"
rm -rf "$TMP"/var/cache/apt/archives/*.deb "$TMP"/var/lib/apt/lists/*
chmod -R a+rX "$TMP"
mv "$TMP" "$IMAGE"
echo "image built in ${SECONDS}s: $IMAGE" >&2
echo "$IMAGE"
