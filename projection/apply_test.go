package projection

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
)

// applyCase applies ev after the accepted events pre (numbered 1, 2, ...). ev gets the next
// sequence number unless seq is set. With rule "", ev must be accepted and check holds of
// the state after it; otherwise ev must be rejected with an *ApplyError whose rule contains
// rule, and leave the state exactly as pre left it, without a single write.
type applyCase struct {
	name  string
	pre   []events.Event
	ev    events.Event
	seq   uint64
	rule  string
	check func(t *testing.T, m *Mem)
}

// seqZero as applyCase.seq gives the event sequence number 0.
const seqZero = math.MaxUint64

func runApplyCases(t *testing.T, cases []applyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pre := number(tc.pre)
			m := fold(t, pre)
			seq := tc.seq
			switch seq {
			case 0:
				seq = uint64(len(pre) + 1)
			case seqZero:
				seq = 0
			}
			tc.ev.Head().Seq = seq
			s := &spy{State: copying{m}}
			err := Apply(s, tc.ev) // records copied out and written back, as pebblelog's writer
			// A bare *Mem, whose records Apply changes in place, must give the same answer
			// and state.
			direct := fold(t, pre)
			if derr := Apply(direct, tc.ev); (derr == nil) != (err == nil) ||
				(err != nil && derr.Error() != err.Error()) {
				t.Errorf("on a bare Mem: %v; through copies: %v", derr, err)
			}
			if d := direct.Diff(m); len(d) > 0 {
				t.Errorf("in place and through copies differ:\n%s", strings.Join(d, "\n"))
			}
			if tc.rule == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if last, _ := m.LastSeq(); last != seq {
					t.Errorf("LastSeq = %d, want %d", last, seq)
				}
				checkInvariants(t, m)
				if tc.check != nil {
					tc.check(t, m)
				}
				// The same events refolded give the same state.
				if d := fold(t, append(slices.Clip(pre), tc.ev)).Diff(m); len(d) > 0 {
					t.Errorf("refold differs: %v", d)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want a rejection (%s)", tc.rule)
			}
			var ae *ApplyError
			if !errors.As(err, &ae) {
				t.Fatalf("error %T is not an *ApplyError: %v", err, err)
			}
			if !errors.Is(err, ErrInconsistent) {
				t.Errorf("error %v is not ErrInconsistent", err)
			}
			taskID, wakeID := tc.ev.Subject()
			if ae.Seq != seq || ae.Type != tc.ev.Type() || ae.ID != taskID+wakeID {
				t.Errorf("error names seq %d, %s %q; want %d, %s %q", ae.Seq, ae.Type, ae.ID, seq, tc.ev.Type(), taskID+wakeID)
			}
			if !strings.Contains(ae.Rule, tc.rule) {
				t.Errorf("rule %q does not contain %q", ae.Rule, tc.rule)
			}
			if !strings.HasPrefix(err.Error(), ErrInconsistent.Error()) {
				t.Errorf("message %q", err)
			}
			if s.writes != 0 {
				t.Errorf("a rejected event made %d writes", s.writes)
			}
			if d := m.Diff(fold(t, pre)); len(d) > 0 {
				t.Errorf("a rejected event changed the state:\n%s", strings.Join(d, "\n"))
			}
		})
	}
}

func TestApplyTaskSubmitted(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "submit", ev: submit("t", 5), check: func(t *testing.T, m *Mem) {
			x := task(t, m, "t")
			if x.State != events.StatePending || x.ScheduledAt != 5 || x.CreatedAt != 5 || x.SubmitSeq != 1 ||
				x.UpdatedSeq != 1 || x.SessionID != sess || x.Kind != "k" || string(x.Input) != `{"n":1}` || x.HasRunAt {
				t.Errorf("task %+v", x)
			}
			if got := dueOf(t, m); len(got) != 1 || got[0] != (IndexEntry{At: 5, Seq: 1, ID: "t"}) {
				t.Errorf("due %v", got)
			}
		}},
		{name: "submit for later", ev: submitAt("t", 5, 100), check: func(t *testing.T, m *Mem) {
			if x := task(t, m, "t"); x.ScheduledAt != 100 || !x.HasRunAt || x.RunAt != 100 || x.CreatedAt != 5 {
				t.Errorf("task %+v", x)
			}
			if got := scan(t, scanner(m, IndexDue, ""), 99); len(got) != 0 {
				t.Errorf("due at 99: %v", got)
			}
			if got := scan(t, scanner(m, IndexDue, ""), 100); len(got) != 1 {
				t.Errorf("due at 100: %v", got)
			}
		}},
		{name: "submit for earlier", ev: submitAt("t", 5, -100), check: func(t *testing.T, m *Mem) {
			if got := scan(t, scanner(m, IndexDue, ""), -100); len(got) != 1 || got[0].At != -100 {
				t.Errorf("due at -100: %v", got)
			}
		}},
		{name: "submit with a key", ev: submitKey("t", 5, "k1"), check: func(t *testing.T, m *Mem) {
			if id, _ := m.TaskKey(sess, "k1"); id != "t" {
				t.Errorf("TaskKey = %q", id)
			}
			if id, _ := m.TaskKey(other, "k1"); id != "" {
				t.Errorf("TaskKey in another session = %q", id)
			}
		}},
		{name: "same key in another session", pre: []events.Event{submitKey("t1", 0, "k")},
			ev: in(other, submitKey("t2", 1, "k"))},
		{name: "a wake's key is not a task key", pre: []events.Event{wakeKey("w", 0, "k")},
			ev: submitKey("t", 1, "k")},
		{name: "after many", pre: []events.Event{submit("a", 0), claim("a", 1, 1, "x"), cancel("a", 2)},
			ev: submit("b", 3)},

		{name: "sequence gap", ev: submit("t", 0), seq: 2, rule: "sequence 2 does not follow 0"},
		{name: "sequence gap later", pre: []events.Event{submit("a", 0)}, ev: submit("t", 0), seq: 3,
			rule: "sequence 3 does not follow 1"},
		{name: "sequence repeated", pre: []events.Event{submit("a", 0)}, ev: submit("t", 0), seq: 1,
			rule: "sequence 1 does not follow 1"},
		{name: "sequence far ahead", ev: submit("t", 0), seq: 1 << 63, rule: "does not follow 0"},
		{name: "sequence 0", ev: submit("t", 0), seq: seqZero, rule: "sequence 0 does not follow 0"},
		{name: "sequence 0 later", pre: []events.Event{submit("a", 0)}, ev: submit("t", 0), seq: seqZero,
			rule: "sequence 0 does not follow 1"},
		{name: "task id reused", pre: []events.Event{submit("t", 0)}, ev: submit("t", 1), rule: "task id already used"},
		{name: "task id reused by another session", pre: []events.Event{submit("t", 0)}, ev: in(other, submit("t", 1)),
			rule: "task id already used"},
		{name: "no task id", ev: submit("", 0), rule: "a task needs an id and a kind"},
		{name: "no kind", ev: with(submit("t", 0), func(e *events.TaskSubmitted) { e.Kind = "" }),
			rule: "a task needs an id and a kind"},
		{name: "key reuse", pre: []events.Event{submitKey("t1", 0, "k")}, ev: submitKey("t2", 1, "k"),
			rule: `idempotency key "k" already names t1`},
		{name: "key reuse after the first finished", pre: []events.Event{submitKey("t1", 0, "k"), cancel("t1", 1)},
			ev: submitKey("t2", 2, "k"), rule: `idempotency key "k" already names t1`},
	})
}

func TestApplyTaskClaimed(t *testing.T) {
	running := []events.Event{submit("t", 0), claim("t", 10, 1, "a")} // lease until 40
	runningCancel := []events.Event{submit("t", 0), claim("t", 10, 1, "a"), cancel("t", 15)}
	runAt50 := []events.Event{submitAt("t", 0, 50)}
	runningWake := []events.Event{submitW("t", 0), claim("t", 10, 1, "a")}
	runningOther := []events.Event{in(other, submit("t", 0))}
	plus := func(base []events.Event, evs ...events.Event) []events.Event {
		return append(append([]events.Event{}, base...), evs...)
	}
	runApplyCases(t, []applyCase{
		{name: "claim at the scheduled time", pre: runAt50, ev: claim("t", 50, 1, "a"), check: func(t *testing.T, m *Mem) {
			x := task(t, m, "t")
			if x.State != events.StateRunning || x.Attempts != 1 || x.LeaseToken != "a" || x.LeaseExpiresAt != 80 || x.UpdatedSeq != 2 {
				t.Errorf("task %+v", x)
			}
			// A running task is in the due index at its lease expiry.
			if got := dueOf(t, m); len(got) != 1 || got[0] != (IndexEntry{At: 80, Seq: 1, ID: "t"}) {
				t.Errorf("due %v", got)
			}
		}},
		{name: "claim long after", pre: runAt50, ev: claim("t", 1e18, 1, "a")},
		{name: "reclaim at lease expiry", pre: running, ev: claim("t", 40, 2, "b"), check: func(t *testing.T, m *Mem) {
			x := task(t, m, "t")
			if x.State != events.StateRunning || x.Attempts != 2 || x.LeaseToken != "b" || x.LeaseExpiresAt != 70 {
				t.Errorf("task %+v", x)
			}
			if got := dueOf(t, m); len(got) != 1 || got[0] != (IndexEntry{At: 70, Seq: 1, ID: "t"}) {
				t.Errorf("due %v", got)
			}
		}},
		{name: "reclaim with a cancel request", pre: runningCancel, ev: claim("t", 45, 2, "b"), check: func(t *testing.T, m *Mem) {
			if x := task(t, m, "t"); !x.CancelRequested || x.CancelRequestedAt != 15 || x.State != events.StateRunning {
				t.Errorf("task %+v", x)
			}
		}},
		{name: "reclaim after a recorded rejection", pre: plus(running, rejectSettle("t", 12, 1, events.RejectTokenMismatch)),
			ev: claim("t", 40, 2, "b")},

		{name: "before the scheduled time", pre: runAt50, ev: claim("t", 49, 1, "a"),
			rule: "claim of a task that is not eligible (state pending)"},
		{name: "lease not expired", pre: running, ev: claim("t", 39, 2, "b"),
			rule: "claim of a task that is not eligible (state running)"},
		{name: "succeeded", pre: plus(running, settle("t", 20, 1, "a", events.StateSucceeded)), ev: claim("t", 100, 2, "b"),
			rule: "not eligible (state succeeded)"},
		{name: "failed", pre: plus(running, settle("t", 20, 1, "a", events.StateFailed)), ev: claim("t", 100, 2, "b"),
			rule: "not eligible (state failed)"},
		{name: "canceled while pending", pre: []events.Event{submit("t", 0), cancel("t", 1)}, ev: claim("t", 100, 1, "b"),
			rule: "not eligible (state canceled)"},
		{name: "canceled with a completion wake", pre: plus(runningWake, settle("t", 20, 1, "a", events.StateCanceled),
			doneWake("w", "t", 20, events.StateCanceled)), ev: claim("t", 100, 2, "b"), rule: "not eligible"},
		{name: "attempt too high", pre: runAt50, ev: claim("t", 50, 2, "a"), rule: "claim attempt 2, want 1"},
		{name: "attempt 0", pre: runAt50, ev: claim("t", 50, 0, "a"), rule: "claim attempt 0, want 1"},
		{name: "reclaim with the old attempt", pre: running, ev: claim("t", 40, 1, "b"), rule: "claim attempt 1, want 2"},
		{name: "no token", pre: runAt50, ev: claim("t", 50, 1, ""), rule: "claim needs a token"},
		{name: "lease ends at the claim", pre: runAt50,
			ev: with(claim("t", 50, 1, "a"), func(e *events.TaskClaimed) { e.LeaseExpiresAt = 50 }), rule: "claim needs a token"},
		{name: "lease ends before the claim", pre: runAt50,
			ev: with(claim("t", 50, 1, "a"), func(e *events.TaskClaimed) { e.LeaseExpiresAt = -1 }), rule: "claim needs a token"},
		{name: "unknown task", pre: runAt50, ev: claim("u", 50, 1, "a"), rule: "no such task"},
		{name: "foreign session", pre: runningOther, ev: claim("t", 50, 1, "a"),
			rule: `task belongs to session "s2", event names "s1"`},
	})
}

func TestApplyTaskSettled(t *testing.T) {
	running := []events.Event{submit("t", 0), claim("t", 10, 1, "a")}
	reclaimed := []events.Event{submit("t", 0), claim("t", 10, 1, "a"), claim("t", 40, 2, "b")}
	settled := []events.Event{submit("t", 0), claim("t", 10, 1, "a"), settle("t", 20, 1, "a", events.StateSucceeded)}
	runApplyCases(t, []applyCase{
		{name: "success by the owner", pre: running, ev: settle("t", 20, 1, "a", events.StateSucceeded), check: func(t *testing.T, m *Mem) {
			x := task(t, m, "t")
			if x.State != events.StateSucceeded || x.FinishedAt != 20 || x.Outcome.Summary != "done" ||
				string(x.Outcome.Output) != `{"ok":true}` || x.SettledToken != "a" || x.LeaseToken != "" ||
				x.LeaseExpiresAt != 0 || x.Attempts != 1 || x.UpdatedSeq != 3 {
				t.Errorf("task %+v", x)
			}
			if got := dueOf(t, m); len(got) != 0 {
				t.Errorf("a settled task is due: %v", got)
			}
		}},
		{name: "failure", pre: running, ev: settle("t", 20, 1, "a", events.StateFailed), check: func(t *testing.T, m *Mem) {
			if x := task(t, m, "t"); x.State != events.StateFailed || x.Outcome.Error != "boom" {
				t.Errorf("task %+v", x)
			}
		}},
		{name: "worker reports canceled", pre: append(running, cancel("t", 12)), ev: settle("t", 20, 1, "a", events.StateCanceled),
			check: func(t *testing.T, m *Mem) {
				if x := task(t, m, "t"); x.State != events.StateCanceled || x.SettledToken != "a" || x.CancelRequestedAt != 12 {
					t.Errorf("task %+v", x)
				}
			}},
		{name: "after the lease expired, not reclaimed", pre: running, ev: settle("t", 1000, 1, "a", events.StateSucceeded)},
		{name: "the new owner", pre: reclaimed, ev: settle("t", 50, 2, "b", events.StateSucceeded)},

		{name: "wrong token", pre: running, ev: settle("t", 20, 1, "x", events.StateSucceeded),
			rule: "settlement by a delivery that does not own the claim"},
		{name: "wrong attempt", pre: running, ev: settle("t", 20, 2, "a", events.StateSucceeded), rule: "does not own the claim"},
		{name: "superseded attempt", pre: reclaimed, ev: settle("t", 50, 1, "a", events.StateSucceeded), rule: "does not own the claim"},
		{name: "new attempt, old token", pre: reclaimed, ev: settle("t", 50, 2, "a", events.StateSucceeded), rule: "does not own the claim"},
		{name: "never claimed", pre: []events.Event{submit("t", 0)}, ev: settle("t", 20, 0, "", events.StateSucceeded),
			rule: "does not own the claim"},
		{name: "second settlement", pre: settled, ev: settle("t", 30, 1, "a", events.StateSucceeded), rule: "does not own the claim"},
		{name: "canceled while pending", pre: []events.Event{submit("t", 0), cancel("t", 1)},
			ev: settle("t", 30, 0, "", events.StateCanceled), rule: "does not own the claim"},
		{name: "unknown task", pre: running, ev: settle("u", 20, 1, "a", events.StateSucceeded), rule: "no such task"},
		{name: "foreign session", pre: running, ev: in(other, settle("t", 20, 1, "a", events.StateSucceeded)),
			rule: `task belongs to session "s1", event names "s2"`},
	})
}

func TestApplyTaskCancelRequested(t *testing.T) {
	running := []events.Event{submit("t", 0), claim("t", 10, 1, "a")}
	runApplyCases(t, []applyCase{
		{name: "pending becomes canceled", pre: []events.Event{submit("t", 0)}, ev: cancel("t", 5), check: func(t *testing.T, m *Mem) {
			x := task(t, m, "t")
			if x.State != events.StateCanceled || !x.CancelRequested || x.CancelRequestedAt != 5 || x.FinishedAt != 5 ||
				!reflect.DeepEqual(x.Outcome, events.Outcome{State: events.StateCanceled}) || x.SettledToken != "" || x.UpdatedSeq != 2 {
				t.Errorf("task %+v", x)
			}
			if got := dueOf(t, m); len(got) != 0 {
				t.Errorf("a canceled task is due: %v", got)
			}
		}},
		{name: "scheduled for later", pre: []events.Event{submitAt("t", 0, 100)}, ev: cancel("t", 5), check: func(t *testing.T, m *Mem) {
			if x := task(t, m, "t"); x.State != events.StateCanceled {
				t.Errorf("task %+v", x)
			}
		}},
		{name: "running records the request", pre: running, ev: cancel("t", 15), check: func(t *testing.T, m *Mem) {
			x := task(t, m, "t")
			if x.State != events.StateRunning || !x.CancelRequested || x.CancelRequestedAt != 15 || x.FinishedAt != 0 || x.LeaseToken != "a" {
				t.Errorf("task %+v", x)
			}
			if got := dueOf(t, m); len(got) != 1 || got[0] != (IndexEntry{At: 40, Seq: 1, ID: "t"}) {
				t.Errorf("due %v", got)
			}
		}},
		{name: "second request keeps the first time", pre: append(running, cancel("t", 15)), ev: cancel("t", 20),
			check: func(t *testing.T, m *Mem) {
				if x := task(t, m, "t"); x.CancelRequestedAt != 15 || x.UpdatedSeq != 4 {
					t.Errorf("task %+v", x)
				}
			}},

		{name: "succeeded", pre: append(running, settle("t", 20, 1, "a", events.StateSucceeded)), ev: cancel("t", 30),
			rule: "cancel request on a terminal task"},
		{name: "failed", pre: append(running, settle("t", 20, 1, "a", events.StateFailed)), ev: cancel("t", 30),
			rule: "cancel request on a terminal task"},
		{name: "canceled", pre: []events.Event{submit("t", 0), cancel("t", 1)}, ev: cancel("t", 2),
			rule: "cancel request on a terminal task"},
		{name: "unknown task", ev: cancel("t", 2), rule: "no such task"},
		{name: "foreign session", pre: []events.Event{submit("t", 0)}, ev: in(other, cancel("t", 2)), rule: "task belongs to session"},
	})
}

func TestApplyTaskSettleRejected(t *testing.T) {
	running := []events.Event{submit("t", 0), claim("t", 10, 1, "a")}
	reclaimed := []events.Event{submit("t", 0), claim("t", 10, 1, "a"), claim("t", 40, 2, "b")}
	plus := func(base []events.Event, evs ...events.Event) []events.Event {
		return append(append([]events.Event{}, base...), evs...)
	}
	// A recorded rejection changes nothing but the count and the record's sequence.
	unchanged := func(attempt uint32) func(t *testing.T, m *Mem) {
		return func(t *testing.T, m *Mem) {
			x := task(t, m, "t")
			last, _ := m.LastSeq()
			if x.RejectedAttempt != attempt || x.UpdatedSeq != last {
				t.Errorf("RejectedAttempt %d, UpdatedSeq %d; want %d, %d", x.RejectedAttempt, x.UpdatedSeq, attempt, last)
			}
		}
	}
	runApplyCases(t, []applyCase{
		{name: "token mismatch", pre: running, ev: rejectSettle("t", 20, 1, events.RejectTokenMismatch), check: func(t *testing.T, m *Mem) {
			unchanged(1)(t, m)
			if x := task(t, m, "t"); x.State != events.StateRunning || x.LeaseToken != "a" {
				t.Errorf("task %+v", x)
			}
		}},
		{name: "superseded", pre: reclaimed, ev: rejectSettle("t", 50, 1, events.RejectSuperseded), check: unchanged(1)},
		{name: "superseded, then current", pre: plus(reclaimed, rejectSettle("t", 50, 1, events.RejectSuperseded)),
			ev: rejectSettle("t", 51, 2, events.RejectTokenMismatch), check: unchanged(2)},
		{name: "skipping an attempt", pre: reclaimed, ev: rejectSettle("t", 50, 2, events.RejectTokenMismatch), check: unchanged(2)},
		{name: "after settlement", pre: plus(running, settle("t", 20, 1, "a", events.StateSucceeded)),
			ev: rejectSettle("t", 30, 1, events.RejectNotClaimed), check: func(t *testing.T, m *Mem) {
				unchanged(1)(t, m)
				if x := task(t, m, "t"); x.State != events.StateSucceeded {
					t.Errorf("task %+v", x)
				}
			}},

		{name: "attempt 0", pre: running, ev: rejectSettle("t", 20, 0, events.RejectNotClaimed),
			rule: "rejection of attempt 0 is not recordable (attempts 1, recorded 0)"},
		{name: "attempt never made", pre: running, ev: rejectSettle("t", 20, 2, events.RejectNotClaimed),
			rule: "rejection of attempt 2 is not recordable"},
		{name: "never claimed", pre: []events.Event{submit("t", 0)}, ev: rejectSettle("t", 20, 1, events.RejectNotClaimed),
			rule: "rejection of attempt 1 is not recordable (attempts 0, recorded 0)"},
		{name: "second of the same attempt", pre: plus(running, rejectSettle("t", 20, 1, events.RejectTokenMismatch)),
			ev: rejectSettle("t", 21, 1, events.RejectTokenMismatch), rule: "not recordable (attempts 1, recorded 1)"},
		{name: "older than recorded", pre: plus(reclaimed, rejectSettle("t", 50, 2, events.RejectTokenMismatch)),
			ev: rejectSettle("t", 51, 1, events.RejectSuperseded), rule: "rejection of attempt 1 is not recordable"},
		{name: "unknown task", pre: running, ev: rejectSettle("u", 20, 1, events.RejectNotClaimed), rule: "no such task"},
		{name: "foreign session", pre: running, ev: in(other, rejectSettle("t", 20, 1, events.RejectNotClaimed)),
			rule: "task belongs to session"},
	})
}

func TestApplyWakeRecorded(t *testing.T) {
	settledW := []events.Event{submitW("t", 0), claim("t", 10, 1, "a"), settle("t", 20, 1, "a", events.StateSucceeded)}
	settledNever := []events.Event{submit("t", 0), claim("t", 10, 1, "a"), settle("t", 20, 1, "a", events.StateSucceeded)}
	plus := func(base []events.Event, evs ...events.Event) []events.Event {
		return append(append([]events.Event{}, base...), evs...)
	}
	runApplyCases(t, []applyCase{
		{name: "direct", ev: wake("w", 5), check: func(t *testing.T, m *Mem) {
			w := wakeRec(t, m, "w")
			if w.Reason != events.WakeRequested || string(w.Payload) != `"hi"` || w.CreatedAt != 5 || w.RecordSeq != 1 ||
				w.UpdatedSeq != 1 || w.Attempts != 0 || w.Acked || w.SessionID != sess {
				t.Errorf("wake %+v", w)
			}
			if got := wakesOf(t, m); len(got) != 1 || got[0] != (IndexEntry{At: 5, Seq: 1, ID: "w"}) {
				t.Errorf("wake index %v", got)
			}
		}},
		{name: "direct with a key", ev: wakeKey("w", 5, "k"), check: func(t *testing.T, m *Mem) {
			if id, _ := m.WakeKey(sess, "k"); id != "w" {
				t.Errorf("WakeKey = %q", id)
			}
		}},
		{name: "same key in another session", pre: []events.Event{wakeKey("w1", 0, "k")}, ev: in(other, wakeKey("w2", 1, "k"))},
		{name: "a task's key is not a wake key", pre: []events.Event{submitKey("t", 0, "k")}, ev: wakeKey("w", 1, "k")},
		{name: "completion wake after success", pre: settledW, ev: doneWake("w", "t", 20, events.StateSucceeded),
			check: func(t *testing.T, m *Mem) {
				x := task(t, m, "t")
				if x.CompletionWakeID != "w" || x.UpdatedSeq != 4 || x.State != events.StateSucceeded {
					t.Errorf("task %+v", x)
				}
				w := wakeRec(t, m, "w")
				if w.Reason != events.WakeTaskFinished || w.TaskID != "t" || w.Outcome.Summary != "done" || w.RecordSeq != 4 {
					t.Errorf("wake %+v", w)
				}
				if got := wakesOf(t, m); len(got) != 1 || got[0] != (IndexEntry{At: 20, Seq: 4, ID: "w"}) {
					t.Errorf("wake index %v", got)
				}
			}},
		{name: "completion wake after failure", pre: []events.Event{submitW("t", 0), claim("t", 10, 1, "a"),
			settle("t", 20, 1, "a", events.StateFailed)}, ev: doneWake("w", "t", 20, events.StateFailed)},
		{name: "completion wake after cancel while pending", pre: []events.Event{submitW("t", 0), cancel("t", 3)},
			ev: doneWake("w", "t", 3, events.StateCanceled)},
		{name: "completion wake with a key (ignored)", pre: settledW,
			ev: with(doneWake("w", "t", 20, events.StateSucceeded), func(e *events.WakeRecorded) { e.IdempotencyKey = "k" }),
			check: func(t *testing.T, m *Mem) {
				if id, _ := m.WakeKey(sess, "k"); id != "" {
					t.Errorf("a completion wake registered key k for %s", id)
				}
			}},

		{name: "wake id reused", pre: []events.Event{wake("w", 0)}, ev: wake("w", 1), rule: "wake id already used"},
		{name: "wake id reused by a completion wake", pre: plus(settledW, wake("w", 21)),
			ev: doneWake("w", "t", 22, events.StateSucceeded), rule: "wake id already used"},
		{name: "key reuse", pre: []events.Event{wakeKey("w1", 0, "k")}, ev: wakeKey("w2", 1, "k"),
			rule: `idempotency key "k" already names w1`},
		{name: "key reuse after ack", pre: []events.Event{wakeKey("w1", 0, "k"), wclaim("w1", 1, 1, "a"), ack("w1", 2, 1, "a")},
			ev: wakeKey("w2", 3, "k"), rule: `idempotency key "k" already names w1`},
		{name: "completion wake for a WakeNever task", pre: settledNever, ev: doneWake("w", "t", 20, events.StateSucceeded),
			rule: "completion wake for task t whose policy is never"},
		{name: "second completion wake", pre: plus(settledW, doneWake("w1", "t", 20, events.StateSucceeded)),
			ev: doneWake("w2", "t", 21, events.StateSucceeded), rule: "second completion wake for task t (first w1)"},
		{name: "completion wake for a running task", pre: []events.Event{submitW("t", 0), claim("t", 10, 1, "a")},
			ev: doneWake("w", "t", 20, events.StateSucceeded), rule: "completion wake for task t in state running"},
		{name: "completion wake for a pending task", pre: []events.Event{submitW("t", 0)},
			ev: doneWake("w", "t", 20, events.StateCanceled), rule: "completion wake for task t in state pending"},
		{name: "completion wake with another outcome", pre: settledW, ev: doneWake("w", "t", 20, events.StateFailed),
			rule: "completion wake for task t in state succeeded"},
		{name: "completion wake for an unknown task", pre: settledW, ev: doneWake("w", "u", 20, events.StateSucceeded),
			rule: "completion wake for unknown task u"},
		{name: "completion wake in another session", pre: settledW, ev: in(other, doneWake("w", "t", 20, events.StateSucceeded)),
			rule: "completion wake in another session than task t"},
		{name: "unknown reason", ev: with(wake("w", 0), func(e *events.WakeRecorded) { e.Reason = 7 }), rule: "unknown wake reason 7"},
		{name: "no wake id", ev: wake("", 0), rule: "a wake needs an id"},
	})
}

func TestApplyWakeClaimed(t *testing.T) {
	claimed := []events.Event{wake("w", 5), wclaim("w", 10, 1, "a")} // lease until 40
	runApplyCases(t, []applyCase{
		{name: "claim at creation", pre: []events.Event{wake("w", 5)}, ev: wclaim("w", 5, 1, "a"), check: func(t *testing.T, m *Mem) {
			w := wakeRec(t, m, "w")
			if w.Attempts != 1 || w.LeaseToken != "a" || w.LeaseExpiresAt != 35 || w.UpdatedSeq != 2 || !w.Claimed() {
				t.Errorf("wake %+v", w)
			}
			if got := wakesOf(t, m); len(got) != 1 || got[0] != (IndexEntry{At: 35, Seq: 1, ID: "w"}) {
				t.Errorf("wake index %v", got)
			}
		}},
		{name: "reclaim at lease expiry", pre: claimed, ev: wclaim("w", 40, 2, "b"), check: func(t *testing.T, m *Mem) {
			if w := wakeRec(t, m, "w"); w.Attempts != 2 || w.LeaseToken != "b" || w.LeaseExpiresAt != 70 {
				t.Errorf("wake %+v", w)
			}
		}},
		{name: "completion wake", pre: []events.Event{submitW("t", 0), cancel("t", 3), doneWake("w", "t", 3, events.StateCanceled)},
			ev: wclaim("w", 3, 1, "a")},

		{name: "before creation", pre: []events.Event{wake("w", 5)}, ev: wclaim("w", 4, 1, "a"),
			rule: "claim of a wake that is not available"},
		{name: "lease not expired", pre: claimed, ev: wclaim("w", 39, 2, "b"), rule: "not available"},
		{name: "acked", pre: append(claimed, ack("w", 20, 1, "a")), ev: wclaim("w", 100, 2, "b"), rule: "not available"},
		{name: "attempt too high", pre: []events.Event{wake("w", 5)}, ev: wclaim("w", 5, 2, "a"), rule: "claim attempt 2, want 1"},
		{name: "reclaim with the old attempt", pre: claimed, ev: wclaim("w", 40, 1, "b"), rule: "claim attempt 1, want 2"},
		{name: "no token", pre: []events.Event{wake("w", 5)}, ev: wclaim("w", 5, 1, ""), rule: "claim needs a token"},
		{name: "lease ends at the claim", pre: []events.Event{wake("w", 5)},
			ev: with(wclaim("w", 5, 1, "a"), func(e *events.WakeClaimed) { e.LeaseExpiresAt = 5 }), rule: "claim needs a token"},
		{name: "unknown wake", pre: []events.Event{wake("w", 5)}, ev: wclaim("v", 5, 1, "a"), rule: "no such wake"},
		{name: "foreign session", pre: []events.Event{wake("w", 5)}, ev: in(other, wclaim("w", 5, 1, "a")),
			rule: `wake belongs to session "s1", event names "s2"`},
	})
}

func TestApplyWakeAcked(t *testing.T) {
	claimed := []events.Event{wake("w", 5), wclaim("w", 10, 1, "a")}
	reclaimed := []events.Event{wake("w", 5), wclaim("w", 10, 1, "a"), wclaim("w", 40, 2, "b")}
	runApplyCases(t, []applyCase{
		{name: "by the owner", pre: claimed, ev: ack("w", 20, 1, "a"), check: func(t *testing.T, m *Mem) {
			w := wakeRec(t, m, "w")
			if !w.Acked || w.AckedToken != "a" || w.LeaseToken != "" || w.LeaseExpiresAt != 0 || w.UpdatedSeq != 3 || w.Claimed() {
				t.Errorf("wake %+v", w)
			}
			if got := wakesOf(t, m); len(got) != 0 {
				t.Errorf("an acked wake is available: %v", got)
			}
		}},
		{name: "after the lease expired, not reclaimed", pre: claimed, ev: ack("w", 1000, 1, "a")},
		{name: "the new owner", pre: reclaimed, ev: ack("w", 50, 2, "b")},

		{name: "wrong token", pre: claimed, ev: ack("w", 20, 1, "x"), rule: "acknowledgment by a delivery that does not own the claim"},
		{name: "superseded attempt", pre: reclaimed, ev: ack("w", 50, 1, "a"), rule: "does not own the claim"},
		{name: "new attempt, old token", pre: reclaimed, ev: ack("w", 50, 2, "a"), rule: "does not own the claim"},
		{name: "second ack", pre: append(claimed, ack("w", 20, 1, "a")), ev: ack("w", 21, 1, "a"), rule: "does not own the claim"},
		{name: "never claimed", pre: []events.Event{wake("w", 5)}, ev: ack("w", 6, 0, ""), rule: "does not own the claim"},
		{name: "unknown wake", pre: claimed, ev: ack("v", 20, 1, "a"), rule: "no such wake"},
		{name: "foreign session", pre: claimed, ev: in(other, ack("w", 20, 1, "a")), rule: "wake belongs to session"},
	})
}

func TestApplyWakeAckRejected(t *testing.T) {
	claimed := []events.Event{wake("w", 5), wclaim("w", 10, 1, "a")}
	reclaimed := []events.Event{wake("w", 5), wclaim("w", 10, 1, "a"), wclaim("w", 40, 2, "b")}
	recorded := func(attempt uint32) func(t *testing.T, m *Mem) {
		return func(t *testing.T, m *Mem) {
			if w := wakeRec(t, m, "w"); w.RejectedAttempt != attempt {
				t.Errorf("RejectedAttempt = %d, want %d", w.RejectedAttempt, attempt)
			}
		}
	}
	runApplyCases(t, []applyCase{
		{name: "token mismatch", pre: claimed, ev: rejectAck("w", 20, 1, events.RejectTokenMismatch), check: recorded(1)},
		{name: "superseded", pre: reclaimed, ev: rejectAck("w", 50, 1, events.RejectSuperseded), check: recorded(1)},
		{name: "after ack", pre: append(claimed, ack("w", 20, 1, "a")), ev: rejectAck("w", 30, 1, events.RejectNotClaimed),
			check: func(t *testing.T, m *Mem) {
				recorded(1)(t, m)
				if w := wakeRec(t, m, "w"); !w.Acked {
					t.Errorf("wake %+v", w)
				}
			}},

		{name: "attempt 0", pre: claimed, ev: rejectAck("w", 20, 0, events.RejectNotClaimed), rule: "rejection of attempt 0 is not recordable"},
		{name: "attempt never made", pre: claimed, ev: rejectAck("w", 20, 2, events.RejectNotClaimed), rule: "not recordable"},
		{name: "never claimed", pre: []events.Event{wake("w", 5)}, ev: rejectAck("w", 20, 1, events.RejectNotClaimed), rule: "not recordable"},
		{name: "second of the same attempt", pre: append(claimed, rejectAck("w", 20, 1, events.RejectTokenMismatch)),
			ev: rejectAck("w", 21, 1, events.RejectTokenMismatch), rule: "not recordable"},
		{name: "unknown wake", pre: claimed, ev: rejectAck("v", 20, 1, events.RejectNotClaimed), rule: "no such wake"},
		{name: "foreign session", pre: claimed, ev: in(other, rejectAck("w", 20, 1, events.RejectNotClaimed)), rule: "wake belongs to session"},
	})
}

// alien is an event type the fold does not know.
type alien struct {
	events.Header
	task, wake string
}

func (a *alien) Type() events.Type                { return 200 }
func (a *alien) Subject() (taskID, wakeID string) { return a.task, a.wake }

func TestApplyUnknownEvent(t *testing.T) {
	runApplyCases(t, []applyCase{
		{name: "about a task", pre: []events.Event{submit("t", 0)}, ev: &alien{Header: hdr(1), task: "t"}, rule: "unknown event"},
		{name: "about a wake", pre: []events.Event{wake("w", 0)}, ev: &alien{Header: hdr(1), wake: "w"}, rule: "unknown event"},
		{name: "about nothing", ev: &alien{Header: hdr(1)}, rule: "unknown event"},
	})
	// The rejection says what kind it is: no rule at all, not a rule the event broke.
	for _, ev := range []*alien{{task: "t"}, {wake: "w"}, {}} {
		ev.Seq = 1
		if err := Apply(NewMem(), ev); !errors.Is(err, ErrUnknownEvent) || !errors.Is(err, ErrInconsistent) {
			t.Errorf("alien %+v: %v, want ErrUnknownEvent and ErrInconsistent", ev, err)
		}
	}
	ev := submit("t", 0)
	ev.Seq = 2 // a gap: a rule broken, not a missing one
	if err := Apply(NewMem(), ev); errors.Is(err, ErrUnknownEvent) || !errors.Is(err, ErrInconsistent) {
		t.Errorf("a sequence gap: %v, want ErrInconsistent alone", err)
	}
}

// TestApplyKnowsEveryType: every event type the events package knows reaches a rule of the
// fold. Each type's golden event (events/testdata/golden) is applied to a state that holds its
// subject, in its session; whatever the rule then says, it must not be that the fold has no
// rule for the type. A new event type nobody wrote a rule for fails here.
func TestApplyKnowsEveryType(t *testing.T) {
	n := 0
	for i := range 256 {
		typ := events.Type(i)
		if !typ.Known() {
			continue
		}
		n++
		b, err := os.ReadFile(filepath.Join("..", "events", "testdata", "golden", typ.String()+".v1.bin"))
		if err != nil {
			t.Errorf("%s: no golden event to apply: %v", typ, err)
			continue
		}
		ev, err := events.Decode(b, 0)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		h := ev.Head()
		m := NewMem()
		var pre []events.Event
		taskID, wakeID := ev.Subject()
		if taskID != "" && typ != events.TypeTaskSubmitted {
			pre = append(pre, in(h.SessionID, submit(taskID, h.At)))
		}
		if wakeID != "" && typ != events.TypeWakeRecorded {
			pre = append(pre, in(h.SessionID, wake(wakeID, h.At)))
		}
		for _, p := range number(pre) {
			if err := Apply(m, p); err != nil {
				t.Fatalf("%s: setting up: %v", typ, err)
			}
		}
		h.Seq = uint64(len(pre) + 1)
		if err := Apply(m, ev); errors.Is(err, ErrUnknownEvent) {
			t.Errorf("%s: the fold has no rule for it: %v", typ, err)
		}
	}
	if n != len(events.AllTypes()) {
		t.Errorf("%d known types, AllTypes lists %d", n, len(events.AllTypes()))
	}
}

func TestApplyErrorMessage(t *testing.T) {
	e := &ApplyError{Seq: 9, Type: events.TypeTaskClaimed, ID: "t1", Rule: "claim attempt 3, want 2"}
	want := "projection: event inconsistent with state: seq 9 (task_claimed t1): claim attempt 3, want 2"
	if e.Error() != want {
		t.Errorf("Error() = %q, want %q", e.Error(), want)
	}
	if !errors.Is(e, ErrInconsistent) {
		t.Error("not ErrInconsistent")
	}
}

// failing is a State whose reads or writes fail: Apply returns the store's error as it is.
type failing struct {
	copying
	failRead, failWrite bool
}

var errStore = errors.New("store failed")

func (f *failing) EditTask(id string) (*Task, error) {
	if f.failRead {
		return nil, errStore
	}
	return f.copying.EditTask(id)
}

func (f *failing) EditWake(id string) (*Wake, error) {
	if f.failRead {
		return nil, errStore
	}
	return f.copying.EditWake(id)
}

func (f *failing) write(err error) error {
	if f.failWrite {
		return errStore
	}
	return err
}

func (f *failing) PutTask(t *Task) error { return f.write(f.copying.PutTask(t)) }
func (f *failing) PutWake(w *Wake) error { return f.write(f.copying.PutWake(w)) }

func (f *failing) TaskEdited(t *Task) error { return f.write(f.copying.TaskEdited(t)) }
func (f *failing) WakeEdited(w *Wake) error { return f.write(f.copying.WakeEdited(w)) }

func TestApplyStoreErrors(t *testing.T) {
	pre := number([]events.Event{submitW("t", 0), claim("t", 1, 1, "a"), settle("t", 2, 1, "a", events.StateSucceeded),
		wake("w", 0), submit("u", 0), submit("r", 0), claim("r", 0, 1, "c")})
	for _, ev := range []events.Event{submit("x", 3), claim("u", 3, 1, "b"), cancel("u", 3),
		doneWake("v", "t", 3, events.StateSucceeded), wake("v", 3), wclaim("w", 3, 1, "a"),
		extend("r", 3, 1, 90), release("r", 3, 1, 3)} {
		for _, mode := range []failing{{failRead: true}, {failWrite: true}} {
			f := &failing{copying: copying{fold(t, pre)}, failRead: mode.failRead, failWrite: mode.failWrite}
			ev.Head().Seq = uint64(len(pre) + 1)
			if err := Apply(f, ev); !errors.Is(err, errStore) || errors.Is(err, ErrInconsistent) {
				t.Errorf("%s with %+v: error %v, want the store's", ev.Type(), mode, err)
			}
			if last, _ := f.LastSeq(); last != uint64(len(pre)) {
				t.Errorf("%s with %+v: LastSeq moved to %d", ev.Type(), mode, last)
			}
		}
	}
}
