#!/usr/bin/env bash
# witness-ab.sh: the sync witness's cost (docs/design.md §7.2, issue 25's target: ≤ 2% of
# submit throughput at 1 and 64 callers). Runs work's BenchmarkSubmit (store=worklog,
# callers=1 and 64) with the witness on (the ordinary build) and off (build tag
# worklog_nowitness, which only this script uses), interleaved: ROUNDS rounds, each running
# both sides once, in alternating order, so that a drift of the machine's load falls on both.
# Prints the load average before every run, then benchstat's comparison (the median of the
# rounds, off as the base, on as the change). Not part of CI; figures are results only on a
# quiet machine (the load averages printed say whether it was).
#
#   scripts/witness-ab.sh [-rounds N] [-benchtime D]      (defaults: 3 rounds, 3s)
set -euo pipefail

rounds=3 benchtime=3s
while [[ $# -gt 0 ]]; do
	case "$1" in
	-rounds) rounds=$2; shift 2 ;;
	-benchtime) benchtime=$2; shift 2 ;;
	-h|--help) sed -n '2,12p' "$0"; exit 0 ;;
	*) echo "witness-ab.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

# The version of benchstat the module proxy serves (see the project's module list).
benchstat=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

root=$(cd "$(dirname "$0")/.." && pwd)
out=${WITNESS_AB_OUT:-$(mktemp -d -t worklog-witness-ab.XXXXXX)}
mkdir -p "$out"
cd "$root"
go test -c -o "$out/on.test" ./work
go test -c -tags worklog_nowitness -o "$out/off.test" ./work
: >"$out/on.txt"
: >"$out/off.txt"

load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime; }
bench='BenchmarkSubmit$/^callers=(1|64)$/^store=worklog$'
run() { # side round
	echo "round $2, witness $1: load average $(load)"
	(cd "$root/work" && "$out/$1.test" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" \
		-test.count 1 -test.benchmem) | tee -a "$out/$1.txt" | grep '^Benchmark' || true
}
for r in $(seq "$rounds"); do
	if (( r % 2 )); then run off "$r"; run on "$r"; else run on "$r"; run off "$r"; fi
done
echo "load average at the end: $(load)"
echo
go run "$benchstat" "off=$out/off.txt" "on=$out/on.txt"
echo "(raw results in $out)"
