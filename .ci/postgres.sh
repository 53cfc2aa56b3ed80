#!/usr/bin/env bash
# Install (from Debian's packages, if missing) and start a throwaway PostgreSQL server on
# 127.0.0.1:5432 with a superuser tuner/tuner, for the multi-worker study tests.
#   bash .ci/postgres.sh          # start (or reuse one already running with the tuner role)
#   bash .ci/postgres.sh stop     # stop the server this script started and remove its data folder
set -euo pipefail
data=/tmp/tuner-ci-pg
run_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
if [ "${1:-}" = stop ]; then
  [ -f "$data/postmaster.pid" ] || exit 0   # not ours, or not running: nothing to stop
  bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/postgres | sort -V | tail -n1)")
  run_pg "'$bin/pg_ctl' -D '$data' -m fast -w stop >/dev/null" || true
  rm -rf "$data"; echo "postgres: stopped (data folder $data removed)"; exit 0
fi
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
fi
bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/postgres | sort -V | tail -n1)")
if "$bin/pg_isready" -q -h 127.0.0.1 -p 5432; then
  if psql -h 127.0.0.1 -U tuner -d postgres -qtc "select 1" >/dev/null 2>&1 <<<""; then
    echo "postgres: already running on 127.0.0.1:5432"; exit 0
  fi
  echo "postgres: something else listens on 127.0.0.1:5432 without the tuner role; stop it first" >&2; exit 1
fi
rm -rf "$data"; mkdir -p "$data"; chown postgres:postgres "$data"
run_pg "'$bin/initdb' -D '$data' -U postgres -A trust >/dev/null"
run_pg "'$bin/pg_ctl' -D '$data' -l '$data/log' -o \"-c listen_addresses=127.0.0.1 -p 5432 -c max_connections=200 -k /tmp\" -w start >/dev/null"
psql -h 127.0.0.1 -U postgres -d postgres -qc "DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='tuner') THEN CREATE ROLE tuner LOGIN SUPERUSER PASSWORD 'tuner'; END IF; END\$\$;"
echo "postgres: started on 127.0.0.1:5432 (data in $data)"
