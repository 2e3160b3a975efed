package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// format3Views renders what a reader holds in format 3's keyspaces for the given kinds and
// sessions: every kind's due entries (all, and those due at now), every session's list (whole,
// and after its second task) and the counts.
func format3Views(t *testing.T, r projection.Reader, kinds, sessions []string, now int64) []string {
	t.Helper()
	var out []string
	for _, kind := range kinds {
		for _, maxAt := range []int64{now, 1<<63 - 1} {
			var es []string
			if err := r.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, maxAt, func(e projection.IndexEntry) bool {
				es = append(es, fmt.Sprintf("%s@%d/%d", e.ID, e.At, e.Seq))
				return true
			}); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("kind %s due at %d: %v", kind, maxAt, es))
		}
	}
	for _, session := range sessions {
		var all []string
		var second uint64
		if err := r.ScanSessionTasks(session, 0, func(seq uint64, id string) bool {
			if len(all) == 1 {
				second = seq
			}
			all = append(all, fmt.Sprintf("%d:%s", seq, id))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		var after []string
		if err := r.ScanSessionTasks(session, second, func(seq uint64, id string) bool {
			after = append(after, fmt.Sprintf("%d:%s", seq, id))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("session %q: %v; after %d: %v", session, all, second, after))
	}
	counts := map[string]int64{}
	if err := r.Counts(func(kind string, state events.TaskState, n int64) bool {
		counts[fmt.Sprintf("%s/%s", kind, state)] = n
		return true
	}); err != nil {
		t.Fatal(err)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range counts {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		out = append(out, fmt.Sprintf("count %s = %d", k, counts[k]))
	}
	return out
}

// The store's format-3 keyspaces, folded by the real fold through the writer in batches of
// several commands, read exactly as an in-memory fold of the same history (projection.Mem)
// reads them: through View, through the writer (inside a command), and after a reopen; and
// Verify agrees. The history is random: submits of three kinds (one a prefix of another) in
// three sessions, claims, extensions, releases, settlements and cancel requests.
func TestFormat3MatchesMemFold(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { format3MatchesMem(t, seed) })
	}
}

func format3MatchesMem(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 13))
	kinds := []string{"a", "ab", "b"}
	sessions := []string{"s", "s1", "s2"}
	dir := t.TempDir()
	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	m := projection.NewMem()
	now := sec(0)
	nextTask := 0

	// next returns a valid event for the current model state (applied to it), or nil.
	next := func() events.Event {
		now += int64(rng.IntN(3)) * 1e9
		h := func(session string) events.Header { return events.Header{SessionID: session, At: now} }
		tasks := m.Tasks()
		var ev events.Event
		switch op := rng.IntN(10); {
		case op < 4 || len(tasks) == 0:
			nextTask++
			e := &events.TaskSubmitted{Header: h(sessions[rng.IntN(len(sessions))]),
				TaskID: fmt.Sprintf("t%04d", nextTask), Kind: kinds[rng.IntN(len(kinds))], Input: []byte(`{}`)}
			if rng.IntN(3) == 0 {
				e.HasRunAt, e.RunAt = true, now+int64(rng.IntN(10))*1e9
			}
			ev = e
		default:
			x := tasks[rng.IntN(len(tasks))]
			hd := h(x.SessionID)
			switch {
			case x.ClaimableAt(now) && op < 7:
				ev = &events.TaskClaimed{Header: hd, TaskID: x.ID, Attempt: x.Attempts + 1,
					LeaseToken: fmt.Sprintf("tok%d", rng.Uint32()), LeaseExpiresAt: now + int64(1+rng.IntN(5))*1e9}
			case x.State == events.StateRunning && op == 7:
				ev = &events.TaskExtended{Header: hd, TaskID: x.ID, Attempt: x.Attempts, LeaseExpiresAt: now + int64(1+rng.IntN(8))*1e9}
			case x.State == events.StateRunning && op == 8:
				ev = &events.TaskReleased{Header: hd, TaskID: x.ID, Attempt: x.Attempts, RunAt: now + int64(rng.IntN(4))*1e9, Reason: "again"}
			case x.State == events.StateRunning:
				st := events.StateSucceeded
				if rng.IntN(2) == 0 {
					st = events.StateFailed
				}
				ev = &events.TaskSettled{Header: hd, TaskID: x.ID, Attempt: x.Attempts, LeaseToken: x.LeaseToken,
					Outcome: events.Outcome{State: st}}
			case !x.State.Terminal():
				ev = &events.TaskCancelRequested{Header: hd, TaskID: x.ID}
			default:
				return nil
			}
		}
		last, _ := m.LastSeq()
		ev.Head().Seq = last + 1
		if err := projection.Apply(m, ev); err != nil {
			t.Fatalf("the model refused %s: %v", ev.Type(), err)
		}
		return ev
	}
	appendAll := func(evs []events.Event) func(*Txn) error {
		return func(tx *Txn) error {
			for _, ev := range evs {
				if err := tx.Append(ev); err != nil {
					return err
				}
			}
			return nil
		}
	}
	for range 40 {
		var cmds []func(*Txn) error
		for range 1 + rng.IntN(4) {
			var evs []events.Event
			for range 1 + rng.IntN(3) {
				if ev := next(); ev != nil {
					evs = append(evs, ev)
				}
			}
			cmds = append(cmds, appendAll(evs))
		}
		if err := errors.Join(inOneBatch(t, s, cmds...)...); err != nil {
			t.Fatal(err)
		}
	}
	want := format3Views(t, m, kinds, sessions, now)
	check := func(where string, got []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s reads\n%v\nthe in-memory fold\n%v", where, got, want)
		}
	}
	var got []string
	s.View(context.Background(), func(r projection.Reader) error { got = format3Views(t, r, kinds, sessions, now); return nil })
	check("View", got)
	s.Update(context.Background(), func(tx *Txn) error { got = format3Views(t, tx.Reader(), kinds, sessions, now); return nil })
	check("the writer", got)
	mustVerify(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, &Options{})
	s.Update(context.Background(), func(tx *Txn) error { got = format3Views(t, tx.Reader(), kinds, sessions, now); return nil })
	check("the writer after a reopen", got)
}
