#!/usr/bin/env bash
# inspect-rounds.sh: issue 44's cost of the inspection endpoint on submits, fairly measured:
# work's BenchmarkSubmitInspect at one caller count, each mode (off: no endpoint, idle: an
# endpoint nobody uses, follow: a `replay log --follow` attached) in a process of its own,
# the order of the modes rotated from round to round (off idle follow, idle follow off,
# follow off idle, ...), so that neither a drift of the machine's load nor a process's
# warm-up falls on one mode. The test binary is built once. Prints `uptime` before each
# round, each run's benchmark line, and the round's ratios follow/off and idle/off of ops/s
# and of the queue's cpu-µs/op; the last lines are the medians of the ratios over the rounds.
#
#   scripts/inspect-rounds.sh [-rounds N] [-callers N] [-benchtime D]
#   (defaults: 5 rounds, 64 callers, 2s)
set -euo pipefail

rounds=5 callers=64 benchtime=2s
while [[ $# -gt 0 ]]; do
	case "$1" in
	-rounds) rounds=$2; shift 2 ;;
	-callers) callers=$2; shift 2 ;;
	-benchtime) benchtime=$2; shift 2 ;;
	-h|--help) sed -n '2,12p' "$0"; exit 0 ;;
	*) echo "inspect-rounds.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
if [[ $rounds -lt 3 ]]; then
	echo "inspect-rounds.sh: at least 3 rounds" >&2
	exit 2
fi

root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d -t worklog-inspect-rounds.XXXXXX)
trap 'rm -rf "$out"' EXIT
(cd "$root" && go test -c -o "$out/work.test" ./work)

# metric LINE UNIT: the value before UNIT in a benchmark line.
metric() { awk -v unit="$2" '{ for (i = 2; i <= NF; i++) if ($i == unit) { print $(i-1); exit } }' <<<"$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2] + v[NR/2+1]) / 2 }'; }

modes=(off idle follow)
: >"$out/ratios"
for ((r = 1; r <= rounds; r++)); do
	echo "## round $r  $(uptime)"
	declare -A ops=() cpu=()
	for ((k = 0; k < 3; k++)); do
		mode=${modes[$(((r - 1 + k) % 3))]}
		line=$(cd "$root/work" && nice -n 5 "$out/work.test" -test.run '^$' \
			-test.bench "^BenchmarkSubmitInspect\$/^callers=$callers\$/^inspect=$mode\$" \
			-test.benchtime "$benchtime" | grep '^BenchmarkSubmitInspect' || true)
		if [[ -z "$line" ]]; then
			echo "inspect-rounds.sh: no result for $mode in round $r" >&2
			exit 1
		fi
		echo "$line"
		ops[$mode]=$(metric "$line" ops/s)
		cpu[$mode]=$(metric "$line" cpu-µs/op)
	done
	fo=$(ratio "${ops[follow]}" "${ops[off]}") io=$(ratio "${ops[idle]}" "${ops[off]}")
	fc=$(ratio "${cpu[follow]}" "${cpu[off]}") ic=$(ratio "${cpu[idle]}" "${cpu[off]}")
	echo "round $r ratios: ops/s follow/off $fo idle/off $io; queue cpu-µs/op follow/off $fc idle/off $ic"
	echo "$fo $io $fc $ic" >>"$out/ratios"
done
for c in 1 2 3 4; do
	m[$c]=$(cut -d' ' -f$c "$out/ratios" | median)
done
echo "medians over $rounds rounds: ops/s follow/off ${m[1]} idle/off ${m[2]}; queue cpu-µs/op follow/off ${m[3]} idle/off ${m[4]}"
