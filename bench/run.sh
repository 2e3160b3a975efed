#!/usr/bin/env bash
# Runs the comparison (go run . "$@") with a throwaway PostgreSQL server for the River on
# PostgreSQL rows: installs Debian's postgresql if no server binaries are found (as root),
# initdb's a cluster in a temporary directory, starts it on 127.0.0.1 at a free port, and
# stops and deletes it on exit. Loopback only; trust authentication on a cluster that lives
# for this run.
#
#   ./run.sh                 # the full comparison, every system
#   ./run.sh -quick          # smoke run
#   ./run.sh -systems worklog,river-pg -runs 5
#   BENCH_PG_LOG=/tmp/pg.log ./run.sh ...   # keep the server's log (checkpoints, autovacuum)
#   ./run.sh test -run '^$' -bench 'InsertTx|SubmitTxClaimable' -benchtime 2000x .   # go test with the server
set -euo pipefail
cd "$(dirname "$0")"

pgbin=""
for d in /usr/lib/postgresql/*/bin; do
	if [[ -x "$d/initdb" && -x "$d/pg_ctl" ]]; then pgbin="$d"; fi # the newest version wins
done
if [[ -z "$pgbin" ]]; then
	if [[ $(id -u) -ne 0 ]]; then
		echo "run.sh: PostgreSQL server binaries not found; install Debian's postgresql (as root) or run 'go run .' without it" >&2
		exit 1
	fi
	echo "run.sh: installing postgresql with apt-get" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
	for d in /usr/lib/postgresql/*/bin; do
		if [[ -x "$d/initdb" ]]; then pgbin="$d"; fi
	done
fi
# Debian's package starts its own cluster as a service; this script never uses or touches it.

# initdb refuses to run as root: run the server as the postgres user then.
as_pg=()
if [[ $(id -u) -eq 0 ]]; then
	id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres
	as_pg=(runuser -u postgres --)
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/worklog-bench-pg-XXXXXX")
chmod 755 "$tmp"
pgdata="$tmp/data"
if [[ ${#as_pg[@]} -gt 0 ]]; then chown postgres "$tmp"; fi

cleanup() {
	if [[ -f "$pgdata/postmaster.pid" ]]; then
		"${as_pg[@]}" "$pgbin/pg_ctl" -D "$pgdata" -m fast -w stop >/dev/null 2>&1 || true
	fi
	if [[ -n "${BENCH_PG_LOG:-}" && -f "$tmp/server.log" ]]; then cp "$tmp/server.log" "$BENCH_PG_LOG"; fi
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# A free port on loopback: the first one from 54329 nobody answers on.
port=54329
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done

"${as_pg[@]}" "$pgbin/initdb" -D "$pgdata" -U postgres --auth=trust --encoding=UTF8 --no-instructions >"$tmp/initdb.log" 2>&1 ||
	{ cat "$tmp/initdb.log" >&2; exit 1; }
# Default settings (fsync=on, synchronous_commit=on, shared_buffers=128MB) but for where it
# listens: 127.0.0.1 only, the socket in the temporary directory, and enough connections.
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$pgdata" -l "$tmp/server.log" -w \
	-o "-c listen_addresses=127.0.0.1 -p $port -k $tmp -c max_connections=200 ${BENCH_PG_LOG:+-c log_checkpoints=on -c log_autovacuum_min_duration=0 -c log_line_prefix=%m:%p:}" start >/dev/null ||
	{ cat "$tmp/server.log" >&2; exit 1; }
echo "run.sh: PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $pgdata)" >&2

export BENCH_PG_DSN="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
if [[ "${1:-}" == "test" ]]; then # ./run.sh test -run '^$' -bench InsertTx . : go test against the server
	shift
	go test "$@"
else
	go run . "$@"
fi
