package work

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	engineapi "github.com/worklog/worklog/internal/engine"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// PruneResult is what Queue.Prune removed.
type PruneResult struct {
	Tasks, Wakes int    // records removed
	Events       uint64 // events removed from the live log (archived first when an archive is configured)
}

// DefaultPruneInterval is how often background pruning runs (Options.PruneInterval).
const DefaultPruneInterval = time.Minute

// pruneGroup bounds the subjects one prune command removes: each group is one command (one
// batch) of the single writer, so other commands wait behind at most one group.
// A variable only for the crash test, which makes groups small so that a crash lands
// between them.
var pruneGroup = 256

// Prune removes the history that became prunable before before (docs/design.md,
// "Retention"): a terminal task that finished before it, with its completion wake once that
// wake was acknowledged before it; a requested wake acknowledged before it. Their records,
// idempotency keys (free again for a new Submit) and events go; nothing else changes. It
// works in bounded groups, each atomic, until nothing prunable is left or ctx ends; what the
// finished groups removed is reported with ctx's error.
func (q *Queue) Prune(ctx context.Context, before time.Time) (PruneResult, error) {
	if err := q.begin(ctx); err != nil {
		return PruneResult{}, err
	}
	if _, verr := nanos("before", before); verr != nil {
		return PruneResult{}, verr
	}
	if q.caps.prune == nil {
		return PruneResult{}, unsupported("Queue.Prune", "Pruner")
	}
	return q.caps.prune.Prune(ctx, before)
}

var _ Pruner = (*logBackend)(nil)

// Prune is Queue.Prune on worklog's backend: the engine's PruneGroup until nothing is left.
func (b *logBackend) Prune(ctx context.Context, before time.Time) (PruneResult, error) {
	at, verr := nanos("before", before)
	if verr != nil {
		return PruneResult{}, verr
	}
	p := b.caps.pruner
	if p == nil {
		return PruneResult{}, backendErr(engineapi.ErrPruneNotSupported)
	}
	var res PruneResult
	defer func() {
		if b.caps.after != nil && res.Events > 0 && compactAfterPrune {
			b.caps.after.AfterPrune() // in the background (prune_pace.go)
		}
	}()
	pace := newPrunePacer() // groups sized by time (prune_pace.go)
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		// A duration for the pacer, from the monotonic clock: not the queue's clock, which
		// is a time of day that callers inject (PostgreSQL's server clock moves when its
		// offset is refreshed; a test's may stand still; the crash test's takes the load's
		// lock and reports each read as the start of a prune).
		start := time.Now()
		g, err := p.PruneGroup(ctx, at, pace.limit)
		pace.done(ctx, g, time.Since(start))
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return res, backendErr(ErrClosed)
			}
			return res, backendErr(err)
		}
		res.Tasks += g.Tasks
		res.Wakes += g.Wakes
		res.Events += g.Events
		if !g.More {
			return res, nil
		}
	}
}

// PruneGroup in memory: the records go through projection.PruneSubject like on Pebble; the
// events are marked pruned (memEngine.pruned) at once, so no read sees them again, and the
// log slice is compacted once the pruned events in it are a quarter of it, so memory follows
// live work at an amortised cost of one copy per event.
func (e *memEngine) PruneGroup(ctx context.Context, before int64, limit int) (engineapi.PruneGroupResult, error) {
	if err := ctx.Err(); err != nil {
		return engineapi.PruneGroupResult{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return engineapi.PruneGroupResult{}, ErrClosed
	}
	var res engineapi.PruneGroupResult
	var entries []projection.PruneEntry
	if err := e.state.ScanPrunable(before, func(pe projection.PruneEntry) bool {
		if len(entries) == limit {
			res.More = true
			return false
		}
		entries = append(entries, pe)
		return true
	}); err != nil {
		return res, err
	}
	if len(entries) == 0 {
		return res, nil
	}
	subjects := make(map[string]bool, 2*len(entries))
	first := uint64(1<<64 - 1)
	for _, pe := range entries {
		p, err := projection.PruneSubject(e.state, pe, before)
		if err != nil {
			// Never expected (the index matches the records): the state may be half-changed,
			// so it is rebuilt from the log, which nothing has changed yet.
			if rerr := e.refold(); rerr != nil {
				return engineapi.PruneGroupResult{}, fmt.Errorf("%w; rolling back: %v", err, rerr)
			}
			return engineapi.PruneGroupResult{}, err
		}
		if p.TaskID != "" {
			res.Tasks++
			subjects["t"+p.TaskID] = true
		}
		if p.WakeID != "" {
			res.Wakes++
			subjects["w"+p.WakeID] = true
		}
		first = min(first, p.FirstSeq)
	}
	// The subjects' events: from the first one on (a binary search; sequences ascend).
	i := sort.Search(len(e.log), func(i int) bool { return e.log[i].Head().Seq >= first })
	var seqs []uint64
	for _, ev := range e.log[i:] {
		seq := ev.Head().Seq
		if e.pruned.Contains(seq) {
			continue
		}
		taskID, wakeID := ev.Subject()
		if (taskID != "" && subjects["t"+taskID]) || (wakeID != "" && subjects["w"+wakeID]) {
			seqs = append(seqs, seq)
		}
	}
	// Copy on write: ReadLog walks a snapshot of the set without the lock.
	pruned := slices.Clone(e.pruned)
	for _, r := range projection.RunsOf(seqs) {
		pruned.Add(r.From, r.To)
	}
	e.pruned = pruned
	e.stale += len(seqs)
	res.Events = uint64(len(seqs))
	if e.stale*4 >= len(e.log) {
		e.compact()
	}
	return res, nil
}

// compact drops the pruned events from the log into a new slice: ReadLog may be walking the
// old one.
func (e *memEngine) compact() {
	kept := make([]events.Event, 0, len(e.log)-e.stale)
	for _, ev := range e.log {
		if !e.pruned.Contains(ev.Head().Seq) {
			kept = append(kept, ev)
		}
	}
	e.log, e.stale = kept, 0
}

// foldGap prepares st for ev when the sequences between st's last one and ev's were pruned
// (all of them in pruned): the fold goes on after the gap. Any other gap is left for Apply
// to refuse.
func foldGap(st projection.State, ev events.Event, pruned projection.SeqRanges) error {
	last, err := st.LastSeq()
	if err != nil {
		return err
	}
	seq := ev.Head().Seq
	if seq > last+1 && gapPruned(pruned, last+1, seq-1) {
		return st.SetLastSeq(seq - 1)
	}
	return nil
}

// gapPruned reports whether every sequence of [from, to] was pruned: the set is coalesced,
// so one range holds them all.
func gapPruned(pruned projection.SeqRanges, from, to uint64) bool {
	i := sort.Search(len(pruned), func(i int) bool { return pruned[i].To >= from })
	return i < len(pruned) && pruned[i].From <= from && pruned[i].To >= to
}

// startPruner runs Prune every interval on what became prunable more than retention ago, by
// the queue's clock, until the returned stop is called. It is the one background pruner of every
// backend: a backend package's queue gets it through engineapi.Config (postgres.Open), and
// Queue.Close calls stop before it closes the backend. Each round is logged to logger (nil:
// discarded): what it removed at Info, nothing found at Debug, an error at Error; errors are
// never fatal, the next round tries again. stop cancels the round in flight, which ends after
// the group being committed (Prune checks ctx between groups, and a command waiting for the
// writer leaves on ctx), so a Close during a long prune waits for one group, not the prune.
func (q *Queue) startPruner(retention, interval time.Duration, logger *slog.Logger) (stop func()) {
	if interval <= 0 {
		interval = DefaultPruneInterval
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			before := q.now().Add(-retention)
			res, err := q.Prune(ctx, before)
			removed := res.Tasks+res.Wakes > 0
			attrs := []any{"before", before, "tasks", res.Tasks, "wakes", res.Wakes, "events", res.Events}
			switch {
			case ctx.Err() != nil || errors.Is(err, ErrClosed):
				// Stopped by Close: the groups committed so far stay pruned.
				if removed {
					logger.Info("worklog: background prune stopped by Close", attrs...)
				}
				return
			case err != nil:
				logger.Error("worklog: background prune failed", append(attrs, "err", err)...)
			case removed:
				logger.Info("worklog: background prune", attrs...)
			default:
				logger.Debug("worklog: background prune found nothing", attrs...)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
