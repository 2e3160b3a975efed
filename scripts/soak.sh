#!/usr/bin/env bash
# soak.sh: the SIGKILL crash tests for many rounds, with pruning and large values on (issue
# 25's soak). Not part of CI.
#
#   scripts/soak.sh [-rounds N] [-chunk K] [-seed S]
#
# It builds work's test binary once and runs, chunk after chunk of K rounds (default 20) until
# N rounds (default 1000) are done, TestCrashKillPrune and TestCrashKill in turn, each on a new
# store, with WORKLOG_CRASH_LARGE=true (one task in eight has a 300 KiB input: a blob file) and
# a new seed per chunk (S, S+1, ...). Every round kills the child with SIGKILL at a random
# moment, reopens the store and checks every acknowledged operation (the tests' own checks: an
# acknowledged submit, finish, cancel or wake missing is a failure). It prints each chunk's
# acknowledged counts and result, then the totals: rounds, rounds with a loss or another
# failure, and the commit. A failed chunk's whole output is kept in $SOAK_OUT.
set -euo pipefail

rounds=1000 chunk=20 seed=$(date +%s)
while [[ $# -gt 0 ]]; do
	case "$1" in
	-rounds) rounds=$2; shift 2 ;;
	-chunk) chunk=$2; shift 2 ;;
	-seed) seed=$2; shift 2 ;;
	-h|--help) sed -n '2,16p' "$0"; exit 0 ;;
	*) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
out=${SOAK_OUT:-$(mktemp -d -t worklog-soak.XXXXXX)}
mkdir -p "$out"
bin="$out/work.test"
(cd "$root" && go test -c -o "$bin" ./work)
commit=$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . || echo "+dirty")
echo "soak: $rounds rounds in chunks of $chunk, seeds from $seed, commit $commit, $(date -u +%FT%TZ)"

done_rounds=0 failed_chunks=0 i=0
tests=(TestCrashKillPrune TestCrashKill)
while [[ $done_rounds -lt $rounds ]]; do
	n=$(( rounds - done_rounds < chunk ? rounds - done_rounds : chunk ))
	test=${tests[$(( i % 2 ))]}
	s=$(( seed + i ))
	log="$out/chunk-$i-$test.log"
	if (cd "$root/work" && WORKLOG_CRASH_ROUNDS=$n WORKLOG_CRASH_SEED=$s WORKLOG_CRASH_LARGE=true \
		"$bin" -test.run "^$test\$" -test.v -test.count=1 -test.timeout 2h) >"$log" 2>&1; then
		status=ok
	else
		status="FAIL (kept: $log)"
		failed_chunks=$((failed_chunks + 1))
	fi
	ran=$(grep -cE '^\s+crash(_prune)?_test.go:[0-9]+: round [0-9]+ \(' "$log" || true)
	acked=$(grep -oE '[0-9]+ submits, [0-9]+ finishes, [0-9]+ cancels, [0-9]+ wakes, [0-9]+ acks' "$log" \
		| awk '{s+=$1; f+=$3; c+=$5; w+=$7; a+=$9} END {printf "%d submits, %d finishes, %d cancels, %d wakes, %d acks", s, f, c, w, a}')
	lost=$(grep -ciE 'lost|missing' "$log" || true)
	[[ $status == ok ]] && rm -f "$log"
	done_rounds=$((done_rounds + n))
	echo "chunk $i $test seed $s: $ran/$n rounds checked, acknowledged $acked; lines naming a loss: $lost; $status; load $(cut -d' ' -f1 /proc/loadavg)"
	i=$((i + 1))
done
echo "soak: $done_rounds rounds ($i chunks), $failed_chunks failed chunks; commit $commit; $(date -u +%FT%TZ)"
[[ $failed_chunks -eq 0 ]]
