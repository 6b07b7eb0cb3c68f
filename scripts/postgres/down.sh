#!/usr/bin/env bash
# down.sh -- stop a server that scripts/postgres/up.sh started, and with --purge remove its folder.
#
# Usage: down.sh --dir DIR [--purge]
#
# Stops only the server whose data folder is DIR/data (pg_ctl, as the data folder's owner: a
# fast shutdown, then an immediate one). Idempotent: exits 0 when no server runs there.
set -euo pipefail

PROG=$(basename "$0")
DIR=""
PURGE=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --dir) DIR=$2; shift 2 ;;
        --purge) PURGE=1; shift ;;
        -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "$PROG: unknown option '$1' (--dir, --purge)" >&2; exit 2 ;;
    esac
done
[[ -n $DIR ]] || { echo "$PROG: --dir DIR is required" >&2; exit 2; }
DIR=$(realpath -m "$DIR")
BIN=${DLSCALE_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}

if [[ -f $DIR/data/postmaster.pid && -n $BIN ]]; then
    owner=$(stat -c %U "$DIR/data")
    if [[ $(id -u) -eq 0 && $owner != root ]]; then
        as_owner() { runuser -u "$owner" -- "$@"; }
    else
        as_owner() { "$@"; }
    fi
    as_owner "$BIN/pg_ctl" --pgdata="$DIR/data" --mode=fast --wait --timeout=30 stop \
        >/dev/null 2>&1 \
        || as_owner "$BIN/pg_ctl" --pgdata="$DIR/data" --mode=immediate --wait --timeout=30 stop \
        >/dev/null 2>&1 || true
fi
if [[ -f $DIR/data/postmaster.pid ]]; then
    pid=$(head -n 1 "$DIR/data/postmaster.pid")
    if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
        echo "$PROG: the server in $DIR (pid $pid) did not stop" >&2
        exit 1
    fi
fi
[[ $PURGE -eq 0 ]] || rm -rf "$DIR"
