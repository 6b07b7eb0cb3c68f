#!/usr/bin/env bash
# up.sh -- start a PostgreSQL server of the project's own: Debian's postgresql package, run as an
# unprivileged user, reachable on a Unix socket only. The tests start one per test run (named
# after the run: tests/helpers/postgres_server.py) to run the results database's tests against a
# real server; a user can try a shared results database with one the same way.
#
# Usage: up.sh --dir DIR [--port PORT] [--user OSUSER] [--database NAME]
#
#   DIR       the server's folder (created; must not hold a running server): data/ (the
#             cluster), socket/ (its Unix socket, .s.PGSQL.PORT), server.log
#   PORT      names the socket (default 5432); no TCP port is opened (listen_addresses='')
#   OSUSER    the user the server runs as: initdb refuses root, so as root the default is
#             `postgres` (the Debian package's user); a plain user runs it as themselves
#   NAME      the database and its owner role (default dlscale)
#
# Prints the database's URL (SQLAlchemy's form, psycopg 3) on its last line:
#   postgresql+psycopg://NAME@/NAME?host=DIR/socket&port=PORT
# Authentication is `trust` on that socket: a throwaway server for tests and trials, never a
# team's (docs/pages/database.md: a team's set-up). fsync is off for the same reason: a server
# crash may lose its data, a client's crash (what the tests do to a driver) never does.
# Stop it, and remove DIR, with scripts/postgres/down.sh --dir DIR --purge.
set -euo pipefail

PROG=$(basename "$0")
DIR=""
PORT=5432
OSUSER=""
NAME=dlscale
while [[ $# -gt 0 ]]; do
    case $1 in
        --dir) DIR=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --user) OSUSER=$2; shift 2 ;;
        --database) NAME=$2; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "$PROG: unknown option '$1' (--dir, --port, --user, --database)" >&2; exit 2 ;;
    esac
done
[[ -n $DIR ]] || { echo "$PROG: --dir DIR is required" >&2; exit 2; }
[[ $PORT =~ ^[0-9]+$ ]] || { echo "$PROG: --port must be a number, not '$PORT'" >&2; exit 2; }
[[ $NAME =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "$PROG: --database must be a plain name" >&2; exit 2; }

# Debian keeps the server's programs out of PATH, one folder per major version: the newest
BIN=${DLSCALE_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
if [[ -z $BIN || ! -x $BIN/initdb ]]; then
    echo "$PROG: PostgreSQL's server is not installed (no /usr/lib/postgresql/*/bin/initdb):" \
         "as root, bash scripts/setup.sh --system-packages installs Debian's postgresql" >&2
    exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
    OSUSER=${OSUSER:-postgres}
    id "$OSUSER" >/dev/null 2>&1 || { echo "$PROG: no user '$OSUSER' to run the server as" >&2; exit 1; }
    as_owner() { runuser -u "$OSUSER" -- "$@"; }
else
    [[ -z $OSUSER || $OSUSER == $(id -un) ]] || {
        echo "$PROG: only root can run the server as another user ('$OSUSER')" >&2; exit 1; }
    as_owner() { "$@"; }
fi

DIR=$(realpath -m "$DIR")
if [[ -f $DIR/data/postmaster.pid ]] && as_owner "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    echo "$PROG: a server already runs in $DIR (stop it with scripts/postgres/down.sh --dir $DIR)" >&2
    exit 1
fi
rm -rf "$DIR"
mkdir -p "$DIR/socket"
[[ $(id -u) -ne 0 ]] || chown -R "$OSUSER" "$DIR"
chmod 755 "$DIR" "$DIR/socket"

as_owner "$BIN/initdb" --pgdata="$DIR/data" --username=postgres --auth=trust \
    --encoding=UTF8 --locale=C --no-sync >"$DIR/initdb.log" 2>&1 || {
    tail -n 20 "$DIR/initdb.log" >&2; echo "$PROG: initdb failed (log: $DIR/initdb.log)" >&2; exit 1; }
cat >>"$DIR/data/postgresql.conf" <<CONF
# scripts/postgres/up.sh: socket only, a throwaway server
listen_addresses = ''
unix_socket_directories = '$DIR/socket'
port = $PORT
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 16MB
max_connections = 60
CONF
as_owner "$BIN/pg_ctl" --pgdata="$DIR/data" --log="$DIR/server.log" --wait --timeout=120 \
    start >/dev/null || { tail -n 20 "$DIR/server.log" >&2; echo "$PROG: the server did not start" >&2; exit 1; }
psql() { as_owner "$BIN/psql" --host="$DIR/socket" --port="$PORT" --username=postgres \
         --dbname=postgres --no-psqlrc --quiet --set=ON_ERROR_STOP=1 "$@"; }
psql --command="CREATE ROLE $NAME LOGIN" --command="CREATE DATABASE $NAME OWNER $NAME"
echo "postgresql+psycopg://$NAME@/$NAME?host=$DIR/socket&port=$PORT"
