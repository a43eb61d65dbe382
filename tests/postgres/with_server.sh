#!/usr/bin/env bash
# Runs a command beside a throwaway PostgreSQL server from Debian's `postgresql` package: a cluster made in a
# temporary directory, listening on 127.0.0.1 only (port NOISY_STUDENT_TEST_POSTGRES_PORT, default 55432), every
# local connection trusted. The command finds its administrative URL in NOISY_STUDENT_TEST_POSTGRES (the tests
# create a database each there). The server is stopped and its directory removed however the command ends.
set -euo pipefail
port=${NOISY_STUDENT_TEST_POSTGRES_PORT:-55432}
bin=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "no PostgreSQL server: apt-get install postgresql" >&2; exit 1; }
dir=$(mktemp -d)
owner=()
if [ "$(id -u)" -eq 0 ]; then  # initdb refuses to run as root
    chown postgres "$dir"
    owner=(runuser -u postgres --)
fi
stop() {
    "${owner[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT
"${owner[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
# fsync off: a cluster that is thrown away needs no durability.
"${owner[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-h 127.0.0.1 -p $port -k $dir -c fsync=off" start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
NOISY_STUDENT_TEST_POSTGRES="postgresql+psycopg2://postgres@127.0.0.1:$port/postgres" "$@"
