package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/worklog/worklog/internal/inspect"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
)

// store is what replay reads: a Pebble store opened read-only (*pebblelog.Store), a Pebble
// store held by a running process read through its inspection endpoint (*inspect.Client),
// or a PostgreSQL queue opened read-only (*postgres.Store), each a source.Source. The
// commands see only this, so they print the same output for the same log on any.
type store = source.Source

var (
	_ store    = (*pebblelog.Store)(nil)
	_ store    = (*inspect.Client)(nil)
	_ store    = (*postgres.Store)(nil)
	_ follower = (*inspect.Client)(nil)
)

// isLive tells whether other processes write st while replay reads it: a held store read
// through its endpoint (a PostgreSQL URL is told by isPostgresURL).
func isLive(st store) bool {
	if as, ok := st.(*archivedStore); ok {
		st = as.store
	}
	_, ok := st.(*inspect.Client)
	return ok
}

// horizon is where st's history begins: the first sequence not pruned away at the start of
// the log (1 when nothing before it was pruned).
func horizon(pruned projection.SeqRanges) uint64 {
	if len(pruned) > 0 && pruned[0].From == 1 {
		return pruned[0].To + 1
	}
	return 1
}

// bridge lets the fold step over a pruned range: when the event at seq follows a gap that is
// exactly pruned (the ranges are coalesced, so a gap is one range), it sets s's last sequence
// to seq-1, as Verify does, and Apply then takes the event. A gap that is not pruned is left
// for Apply to reject.
func bridge(s projection.State, pruned projection.SeqRanges, seq uint64) error {
	if len(pruned) == 0 || seq < 2 || !pruned.Contains(seq-1) {
		return nil
	}
	last, err := s.LastSeq()
	if err != nil || last+1 >= seq || !pruned.Contains(last+1) {
		return err
	}
	return s.SetLastSeq(seq - 1)
}

// errBeforeHorizon: the point asked for is before the first retained event of a pruned
// store; the state there cannot be computed from what is left.
var errBeforeHorizon = errors.New("before the start of the retained history")

// checkHorizon refuses a cut before the horizon of a store whose oldest events were pruned,
// saying where history begins, rather than folding the retained events into a wrong past.
// A cut after a pruned range in the middle of the log is fine: the subjects pruned there
// are simply absent from the state.
func checkHorizon(ctx context.Context, st store, dir string, ct cut, bySeq bool) error {
	pruned, err := st.PrunedRanges(ctx)
	if err != nil {
		return readError(dir, err)
	}
	h := horizon(pruned)
	if h == 1 {
		return nil
	}
	last, err := st.LastSeq(ctx)
	if err != nil {
		return readError(dir, err)
	}
	if h > last {
		return fmt.Errorf("%w: every event of %s (seqs 1–%d) was pruned: no history is left", errBeforeHorizon, dir, last)
	}
	first, err := st.Event(ctx, h)
	if err != nil {
		return readError(dir, err)
	}
	at := first.Head().At
	switch {
	case bySeq && ct.Seq < h:
		return fmt.Errorf("--at-seq %d is %w of %s: seqs 1–%d were pruned; history begins at seq %d (%s)",
			ct.Seq, errBeforeHorizon, dir, h-1, h, fmtTime(at))
	case ct.ByTime && ct.At < at:
		return fmt.Errorf("--at %s is %w of %s: seqs 1–%d were pruned; history begins at seq %d (%s)",
			fmtTime(ct.At), errBeforeHorizon, dir, h-1, h, fmtTime(at))
	}
	return nil
}

// prunedNote is what an error for an id or a session not found adds on a pruned store: it
// may have been pruned, and where history begins. It is "" on a store with nothing pruned.
func prunedNote(ctx context.Context, st store) string {
	pruned, err := st.PrunedRanges(ctx)
	if err != nil || len(pruned) == 0 {
		return ""
	}
	return fmt.Sprintf(" (it may have been pruned: %d events in %d ranges were, and history begins at seq %d)",
		pruned.Count(), len(pruned), horizon(pruned))
}
