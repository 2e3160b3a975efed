#!/usr/bin/env bash
# shape-ab.sh: issue 20's "no difference" check, a refactor (BASE) against the working tree
# (or REV), on the benchmarks the seams it touched sit under:
#   - claim latency: work's BenchmarkClaimLatency, sync=never, 1k settled, 1 and 8 priorities
#     (the due-index scan: projection.Index, pebblelog's ScanIndex and low-water marks);
#   - W1 submit: work's BenchmarkSubmit, store=worklog, 1 and 64 callers (the fold's index
#     writes: PutIndex into the writer's batch; the engine in internal/pebbleengine);
#   - fold/rebuild: projection's BenchmarkFold (Apply into Mem: memIndex) and work's
#     BenchmarkRebuild (the whole log folded into a Mem, deferred indexes built at the end).
# Each side's test binaries are built once from its own tree (BASE from `git archive`, so the
# checkout is not touched); then ROUNDS rounds each run both sides once, in alternating order,
# so that a drift of the machine's load falls on both. Prints the load average before every
# run, then benchstat's comparison (base as the old, the change as the new). Figures are
# results only on a quiet machine (the printed load averages say whether it was).
#
#   scripts/shape-ab.sh [-base REV] [-rev REV] [-rounds N] [-benchtime D]
#   (defaults: base b9a416c, rev the working tree, 5 rounds, 2s)
set -euo pipefail

base=b9a416c rev="" rounds=5 benchtime=2s
while [[ $# -gt 0 ]]; do
	case "$1" in
	-base) base=$2; shift 2 ;;
	-rev) rev=$2; shift 2 ;;
	-rounds) rounds=$2; shift 2 ;;
	-benchtime) benchtime=$2; shift 2 ;;
	-h|--help) sed -n '2,17p' "$0"; exit 0 ;;
	*) echo "shape-ab.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

# The version of benchstat the module proxy serves (as scripts/witness-ab.sh).
benchstat=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

root=$(cd "$(dirname "$0")/.." && pwd)
out=${SHAPE_AB_OUT:-$(mktemp -d -t worklog-shape-ab.XXXXXX)}
mkdir -p "$out"

tree() { # side rev: the source tree of a side
	if [[ -z "$2" ]]; then echo "$root"; return; fi
	mkdir -p "$out/src-$1"
	git -C "$root" archive "$2" | tar -x -C "$out/src-$1"
	echo "$out/src-$1"
}
for side in base new; do
	r=$base
	[[ $side == new ]] && r=$rev
	src=$(tree "$side" "$r")
	(cd "$src" && go test -c -o "$out/$side-work.test" ./work && go test -c -o "$out/$side-projection.test" ./projection)
	echo "$src" >"$out/$side.src"
	: >"$out/$side.txt"
done

load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime; }
# One pattern a run: go test splits a -bench pattern at '/' into one regexp per level.
work_benches=('^BenchmarkClaimLatency$/^sync=never$/^settled=1k$' '^BenchmarkSubmit$/^callers=(1|64)$/^store=worklog$' '^BenchmarkRebuild$')
run() { # side round
	local src
	src=$(cat "$out/$1.src")
	echo "round $2, $1: load average $(load)"
	{
		for b in "${work_benches[@]}"; do
			(cd "$src/work" && "$out/$1-work.test" -test.run '^$' -test.bench "$b" -test.benchtime "$benchtime" -test.count 1 -test.benchmem)
		done
		(cd "$src/projection" && "$out/$1-projection.test" -test.run '^$' -test.bench '^BenchmarkFold$' -test.benchtime "$benchtime" -test.count 1 -test.benchmem)
	} | tee -a "$out/$1.txt" | grep '^Benchmark' || true
}
for r in $(seq "$rounds"); do
	if (( r % 2 )); then run base "$r"; run new "$r"; else run new "$r"; run base "$r"; fi
done
echo "load average at the end: $(load)"
echo
go run "$benchstat" "base=$out/base.txt" "new=$out/new.txt"
echo "(raw results in $out)"
