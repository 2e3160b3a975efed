package work

import (
	"context"
	"testing"
	"time"

	engineapi "github.com/worklog/worklog/internal/engine"
)

// The pacer scales a full group to hold the writer about pruneBudget, halving or doubling at
// most, within [minPruneGroup, pruneGroup]; a group that was not full changes nothing; an
// engine that does not report Held (in memory, PostgreSQL) gets groups of pruneGroup, whose
// cost there is mostly per group, not per subject.
func TestPrunePacer(t *testing.T) {
	ctx := context.Background()
	p := newPrunePacer()
	if p.limit != 2*minPruneGroup {
		t.Fatalf("first group %d, want %d", p.limit, 2*minPruneGroup)
	}
	full := func(held time.Duration) engineapi.PruneGroupResult {
		return engineapi.PruneGroupResult{More: true, Held: held}
	}
	steps := []struct {
		g    engineapi.PruneGroupResult
		want int
	}{
		{full(pruneBudget / 4), 32},                         // 4× too fast: doubled, not quadrupled
		{full(pruneBudget / 2), 64},                         // doubled
		{full(pruneBudget), 64},                             // on budget
		{full(pruneBudget * 10), 32},                        // 10× too slow: halved
		{engineapi.PruneGroupResult{Held: time.Second}, 32}, // not full: says nothing
		{full(pruneBudget * 100), 16},
		{full(pruneBudget * 100), minPruneGroup},
		{full(pruneBudget * 100), minPruneGroup}, // never below the minimum
	}
	for i, s := range steps {
		p.done(ctx, s.g, s.g.Held)
		if p.limit != s.want {
			t.Fatalf("step %d (held %v): group %d, want %d", i, s.g.Held, p.limit, s.want)
		}
	}
	for range 10 {
		p.done(ctx, full(time.Microsecond), time.Microsecond)
	}
	if p.limit != pruneGroup {
		t.Errorf("after fast groups the group is %d, want at most pruneGroup %d", p.limit, pruneGroup)
	}
	q := newPrunePacer()
	q.done(ctx, engineapi.PruneGroupResult{More: true}, time.Second) // no Held: a slow in-memory group
	if q.limit != pruneGroup {
		t.Errorf("without Held the group is %d, want pruneGroup %d", q.limit, pruneGroup)
	}
}
