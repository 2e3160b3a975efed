package projection

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/worklog/worklog/events"
)

// The tests run in session s1 unless an event says otherwise; leases last 30 time units.
const (
	sess  = "s1"
	other = "s2"
	lease = 30
)

func hdr(at int64) events.Header { return events.Header{SessionID: sess, At: at} }

func submit(id string, at int64) *events.TaskSubmitted {
	return &events.TaskSubmitted{Header: hdr(at), TaskID: id, Kind: "k", Input: []byte(`{"n":1}`)}
}

func submitAt(id string, at, runAt int64) *events.TaskSubmitted {
	e := submit(id, at)
	e.HasRunAt, e.RunAt = true, runAt
	return e
}

func submitKey(id string, at int64, key string) *events.TaskSubmitted {
	e := submit(id, at)
	e.IdempotencyKey = key
	return e
}

// submitW submits a task whose completion records a wake.
func submitW(id string, at int64) *events.TaskSubmitted {
	e := submit(id, at)
	e.WakeOnCompletion = true
	return e
}

func claim(id string, at int64, attempt uint32, token string) *events.TaskClaimed {
	return &events.TaskClaimed{Header: hdr(at), TaskID: id, Attempt: attempt, LeaseToken: token, LeaseExpiresAt: at + lease}
}

func settle(id string, at int64, attempt uint32, token string, state events.TaskState) *events.TaskSettled {
	o := events.Outcome{State: state}
	switch state {
	case events.StateSucceeded:
		o.Summary, o.Output = "done", []byte(`{"ok":true}`)
	case events.StateFailed:
		o.Error = "boom"
	}
	return &events.TaskSettled{Header: hdr(at), TaskID: id, Attempt: attempt, LeaseToken: token, Outcome: o}
}

func cancel(id string, at int64) *events.TaskCancelRequested {
	return &events.TaskCancelRequested{Header: hdr(at), TaskID: id}
}

func extend(id string, at int64, attempt uint32, expires int64) *events.TaskExtended {
	return &events.TaskExtended{Header: hdr(at), TaskID: id, Attempt: attempt, LeaseExpiresAt: expires}
}

func release(id string, at int64, attempt uint32, runAt int64) *events.TaskReleased {
	return &events.TaskReleased{Header: hdr(at), TaskID: id, Attempt: attempt, RunAt: runAt, Reason: "retry"}
}

func rejectSettle(id string, at int64, attempt uint32, r events.RejectReason) *events.TaskSettleRejected {
	return &events.TaskSettleRejected{Header: hdr(at), TaskID: id, Attempt: attempt, Reason: r}
}

func wake(id string, at int64) *events.WakeRecorded {
	return &events.WakeRecorded{Header: hdr(at), WakeID: id, Reason: events.WakeRequested, Payload: []byte(`"hi"`)}
}

func wakeKey(id string, at int64, key string) *events.WakeRecorded {
	e := wake(id, at)
	e.IdempotencyKey = key
	return e
}

// doneWake is the completion wake of task taskID, which finished in state.
func doneWake(id, taskID string, at int64, state events.TaskState) *events.WakeRecorded {
	o := events.Outcome{State: state}
	switch state {
	case events.StateSucceeded:
		o.Summary, o.Output = "done", []byte(`{"ok":true}`)
	case events.StateFailed:
		o.Error = "boom"
	}
	return &events.WakeRecorded{Header: hdr(at), WakeID: id, Reason: events.WakeTaskFinished, TaskID: taskID, Outcome: o}
}

func wclaim(id string, at int64, attempt uint32, token string) *events.WakeClaimed {
	return &events.WakeClaimed{Header: hdr(at), WakeID: id, Attempt: attempt, LeaseToken: token, LeaseExpiresAt: at + lease}
}

func ack(id string, at int64, attempt uint32, token string) *events.WakeAcked {
	return &events.WakeAcked{Header: hdr(at), WakeID: id, Attempt: attempt, LeaseToken: token}
}

func rejectAck(id string, at int64, attempt uint32, r events.RejectReason) *events.WakeAckRejected {
	return &events.WakeAckRejected{Header: hdr(at), WakeID: id, Attempt: attempt, Reason: r}
}

// in moves an event to another session.
func in[E events.Event](session string, e E) E {
	e.Head().SessionID = session
	return e
}

// with changes an event with fn and returns it.
func with[E events.Event](e E, fn func(E)) E {
	fn(e)
	return e
}

// number gives evs the sequence numbers 1, 2, ... in order.
func number(evs []events.Event) []events.Event {
	for i, ev := range evs {
		ev.Head().Seq = uint64(i + 1)
	}
	return evs
}

// fold applies evs, which must all be accepted, to a new state.
func fold(t testing.TB, evs []events.Event) *Mem {
	t.Helper()
	m := NewMem()
	for _, ev := range evs {
		if err := Apply(m, ev); err != nil {
			t.Fatalf("fold: %v", err)
		}
	}
	return m
}

func task(t testing.TB, r Reader, id string) *Task {
	t.Helper()
	x, err := r.Task(id)
	if err != nil || x == nil {
		t.Fatalf("task %s: %v, %v", id, x, err)
	}
	return x
}

func wakeRec(t testing.TB, r Reader, id string) *Wake {
	t.Helper()
	x, err := r.Wake(id)
	if err != nil || x == nil {
		t.Fatalf("wake %s: %v, %v", id, x, err)
	}
	return x
}

func scan(t testing.TB, fn func(int64, func(IndexEntry) bool) error, maxAt int64) []IndexEntry {
	t.Helper()
	var out []IndexEntry
	if err := fn(maxAt, func(e IndexEntry) bool { out = append(out, e); return true }); err != nil {
		t.Fatal(err)
	}
	return out
}

// scanner is r's ScanIndex of one partition, as a function of maxAt.
func scanner(r Reader, ix Index, part string) func(int64, func(IndexEntry) bool) error {
	return func(at int64, fn func(IndexEntry) bool) error { return r.ScanIndex(ix, part, math.MinInt64, at, fn) }
}

func dueOf(t testing.TB, m *Mem) []IndexEntry {
	return scan(t, scanner(m, IndexDue, ""), math.MaxInt64)
}
func wakesOf(t testing.TB, m *Mem) []IndexEntry {
	return scan(t, scanner(m, IndexWakes, ""), math.MaxInt64)
}

// checkInvariants checks what the fold promises of every state it produces: each index holds
// exactly the records that are in it, under the right key; every key names a record of its
// session; each completion wake points back at its task.
func checkInvariants(t testing.TB, m *Mem) {
	t.Helper()
	var due []IndexEntry
	for _, x := range m.Tasks() {
		if at, ok := x.EligibleAt(); ok {
			due = append(due, x.DueEntry(at))
		}
		if x.IdempotencyKey != "" {
			if id, _ := m.TaskKey(x.SessionID, x.IdempotencyKey); id != x.ID {
				t.Errorf("task key (%s, %s) names %q, want %s", x.SessionID, x.IdempotencyKey, id, x.ID)
			}
		}
		if x.CompletionWakeID != "" {
			w, _ := m.Wake(x.CompletionWakeID)
			if w == nil || w.TaskID != x.ID || w.Reason != events.WakeTaskFinished || w.Outcome.State != x.State {
				t.Errorf("task %s: completion wake %s is %+v", x.ID, x.CompletionWakeID, w)
			}
			if !x.WakeOnCompletion || !x.State.Terminal() {
				t.Errorf("task %s has a completion wake but policy %v, state %s", x.ID, x.WakeOnCompletion, x.State)
			}
		}
		if x.Claimed() != (x.LeaseToken != "") {
			t.Errorf("task %s: state %s with lease token %q", x.ID, x.State, x.LeaseToken)
		}
	}
	slices.SortFunc(due, compareEntries)
	if got := dueOf(t, m); !slices.Equal(got, due) {
		t.Errorf("due index\n got  %v\n want %v", got, due)
	}
	var avail []IndexEntry
	for _, x := range m.Wakes() {
		if at, ok := x.AvailableAt(); ok {
			avail = append(avail, IndexEntry{At: at, Seq: x.RecordSeq, ID: x.ID})
		}
		if x.Reason == events.WakeRequested && x.IdempotencyKey != "" {
			if id, _ := m.WakeKey(x.SessionID, x.IdempotencyKey); id != x.ID {
				t.Errorf("wake key (%s, %s) names %q, want %s", x.SessionID, x.IdempotencyKey, id, x.ID)
			}
		}
	}
	slices.SortFunc(avail, compareEntries)
	if got := wakesOf(t, m); !slices.Equal(got, avail) {
		t.Errorf("wake index\n got  %v\n want %v", got, avail)
	}
	checkPart2Invariants(t, m, due)
	checkSessionWakes(t, m, avail)
	for k, id := range m.taskKeys {
		if x := m.tasks[id]; x == nil || x.SessionID != k.session || x.IdempotencyKey != k.key {
			t.Errorf("task key %v names %s: %+v", k, id, x)
		}
	}
	for k, id := range m.wakeKeys {
		if x := m.wakes[id]; x == nil || x.SessionID != k.session || x.IdempotencyKey != k.key {
			t.Errorf("wake key %v names %s: %+v", k, id, x)
		}
	}
}

// checkPart2Invariants checks the indexes of part 2 against the records: each kind's due
// index holds exactly the entries of due (the due index's, from the records) of its kind;
// each session's list is its tasks in submission order; the counts are the records' tally.
func checkPart2Invariants(t testing.TB, m *Mem, due []IndexEntry) {
	t.Helper()
	kindDue := map[string][]IndexEntry{}
	sessions := map[string][]uint64{}
	counts := map[string]map[events.TaskState]int64{}
	for _, x := range m.Tasks() { // in submission order
		sessions[x.SessionID] = append(sessions[x.SessionID], x.SubmitSeq)
		if counts[x.Kind] == nil {
			counts[x.Kind] = map[events.TaskState]int64{}
		}
		counts[x.Kind][x.State]++
	}
	for _, e := range due {
		k := m.tasks[e.ID].Kind
		kindDue[k] = append(kindDue[k], e)
	}
	for k := range m.kinds {
		if _, ok := kindDue[k]; !ok {
			kindDue[k] = nil
		}
	}
	for k, want := range kindDue {
		got := scan(t, func(at int64, fn func(IndexEntry) bool) error {
			return m.ScanIndex(IndexKindDue, k, math.MinInt64, at, fn)
		}, math.MaxInt64)
		if !slices.Equal(got, want) {
			t.Errorf("due index of kind %q\n got  %v\n want %v", k, got, want)
		}
	}
	for s, want := range sessions {
		var got []uint64
		if err := m.ScanSessionTasks(s, 0, func(seq uint64, id string) bool {
			if m.tasks[id] == nil || m.tasks[id].SubmitSeq != seq || m.tasks[id].SessionID != s {
				t.Errorf("session %s lists (%d, %s): %+v", s, seq, id, m.tasks[id])
			}
			got = append(got, seq)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("task list of session %s\n got  %v\n want %v", s, got, want)
		}
	}
	got := map[string]map[events.TaskState]int64{}
	if err := m.Counts(func(k string, st events.TaskState, n int64) bool {
		if got[k] == nil {
			got[k] = map[events.TaskState]int64{}
		}
		got[k][st] = n
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(counts) {
		t.Errorf("counts\n got  %v\n want %v", got, counts)
	}
}

// spy counts the writes Apply makes through it, in-place changes (TaskEdited, WakeEdited)
// included.
type spy struct {
	State
	writes int
}

func (s *spy) TaskEdited(t *Task) error { s.writes++; return s.State.TaskEdited(t) }

// PutPrunable passes the retention index through: the spy wraps a State that keeps it.
func (s *spy) PutPrunable(e PruneEntry) error { return s.State.(PruneIndexer).PutPrunable(e) }
func (s *spy) WakeEdited(w *Wake) error       { s.writes++; return s.State.WakeEdited(w) }
func (s *spy) PutTask(t *Task) error          { s.writes++; return s.State.PutTask(t) }
func (s *spy) PutWake(w *Wake) error          { s.writes++; return s.State.PutWake(w) }
func (s *spy) PutTaskKey(sess, key, id string) error {
	s.writes++
	return s.State.PutTaskKey(sess, key, id)
}
func (s *spy) PutWakeKey(sess, key, id string) error {
	s.writes++
	return s.State.PutWakeKey(sess, key, id)
}
func (s *spy) SetLastSeq(seq uint64) error { s.writes++; return s.State.SetLastSeq(seq) }
func (s *spy) PutIndex(ix Index, part string, e IndexEntry) error {
	s.writes++
	return s.State.PutIndex(ix, part, e)
}
func (s *spy) DeleteIndex(ix Index, part string, e IndexEntry) error {
	s.writes++
	return s.State.DeleteIndex(ix, part, e)
}
func (s *spy) PutSchedule(sc *Schedule) error       { s.writes++; return s.State.PutSchedule(sc) }
func (s *spy) PutScheduleDue(e ScheduleEntry) error { s.writes++; return s.State.PutScheduleDue(e) }
func (s *spy) DeleteScheduleDue(e ScheduleEntry) error {
	s.writes++
	return s.State.DeleteScheduleDue(e)
}
func (s *spy) PutSessionTask(sess string, seq uint64, id string) error {
	s.writes++
	return s.State.PutSessionTask(sess, seq, id)
}
func (s *spy) AddCount(k string, st events.TaskState, d int64) error {
	s.writes++
	return s.State.AddCount(k, st, d)
}

// copying is a State over a Mem that hands Apply copies of the records and writes them back
// when told they changed, as pebblelog's writer does, instead of the Mem's own records: the
// other way a State may give Apply its records. Every fold test runs both ways.
type copying struct{ *Mem }

func (c copying) EditTask(id string) (*Task, error) { return c.Mem.Task(id) }
func (c copying) EditWake(id string) (*Wake, error) { return c.Mem.Wake(id) }
func (c copying) TaskEdited(t *Task) error          { return c.Mem.PutTask(t) }
func (c copying) WakeEdited(w *Wake) error          { return c.Mem.PutWake(w) }
func (c copying) NewTask() *Task                    { return new(Task) }
func (c copying) NewWake() *Wake                    { return new(Wake) }

// checkSessionWakes: each session's available-wake index holds exactly the wake index's
// entries of its wakes, in order, and no session's holds another's (part 3).
func checkSessionWakes(t testing.TB, m *Mem, avail []IndexEntry) {
	t.Helper()
	want := map[string][]IndexEntry{}
	for _, e := range avail {
		s := m.wakes[e.ID].SessionID
		want[s] = append(want[s], e)
	}
	for s, es := range want {
		var got []IndexEntry
		if err := m.ScanIndex(IndexSessionWakes, s, math.MinInt64, math.MaxInt64, func(e IndexEntry) bool { got = append(got, e); return true }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, es) {
			t.Errorf("wake index of session %q\n got  %v\n want %v", s, got, es)
		}
	}
	for s, tr := range m.idx[IndexSessionWakes].parts {
		if tr.Len() != len(want[s]) {
			t.Errorf("wake index of session %q holds %d entries, want %d", s, tr.Len(), len(want[s]))
		}
	}
}
