// Package indextest checks a store's range scans of an index (projection.Reader.ScanIndex)
// against the entries put into it: one check for the three states (projection's Mem,
// pebblelog, postgres).
package indextest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Entries returns n entries with distinct seqs for an index: ties in At, the extremes of At
// and, when pri is set (an index with priorities), of the priority (events.MinPriority,
// MaxPriority: a task's are in that range).
func Entries(r *rand.Rand, n int, pri bool) []projection.IndexEntry {
	ats := []int64{math.MinInt64, math.MaxInt64, -1, 0, 1}
	var out []projection.IndexEntry
	for i := range n {
		e := projection.IndexEntry{At: int64(r.IntN(20)) - 5, Seq: uint64(i + 1), ID: fmt.Sprintf("e%03d", i)}
		if i < len(ats) {
			e.At = ats[i]
		}
		if pri {
			e.Pri = []int64{events.MinPriority, -3, 0, 0, 2, events.MaxPriority}[r.IntN(6)]
		}
		out = append(out, e)
	}
	return out
}

// Bounds are the [from, to] ranges Check scans: whole, either side open, one instant, an
// empty range (from > to), the extremes, and one past every entry.
var Bounds = [][2]int64{{math.MinInt64, math.MaxInt64}, {math.MinInt64, 3}, {0, math.MaxInt64}, {1, 1},
	{-2, 7}, {5, 4}, {math.MaxInt64, math.MaxInt64}, {math.MinInt64, math.MinInt64}, {16, 100}}

// Check checks scan (ScanIndex of one partition) over every range of Bounds against all,
// the partition's entries: exactly those with At in the range, in claim order
// (IndexEntry.Less); and fn returning false stops it.
func Check(t *testing.T, what string, scan func(from, to int64, fn func(projection.IndexEntry) bool) error, all []projection.IndexEntry) {
	t.Helper()
	for _, b := range Bounds {
		var got, want []projection.IndexEntry
		if err := scan(b[0], b[1], func(e projection.IndexEntry) bool { got = append(got, e); return true }); err != nil {
			t.Fatalf("%s [%d, %d]: %v", what, b[0], b[1], err)
		}
		for _, e := range all {
			if e.At >= b[0] && e.At <= b[1] {
				want = append(want, e)
			}
		}
		slices.SortFunc(want, func(x, y projection.IndexEntry) int {
			switch {
			case x.Less(y):
				return -1
			case y.Less(x):
				return 1
			}
			return 0
		})
		if !slices.Equal(got, want) {
			t.Errorf("%s [%d, %d]:\n got  %v\n want %v", what, b[0], b[1], got, want)
		}
		calls := 0
		if err := scan(b[0], b[1], func(projection.IndexEntry) bool { calls++; return false }); err != nil {
			t.Fatal(err)
		}
		if calls != min(1, len(want)) {
			t.Errorf("%s [%d, %d]: a scan stopped at its first entry made %d calls", what, b[0], b[1], calls)
		}
	}
}
