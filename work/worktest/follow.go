package worktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// followScenarios: Queue.Follow (shared/spec/work-api-3.md, "Following the log"). A follower
// runs in its own goroutine and hands its events to the test through a channel; "nothing
// more arrived" is proved without sleeping, by writing a marker and requiring that the next
// event a follower hands out is the marker.
func followScenarios() []scenario {
	return []scenario{
		{"follow/history_then_live_exactly_once", followHistoryThenLive},
		{"follow/from_inside_and_beyond_the_head", followFrom},
		{"follow/from_a_pruned_point_like_read_log", followPruned},
		{"follow/context_end_returns_ctx_err", followContext},
		{"follow/callback_error_returned_as_is", followFnError},
		{"follow/callback_may_write_and_a_slow_one_blocks_nobody", followSlow},
		{"follow/concurrent_writers_three_followers", followConcurrent},
		{"follow/close_ends_followers", followClose},
	}
}

// follower is one Queue.Follow running in its own goroutine.
type follower struct {
	evs    chan events.Event
	done   chan error
	cancel context.CancelFunc
}

// follow starts a follower of the live queue from from; fn, when not nil, runs first for
// each event (its error ends the follower).
func (e *env) follow(from uint64, fn func(events.Event) error) *follower {
	ctx, cancel := context.WithCancel(e.ctx)
	f := &follower{evs: make(chan events.Event, 1<<14), done: make(chan error, 1), cancel: cancel}
	q := e.q
	go func() {
		f.done <- q.Follow(ctx, from, func(ev events.Event) error {
			if fn != nil {
				if err := fn(ev); err != nil {
					return err
				}
			}
			f.evs <- ev
			return nil
		})
	}()
	e.t.Cleanup(cancel)
	return f
}

// next receives n events from f, failing the test when they take longer than hangTimeout
// or f ends.
func (e *env) next(what string, f *follower, n int) []events.Event {
	e.t.Helper()
	out := make([]events.Event, 0, n)
	timeout := time.NewTimer(hangTimeout)
	defer timeout.Stop()
	for len(out) < n {
		select {
		case ev := <-f.evs:
			out = append(out, ev)
		case err := <-f.done:
			e.t.Fatalf("%s: the follower ended after %d of %d events: %v", what, len(out), n, err)
		case <-timeout.C:
			e.t.Fatalf("%s: the follower handed out %d of %d events in %v", what, len(out), n, hangTimeout)
		}
	}
	return out
}

// ended waits for f to return and returns its error.
func (e *env) ended(what string, f *follower) error {
	e.t.Helper()
	select {
	case err := <-f.done:
		return err
	case <-time.After(hangTimeout):
		e.t.Fatalf("%s: the follower did not return within %v", what, hangTimeout)
		return nil
	}
}

// sameEvents requires got to be want, event for event: sequence, type and wire bytes.
func (e *env) sameEvents(what string, got, want []events.Event) {
	e.t.Helper()
	if len(got) != len(want) {
		e.t.Fatalf("%s: %d events (seqs %v), want %d (seqs %v)", what, len(got), seqsOf(got), len(want), seqsOf(want))
	}
	for i := range got {
		gb, gerr := events.Append(nil, got[i])
		wb, werr := events.Append(nil, want[i])
		if gerr != nil || werr != nil || got[i].Head().Seq != want[i].Head().Seq || !bytes.Equal(gb, wb) {
			e.t.Fatalf("%s: event %d is seq %d %s, want seq %d %s (%v %v)", what, i,
				got[i].Head().Seq, got[i].Type(), want[i].Head().Seq, want[i].Type(), gerr, werr)
		}
	}
}

func seqsOf(evs []events.Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Head().Seq
	}
	return out
}

// readFrom is every event ReadLog hands out from from.
func (e *env) readFrom(from uint64) []events.Event {
	e.t.Helper()
	var out []events.Event
	e.ok("ReadLog", e.q.ReadLog(e.ctx, from, func(ev events.Event) error { out = append(out, ev); return nil }))
	return out
}

// marker submits a task of kind "marker" and requires that the next event f hands out is
// its submission: f handed out nothing else before it.
func (e *env) marker(what string, f *follower, s string, now time.Time) {
	e.t.Helper()
	t := e.submit(s, work.TaskRequest{Kind: "marker"}, now)
	ev := e.next(what, f, 1)[0]
	sub, ok := ev.(*events.TaskSubmitted)
	if !ok || sub.TaskID != t.ID {
		e.t.Fatalf("%s: the follower handed out seq %d %s before the marker %s", what, ev.Head().Seq, ev.Type(), t.ID)
	}
}

func followHistoryThenLive(e *env) {
	const s = "session_follow"
	for i := 0; i < 3; i++ {
		e.submit(s, work.TaskRequest{Kind: "k"}, at(100+i))
	}
	f := e.follow(0, nil)
	e.sameEvents("history", e.next("history", f, 3), e.readFrom(1))

	// Live: each command's events, once, in order, as ReadLog reads them afterwards.
	d := e.claimOne(at(110))
	e.finish(d, work.Success(js(`{"n":1}`)), at(111))
	e.wake(s, work.WakeRequest{Payload: js(`{"w":1}`)}, at(112))
	live := e.next("live", f, 3)
	e.sameEvents("live", live, e.readFrom(4))
	e.marker("after the live events", f, s, at(113))

	// A second follower from 1 reads the same log.
	g := e.follow(1, nil)
	all := e.readFrom(1)
	e.sameEvents("second follower", e.next("second follower", g, len(all)), all)
	e.marker("second follower", g, s, at(114))
	e.next("first follower sees the second marker", f, 1)

	f.cancel()
	g.cancel()
	e.ended("cancel", f)
	e.ended("cancel", g)

	// Nil fn: a clear error, nothing read.
	e.wantInvalid("Follow(nil)", e.q.Follow(e.ctx, 0, nil), "fn")
}

func followFrom(e *env) {
	const s = "session_follow_from"
	for i := 0; i < 5; i++ {
		e.submit(s, work.TaskRequest{Kind: "k"}, at(100+i))
	}
	f := e.follow(3, nil)
	e.sameEvents("from 3", e.next("from 3", f, 3), e.readFrom(3))
	f.cancel()
	e.ended("cancel", f)

	// From beyond the head: nothing until that event exists, then it first.
	g := e.follow(8, nil)
	e.submit(s, work.TaskRequest{Kind: "k"}, at(110)) // seq 6
	e.submit(s, work.TaskRequest{Kind: "k"}, at(111)) // seq 7
	e.submit(s, work.TaskRequest{Kind: "k"}, at(112)) // seq 8
	got := e.next("from beyond the head", g, 1)
	if got[0].Head().Seq != 8 {
		e.t.Fatalf("a follower from 8 first handed out seq %d", got[0].Head().Seq)
	}
	e.marker("from beyond the head", g, s, at(113))
}

func followPruned(e *env) {
	keep := e.submit("s1", work.TaskRequest{Kind: "k", RunAt: at(900)}, at(1))
	e.done("s1", work.TaskRequest{Kind: "k"}, at(10))
	e.done("s1", work.TaskRequest{Kind: "k"}, at(20))
	e.prune(at(100), 2, 0)
	retained := e.readFrom(2)
	if len(retained) != 0 {
		e.t.Fatalf("after the prune ReadLog from 2 reads seqs %v, want none", seqsOf(retained))
	}
	// From inside the pruned range, and from 1: what ReadLog reads, then the live events,
	// whose sequences follow the last one ever assigned.
	f := e.follow(3, nil)
	g := e.follow(1, nil)
	e.sameEvents("from 1 after a prune", e.next("from 1", g, 1), e.readFrom(1))
	e.submit("s1", work.TaskRequest{Kind: "k"}, at(200))
	ev := e.next("from a pruned point", f, 1)[0]
	if ev.Head().Seq != 8 {
		e.t.Fatalf("the submit after the prune reached the follower as seq %d, want 8", ev.Head().Seq)
	}
	if got := e.next("from 1, live", g, 1); got[0].Head().Seq != 8 {
		e.t.Fatalf("the follower from 1 handed out seq %d after the prune, want 8", got[0].Head().Seq)
	}
	e.mustTask("s1", keep.ID)
}

func followContext(e *env) {
	const s = "session_follow_ctx"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))

	// Canceled while it waits.
	f := e.follow(0, nil)
	e.next("before cancel", f, 1)
	f.cancel()
	if err := e.ended("cancel", f); err != context.Canceled {
		e.t.Errorf("a canceled follower returned %v, want context.Canceled as is", err)
	}

	// A deadline ends it with context.DeadlineExceeded, and a done ctx before the call too.
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	if err := e.q.Follow(ctx, 0, func(events.Event) error { return nil }); err != context.DeadlineExceeded {
		e.t.Errorf("a follower past its deadline returned %v, want context.DeadlineExceeded as is", err)
	}
	done, cancel2 := context.WithCancel(e.ctx)
	cancel2()
	called := false
	if err := e.q.Follow(done, 0, func(events.Event) error { called = true; return nil }); err != context.Canceled || called {
		e.t.Errorf("Follow with a done ctx returned %v (fn called: %v), want context.Canceled and no call", err, called)
	}

	// Canceled inside fn, during the history: it stops there.
	for i := 0; i < 5; i++ {
		e.submit(s, work.TaskRequest{Kind: "k"}, at(101+i))
	}
	ctx3, cancel3 := context.WithCancel(e.ctx)
	defer cancel3()
	n := 0
	err := e.q.Follow(ctx3, 0, func(events.Event) error {
		n++
		if n == 2 {
			cancel3()
		}
		return nil
	})
	if err != context.Canceled || n > 2 {
		e.t.Errorf("a follower canceled in its callback returned %v after %d events, want context.Canceled after 2", err, n)
	}
}

func followFnError(e *env) {
	const s = "session_follow_err"
	for i := 0; i < 3; i++ {
		e.submit(s, work.TaskRequest{Kind: "k"}, at(100+i))
	}
	// In the history.
	stop := errors.New("stop here")
	n := 0
	err := e.q.Follow(e.ctx, 0, func(events.Event) error {
		n++
		if n == 2 {
			return stop
		}
		return nil
	})
	if err != stop || n != 2 {
		e.t.Errorf("Follow returned %v after %d events, want the callback's error as is after 2", err, n)
	}
	// Live: the first event past the history.
	type fnErr struct{ error }
	live := &fnErr{errors.New("live stop")}
	f := e.follow(0, func(ev events.Event) error {
		if ev.Head().Seq == 4 {
			return live
		}
		return nil
	})
	e.next("history", f, 3)
	e.submit(s, work.TaskRequest{Kind: "k"}, at(110))
	if err := e.ended("live error", f); err != error(live) {
		e.t.Errorf("Follow returned %v, want the callback's live error as is", err)
	}
}

func followSlow(e *env) {
	const s = "session_follow_slow"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	// fn writes to the queue (as ReadLog's may) ...
	q := e.q
	wrote := make(chan string, 1)
	f := e.follow(0, func(ev events.Event) error {
		if ev.Head().Seq == 1 {
			t, err := q.Session(s).SubmitAt(e.ctx, work.TaskRequest{Kind: "inside"}, at(101))
			if err != nil {
				return err
			}
			wrote <- t.ID
		}
		return nil
	})
	evs := e.next("a callback that writes", f, 2)
	id := <-wrote
	if sub, ok := evs[1].(*events.TaskSubmitted); !ok || sub.TaskID != id {
		e.t.Fatalf("the follower's second event is %s, want the submit of %s its callback made", evs[1].Type(), id)
	}
	// ... and one that blocks holds up neither the writer nor another follower.
	release := make(chan struct{})
	blocked := make(chan struct{}, 1)
	slow := e.follow(0, func(ev events.Event) error {
		if ev.Head().Seq == 1 {
			blocked <- struct{}{}
			<-release
		}
		return nil
	})
	<-blocked
	for i := 0; i < 10; i++ {
		e.submit(s, work.TaskRequest{Kind: "k"}, at(110+i)) // returns while slow's fn blocks
	}
	e.next("a fast follower beside a blocked one", f, 10)
	close(release)
	e.sameEvents("the slow follower, released", e.next("slow", slow, 12), e.readFrom(1))
}

func followConcurrent(e *env) {
	const writers, each = 4, 25
	for i := 0; i < 3; i++ {
		e.submit("session_follow_conc", work.TaskRequest{Kind: "k"}, at(100))
	}
	fs := []*follower{e.follow(0, nil), e.follow(1, nil), e.follow(2, nil)}
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess := e.q.Session(fmt.Sprintf("session_follow_conc_%d", w))
			for i := 0; i < each; i++ {
				t, err := sess.SubmitAt(e.ctx, work.TaskRequest{Kind: "k"}, at(101+i))
				if err == nil && i%5 == 0 {
					_, err = sess.CancelAt(e.ctx, t.ID, at(102+i))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.ok("concurrent write", err)
	}
	all := e.readFrom(1)
	for i, ev := range all {
		if ev.Head().Seq != uint64(i+1) {
			e.t.Fatalf("the log has seq %d at %d", ev.Head().Seq, i)
		}
	}
	for i, f := range fs {
		from := max(i, 1)
		want := all[from-1:]
		e.sameEvents(fmt.Sprintf("follower %d", i), e.next(fmt.Sprintf("follower %d", i), f, len(want)), want)
	}
	for i, f := range fs {
		e.marker(fmt.Sprintf("follower %d", i), f, "session_follow_conc", at(300))
		for _, g := range fs[i+1:] {
			e.next("the other followers see the marker", g, 1)
		}
	}
}

func followClose(e *env) {
	const s = "session_follow_close"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	f := e.follow(0, nil)
	g := e.follow(10, nil) // waits beyond the head
	e.next("before Close", f, 1)
	e.ok("Close", e.q.Close())
	e.closed = true
	for _, x := range []*follower{f, g} {
		err := e.ended("Close", x)
		e.wantErr("a follower of a closed queue", err, work.ErrBackend)
		if !errors.Is(err, work.ErrClosed) {
			e.t.Errorf("a follower of a closed queue returned %v, which does not wrap ErrClosed", err)
		}
	}
	err := e.q.Follow(e.ctx, 0, func(events.Event) error { return nil })
	e.wantErr("Follow after Close", err, work.ErrBackend)
	if !errors.Is(err, work.ErrClosed) {
		e.t.Errorf("Follow after Close returned %v, which does not wrap ErrClosed", err)
	}
}
