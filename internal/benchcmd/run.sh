#!/bin/sh
# Reproduces docs/performance.md: ROUNDS (default 5) interleaved rounds of every benchmark in
# work/bench_test.go, each round one process (so worklog and its baselines alternate, and a
# slow spell of the shared disk or CPU hits all of them), then the ratio table.
#
#   internal/benchcmd/run.sh                 # ~15 min, plus ~5-20 min once to build the 1M store
#   ROUNDS=1 BENCHTIME=1s internal/benchcmd/run.sh
#   WORKLOG_BENCH_DIR=/path/kept internal/benchcmd/run.sh   # reuse a built 1M-task store
#
# Output: $OUT (default bench-<date>.txt in the current directory), benchstat-ready; the ratio
# table is printed at the end (go run ./internal/benchcmd ratios < $OUT).
set -eu
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
BENCHTIME=${BENCHTIME:-2s}
OUT=${OUT:-$PWD/bench-$(date -u +%Y%m%dT%H%M%SZ).txt}
keep=1
if [ -z "${WORKLOG_BENCH_DIR:-}" ]; then
	WORKLOG_BENCH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/worklog-bench.XXXXXX")
	keep=0
fi
export WORKLOG_BENCH_DIR
bin=$(mktemp "${TMPDIR:-/tmp}/work-bench.XXXXXX")
trap 'rm -f "$bin"; [ "$keep" = 1 ] || rm -rf "$WORKLOG_BENCH_DIR"' EXIT
go test -c -o "$bin" ./work
{
	echo "# $(date -u) $(uname -r) nproc=$(nproc) $(go version)"
	echo "# WORKLOG_BENCH_DIR=$WORKLOG_BENCH_DIR ROUNDS=$ROUNDS BENCHTIME=$BENCHTIME"
} >>"$OUT"
i=1
while [ "$i" -le "$ROUNDS" ]; do
	echo "round $i of $ROUNDS ($(date -u +%H:%M:%S))" >&2
	(cd work && "$bin" -test.run '^$' -test.bench . -test.benchtime "$BENCHTIME" -test.timeout 60m) | tee -a "$OUT" >&2
	i=$((i + 1))
done
go run ./internal/benchcmd ratios <"$OUT"
echo "raw results: $OUT" >&2
