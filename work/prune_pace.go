package work

import (
	"context"
	"time"

	engineapi "github.com/worklog/worklog/internal/engine"
)

// Pacing of Queue.Prune (docs/design.md §11, "Crash safety and pace").
//
// A prune group is one command of the single writer: commands that arrive while it runs
// wait for it, and those the writer folds into the same batch wait for its commit too. A
// fixed group of 256 subjects held the writer 6 to 97 ms on this 2-core machine (its cost
// per subject moves with the cache, the compactions and the other processes), and submit
// p99 during the prune of a backlog was 7 to 10 times its p99 without (BenchmarkPruneLatency).
// So the group is sized by time instead: each group's size is scaled so that it holds the
// writer about pruneBudget (PruneGroupResult.Held, the group's own time in the writer),
// between minPruneGroup and pruneGroup subjects. An engine that does not report Held keeps
// groups of pruneGroup.

// pruneBudget is the time one prune group should hold the writer. A variable for the
// benchmarks; zero or negative turns pacing off (every group is pruneGroup subjects).
var pruneBudget = 2 * time.Millisecond

// minPruneGroup is the smallest paced group: below it, the per-command costs (a round trip
// to the writer, a commit and its fsync) outweigh the subjects.
const minPruneGroup = 8

// prunePause is how long Queue.Prune waits after each paced group, as a multiple of the
// group's time (request to answer): the prune's share of the writer and of the disk's
// fsyncs is at most 1/(1+prunePause). A variable for the benchmarks.
var prunePause = 0.0

// prunePacer sizes the groups of one Queue.Prune.
type prunePacer struct{ limit int }

func newPrunePacer() *prunePacer {
	if pruneBudget <= 0 {
		return &prunePacer{limit: pruneGroup}
	}
	// Start small: the first group's cost is unknown, and a cold cache makes it dearer.
	return &prunePacer{limit: min(2*minPruneGroup, pruneGroup)}
}

// done sizes the next group from the last one, g, whose call took took (used only for the
// pause). A group that was not full says nothing about the cost of a full one.
func (p *prunePacer) done(ctx context.Context, g engineapi.PruneGroupResult, took time.Duration) {
	if pruneBudget <= 0 || !g.More {
		return
	}
	if prunePause > 0 {
		t := time.NewTimer(time.Duration(prunePause * float64(took)))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if g.Held <= 0 {
		// An engine that does not say how long it held its writer (in memory, PostgreSQL)
		// keeps fixed groups: the in-memory group's cost is mostly a walk of the log from
		// its subjects' first event, the same for 8 subjects as for 256, and its wall time
		// says nothing about a writer.
		p.limit = pruneGroup
		return
	}
	took = g.Held
	n := int(float64(p.limit) * float64(pruneBudget) / float64(max(took, time.Microsecond)))
	n = max(p.limit/2, min(n, 2*p.limit)) // halve or double at most: one slow group is not a trend
	p.limit = max(min(minPruneGroup, pruneGroup), min(n, pruneGroup))
}

// compactAfterPrune makes a prune that removed events compact the log span it emptied, in the
// background (pebblelog.Store.CompactPrunedLater; docs/design.md §11, "Memory and disk"). A
// variable for the benchmarks that measure without it.
var compactAfterPrune = true

// afterPruner is an engine that reclaims pruned space in the background after a prune (the
// Pebble engine).
type afterPruner interface{ AfterPrune() }
