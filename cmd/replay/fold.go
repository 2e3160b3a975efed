package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pastfold"
	"github.com/worklog/worklog/projection"
)

// cut is a point in the log to travel to: the prefix up to and including Seq, or (ByTime)
// the longest prefix whose events are all stamped at or before At, that is, everything
// before the first event stamped after it. It is pastfold's, which folds one session at a
// cut for `state --by-session` and `--session`.
type cut = pastfold.Cut

// foldResult is the state at a cut and how it was computed.
type foldResult struct {
	mem      *projection.Mem
	seq      uint64 // the last event folded (0: none)
	at       int64  // its time
	next     *events.Header
	lastSeq  uint64 // the store's last sequence
	cost     foldCost
	sessions bool
}

// foldCost is what --cost prints: where the time went.
type foldCost struct {
	snapshotSeq     uint64
	segmentsLoaded  int
	recordsLoaded   int
	recordsCurrent  int
	loadTime        time.Duration
	eventsFolded    uint64
	foldTime        time.Duration
	segmentsWritten int
	note            string
}

func (c foldCost) String() string {
	s := ""
	if c.segmentsLoaded > 0 {
		s = fmt.Sprintf("loaded %d cached snapshot segment(s) up to seq %d (%d records, %d current) in %v; ",
			c.segmentsLoaded, c.snapshotSeq, c.recordsLoaded, c.recordsCurrent, c.loadTime.Round(time.Millisecond))
	}
	s += fmt.Sprintf("folded %d event(s) in %v", c.eventsFolded, c.foldTime.Round(time.Millisecond))
	if c.segmentsWritten > 0 {
		s += fmt.Sprintf("; wrote %d snapshot segment(s)", c.segmentsWritten)
	}
	if c.note != "" {
		s += "; " + c.note
	}
	return s
}

// sessionFold folds the events of one session up to the cut, through the per-session index
// (internal/pastfold, the fold `state --by-session` streams with).
func sessionFold(ctx context.Context, st store, session string, c cut) (*foldResult, error) {
	start := time.Now()
	s, err := pastfold.FoldSession(ctx, st, session, c)
	if err != nil {
		return nil, err
	}
	res := &foldResult{mem: s.Mem, sessions: true, seq: s.Seq, at: s.At, next: s.Next}
	res.cost.eventsFolded = s.Events
	res.cost.foldTime = time.Since(start)
	return res, nil
}

// recorder remembers which records the fold wrote since the last snapshot boundary: the new
// ones (PutTask, PutWake) and the changed ones (TaskEdited, WakeEdited). It overrides nothing
// else, so Apply still changes the Mem's own records in place.
type recorder struct {
	projection.State
	tasks map[string]struct{}
	wakes map[string]struct{}
}

func (r *recorder) PutTask(t *projection.Task) error {
	r.tasks[t.ID] = struct{}{}
	return r.State.PutTask(t)
}

func (r *recorder) PutWake(w *projection.Wake) error {
	r.wakes[w.ID] = struct{}{}
	return r.State.PutWake(w)
}

func (r *recorder) TaskEdited(t *projection.Task) error {
	r.tasks[t.ID] = struct{}{}
	return r.State.TaskEdited(t)
}

func (r *recorder) WakeEdited(w *projection.Wake) error {
	r.wakes[w.ID] = struct{}{}
	return r.State.WakeEdited(w)
}

// fullFold computes the whole store's state at a cut: it starts from the newest usable
// cached snapshot at or before the cut (if any), folds the log from there, and on the way
// writes a snapshot segment at every boundary it passes that the cache lacks.
func (a *app) fullFold(ctx context.Context, st store, c cut, cache *segCache) (*foldResult, error) {
	last, err := st.LastSeq(ctx)
	if err != nil {
		return nil, err
	}
	target := last
	if !c.ByTime && c.Seq < last {
		target = c.Seq
	}
	// Sized for the fold: a task's life is about three events.
	// The fold reads no index on the way: they are built from the records if something
	// reads one afterwards (projection.Mem.DeferIndexes).
	res := &foldResult{mem: projection.NewMemSized(int(min(target, 1<<26)/3), 0), lastSeq: last}
	res.mem.DeferIndexes()
	var start uint64
	if cache != nil {
		t0 := time.Now()
		mem, seq, n, records, err := cache.load(ctx, st, target, c)
		if err != nil {
			return nil, err
		}
		if seq > 0 {
			res.mem, start = mem, seq
			res.cost.snapshotSeq, res.cost.segmentsLoaded, res.cost.recordsLoaded = seq, n, records
			nt, nw := mem.Len()
			res.cost.recordsCurrent = nt + nw
			res.cost.loadTime = time.Since(t0)
			ev, err := st.Event(ctx, seq)
			if err != nil {
				return nil, err
			}
			res.seq, res.at = seq, ev.Head().At
		}
		res.cost.note = cache.note
	}
	if target == 0 || start >= target {
		return res, nil
	}

	// The fold steps over the pruned ranges: a pruned subject is simply absent.
	pruned, err := st.PrunedRanges(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	rec := &recorder{State: res.mem, tasks: map[string]struct{}{}, wakes: map[string]struct{}{}}
	window := newWindow()
	p := a.newProgress("folding the log", false)
	defer p.finish()
	err = st.FoldRange(ctx, start+1, target, func(ev events.Event) error { // keeps no event
		h := ev.Head()
		if c.Stops(h) {
			hc := *h
			res.next = &hc
			return errStop
		}
		if err := bridge(res.mem, pruned, h.Seq); err != nil {
			return err
		}
		if err := projection.Apply(rec, ev); err != nil {
			return err
		}
		res.seq, res.at = h.Seq, h.At
		res.cost.eventsFolded++
		window.see(h.At)
		if cache != nil && h.Seq%cache.k == 0 {
			if cache.write(ctx, st, res.mem, rec, h.Seq, window.maxAt) {
				res.cost.segmentsWritten++
			}
			clear(rec.tasks)
			clear(rec.wakes)
			window = newWindow()
		}
		p.update(h.Seq, target)
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, err
	}
	res.cost.foldTime = time.Since(t0)
	if cache != nil && cache.note != "" {
		res.cost.note = cache.note
	}
	return res, nil
}

type window struct{ maxAt int64 }

func newWindow() *window { return &window{maxAt: -1 << 63} }

func (w *window) see(at int64) { w.maxAt = max(w.maxAt, at) }
