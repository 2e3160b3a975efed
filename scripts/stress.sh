#!/usr/bin/env bash
# stress.sh: run packages' tests N times in a row with -race while another process keeps every
# core busy, and report the failures (issue 25: a test that fails 1 run in 30 under load is a
# bug). Not part of CI.
#
#   scripts/stress.sh [-n RUNS] [-run REGEX] [-skip REGEX] [-timeout DUR] [-norace] PACKAGE...
#   scripts/stress.sh -n 20 ./pebblelog ./work
#
# Each package's test binary is built once (go test -c -race; without -race with -norace, for
# tests whose cost under the race detector would make N runs take hours) and run RUNS times. A failed
# run's output is kept in $STRESS_OUT (default: a new temp dir) as PKG-RUN.log. The load is one
# busy loop per core (nproc), started here and stopped on exit. Exit status 1 if any run
# failed.
set -euo pipefail

runs=20 run="" skip="" timeout=20m race=-race
while [[ $# -gt 0 ]]; do
	case "$1" in
	-n) runs=$2; shift 2 ;;
	-run) run=$2; shift 2 ;;
	-skip) skip=$2; shift 2 ;;
	-timeout) timeout=$2; shift 2 ;;
	-norace) race=""; shift ;;
	-h|--help) sed -n '2,13p' "$0"; exit 0 ;;
	-*) echo "stress.sh: unknown flag $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
[[ $# -gt 0 ]] || { echo "usage: stress.sh [-n RUNS] [-run REGEX] [-skip REGEX] [-timeout DUR] [-norace] PACKAGE..." >&2; exit 2; }

out=${STRESS_OUT:-$(mktemp -d -t worklog-stress.XXXXXX)}
mkdir -p "$out"
bin=$(mktemp -d -t worklog-stress-bin.XXXXXX)

hogs=()
stop_hogs() {
	for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$bin"
}
trap stop_hogs EXIT
trap "exit 130" INT TERM # so that the EXIT trap stops the busy loops
for _ in $(seq "$(nproc)"); do
	( while :; do :; done ) &
	hogs+=($!)
done

total=0 failed=0
for pkg in "$@"; do
	name=$(echo "$pkg" | tr -c 'A-Za-z0-9\n' '_')
	go test -c $race -o "$bin/$name.test" "$pkg"
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for i in $(seq "$runs"); do
		total=$((total + 1))
		log="$out/$name-$i.log"
		start=$(date +%s)
		args=(-test.timeout "$timeout")
		[[ -n "$run" ]] && args+=(-test.run "$run")
		[[ -n "$skip" ]] && args+=(-test.skip "$skip")
		if (cd "$dir" && "$bin/$name.test" "${args[@]}") >"$log" 2>&1; then
			rm -f "$log"
			status=ok
		else
			failed=$((failed + 1))
			status="FAIL ($log)"
		fi
		echo "$pkg run $i/$runs: $status in $(( $(date +%s) - start ))s, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
	done
done
echo "stress: $failed of $total runs failed (packages: $*; logs of failures in $out)"
[[ $failed -eq 0 ]]
