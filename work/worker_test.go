package work

import (
	"context"
	"errors"
	"fmt"
	engineapi "github.com/worklog/worklog/internal/engine"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Quick tests of the decide code of part 2 on the in-memory engine, for what the
// conformance suite (work/worktest) does not reach: the cost bound of ClaimKinds, counted on
// the index reads themselves, and SettleAndClaim's partial failures, also when its closure
// runs twice. Each test ends with Verify: the live indexes equal a rebuild's.

var t0 = time.Unix(1_000, 0).UTC()

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// countingEngine is the in-memory engine counting the index entries each command's scans
// visit, per index (the due index as "", a kind's due index under its name).
type countingEngine struct {
	*memEngine
	visited map[string]int
}

type countingTxn struct {
	txn
	e *countingEngine
}

func (e *countingEngine) Update(ctx context.Context, fn func(tx txn) error) error {
	return e.memEngine.Update(ctx, func(tx txn) error { return fn(countingTxn{tx, e}) })
}

// ScanIndex counts the entries each scan visits, under the kind of a kind's due index, ""
// for the due index, "wakes" for the wake index, "session <s>" for a session's wakes.
func (c countingTxn) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	name := map[projection.Index]string{projection.IndexDue: "", projection.IndexKindDue: part,
		projection.IndexWakes: "wakes", projection.IndexSessionWakes: "session " + part, projection.IndexKindLeases: "leases " + part}[ix]
	return c.txn.ScanIndex(ix, part, from, to, func(x projection.IndexEntry) bool { c.e.visited[name]++; return fn(x) })
}

func queueOver(e engine) *Queue {
	return newEngineQueue(e, engineapi.Config{})
}

func verify(t *testing.T, q *Queue) {
	t.Helper()
	if err := q.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func mustSubmit(t *testing.T, q *Queue, session string, r TaskRequest, now time.Time) Task {
	t.Helper()
	x, err := q.Session(session).SubmitAt(context.Background(), r, now)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func claimOne(t *testing.T, q *Queue, now time.Time, lease time.Duration) TaskDelivery {
	t.Helper()
	ds, err := q.ClaimDueAt(context.Background(), now, lease, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("ClaimDueAt(%v) = %d deliveries, %v", now, len(ds), err)
	}
	return ds[0]
}

func logLen(t *testing.T, q *Queue) int {
	t.Helper()
	n := 0
	if err := q.ReadLog(context.Background(), 0, func(events.Event) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestClaimKindsCost: ClaimKinds reads only its kinds' indexes, one entry per kind beyond
// those it claims, whatever the due tasks of other kinds; it claims in ClaimDue's order
// among its kinds; a kind named twice is claimed once.
func TestClaimKindsCost(t *testing.T) {
	ctx := context.Background()
	e := &countingEngine{memEngine: newMemEngine(), visited: map[string]int{}}
	q := queueOver(e)
	for i := range 2000 {
		mustSubmit(t, q, "bulk", TaskRequest{Kind: "bulk"}, at(0))
		_ = i
	}
	var want []string // a and b interleaved in time: a at 1, 4, 7...; b at 2, 5, 8...
	for i := range 5 {
		want = append(want, mustSubmit(t, q, "s", TaskRequest{Kind: "a", RunAt: at(1 + 3*i)}, at(0)).ID)
		want = append(want, mustSubmit(t, q, "s", TaskRequest{Kind: "b", RunAt: at(2 + 3*i)}, at(0)).ID)
	}
	mustSubmit(t, q, "s", TaskRequest{Kind: "c", RunAt: at(1)}, at(0))
	clear(e.visited)
	ds, err := q.ClaimKindsAt(ctx, []string{"b", "a", "b"}, at(100), time.Minute, 4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.Task.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(want[:4]) {
		t.Errorf("claimed %v, want %v (ClaimDue's order among a and b)", got, want[:4])
	}
	// 4 claimed, plus at most one look-ahead per kind; nothing of the due index or of bulk.
	if v := e.visited; v["a"]+v["b"] > 4+2 || v[""] != 0 || v["bulk"] != 0 || v["c"] != 0 {
		t.Errorf("visited %v: want at most 6 entries of a and b, none elsewhere", v)
	}
	clear(e.visited)
	if ds, err = q.ClaimKindsAt(ctx, []string{"a"}, at(100), time.Minute, 10); err != nil || len(ds) != 3 {
		t.Fatalf("ClaimKindsAt(a) = %d, %v; want the 3 left", len(ds), err)
	}
	if v := e.visited; v["a"] != 3 || len(v) != 1 {
		t.Errorf("one kind: visited %v, want a's 3 entries only", v)
	}
	if ds, err = q.ClaimKindsAt(ctx, []string{"nope", "a"}, at(100), time.Minute, 10); err != nil || len(ds) != 0 {
		t.Errorf("nothing left: %d, %v", len(ds), err)
	}
	verify(t, q)
}

func TestExtend(t *testing.T) {
	ctx := context.Background()
	q := NewInMemory()
	x := mustSubmit(t, q, "s", TaskRequest{Kind: "k"}, at(0))
	d := claimOne(t, q, at(1), 10*time.Second)
	// Later: not re-claimable at the old expiry, re-claimable at the new one.
	d2, err := q.ExtendAt(ctx, d, 30*time.Second, at(5))
	if err != nil {
		t.Fatal(err)
	}
	if d2.Attempt != 1 || d2.LeaseToken() != d.LeaseToken() || !d2.LeaseExpiresAt.Equal(at(35)) || d2.Task.ID != x.ID || d2.Task.State != TaskRunning {
		t.Errorf("extended delivery %+v", d2)
	}
	if ds, _ := q.ClaimDueAt(ctx, at(11), time.Second, 1); len(ds) != 0 {
		t.Error("claimed at the old expiry")
	}
	// Earlier than before, after a cancel request: the heartbeat shows it.
	if _, err := q.Session("s").CancelAt(ctx, x.ID, at(6)); err != nil {
		t.Fatal(err)
	}
	d3, err := q.ExtendAt(ctx, d2, time.Second, at(7)) // the earlier delivery value: same claim
	if err != nil || !d3.LeaseExpiresAt.Equal(at(8)) || !d3.Task.CancelRequestedAt.Equal(at(6)) {
		t.Fatalf("ExtendAt = %+v, %v; want the expiry at 8 and the cancel request", d3, err)
	}
	d4 := claimOne(t, q, at(8), time.Minute)
	if d4.Attempt != 2 {
		t.Errorf("re-claim attempt %d", d4.Attempt)
	}
	// The first delivery is stale now, and a stale heartbeat records nothing.
	n := logLen(t, q)
	if _, err := q.ExtendAt(ctx, d, time.Minute, at(9)); !errors.Is(err, ErrStaleDelivery) {
		t.Errorf("stale ExtendAt: %v", err)
	}
	if _, err := q.ExtendAt(ctx, TaskDelivery{Task: Task{ID: "nope"}, Attempt: 1}, time.Minute, at(9)); !errors.Is(err, ErrTaskNotFound) {
		t.Errorf("unknown task: %v", err)
	}
	if _, err := q.FinishAt(ctx, d4, Cancellation(), at(10)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ExtendAt(ctx, d4, time.Minute, at(11)); !errors.Is(err, ErrStaleDelivery) {
		t.Errorf("extend of a settled task: %v", err)
	}
	if got := logLen(t, q); got != n+1 {
		t.Errorf("log grew by %d, want 1 (the finish)", got-n)
	}
	verify(t, q)
}

func TestRelease(t *testing.T) {
	ctx := context.Background()
	q := NewInMemory()
	x := mustSubmit(t, q, "s", TaskRequest{Kind: "k", Wake: WakeOnCompletion}, at(0))
	d := claimOne(t, q, at(1), time.Minute)
	got, err := q.ReleaseAt(ctx, d, ReleaseRequest{RunAt: at(20), Reason: "busy"}, at(2))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != TaskPending || got.Attempts != 1 || !got.ScheduledAt.Equal(at(20)) {
		t.Errorf("released task %+v", got)
	}
	if _, err := q.ReleaseAt(ctx, d, ReleaseRequest{}, at(3)); !errors.Is(err, ErrStaleDelivery) {
		t.Errorf("second release: %v", err)
	}
	if ds, _ := q.ClaimDueAt(ctx, at(19), time.Minute, 1); len(ds) != 0 {
		t.Error("claimed before its RunAt")
	}
	d2 := claimOne(t, q, at(20), time.Minute)
	if d2.Attempt != 2 {
		t.Errorf("attempt %d after a release, want 2", d2.Attempt)
	}
	// A RunAt not after now: eligible at once.
	if got, err = q.ReleaseAt(ctx, d2, ReleaseRequest{RunAt: at(5)}, at(21)); err != nil || !got.ScheduledAt.Equal(at(21)) {
		t.Fatalf("ReleaseAt(past) = %+v, %v", got, err)
	}
	d3 := claimOne(t, q, at(21), time.Minute)
	// Cancel requested: the release cancels, and records the completion wake.
	if _, err := q.Session("s").CancelAt(ctx, x.ID, at(22)); err != nil {
		t.Fatal(err)
	}
	if got, err = q.ReleaseAt(ctx, d3, ReleaseRequest{RunAt: at(99)}, at(23)); err != nil {
		t.Fatal(err)
	}
	if got.State != TaskCanceled || !got.FinishedAt.Equal(at(23)) || got.Outcome == nil || got.Outcome.State != TaskCanceled || got.Attempts != 3 {
		t.Errorf("release after a cancel request: %+v", got)
	}
	ws, err := q.ClaimWakesAt(ctx, at(24), time.Minute, 10)
	if err != nil || len(ws) != 1 || ws[0].Wake.Reason.TaskID != x.ID || ws[0].Wake.Reason.State != TaskCanceled {
		t.Errorf("completion wake: %+v, %v", ws, err)
	}
	if _, err := q.FinishAt(ctx, d3, Cancellation(), at(25)); !errors.Is(err, ErrStaleDelivery) {
		t.Errorf("finish after the release: %v", err)
	}
	verify(t, q)
}

func TestSessionTasks(t *testing.T) {
	ctx := context.Background()
	q := NewInMemory()
	var ids []string
	for i := range 6 {
		kind := []string{"a", "b"}[i%2]
		ids = append(ids, mustSubmit(t, q, "s", TaskRequest{Kind: kind}, at(i)).ID)
		mustSubmit(t, q, "other", TaskRequest{Kind: kind}, at(i))
	}
	d := claimOne(t, q, at(10), time.Minute) // ids[0] (submitted first, at 0: before other's)
	if d.Task.ID != ids[0] {
		t.Fatalf("claimed %s, want %s", d.Task.ID, ids[0])
	}
	list := func(f TaskFilter) []string {
		t.Helper()
		ts, err := q.Session("s").Tasks(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range ts {
			if x.SessionID != "s" {
				t.Errorf("listed %s of session %s", x.ID, x.SessionID)
			}
			out = append(out, x.ID)
		}
		return out
	}
	for _, tc := range []struct {
		f    TaskFilter
		want []string
	}{
		{TaskFilter{Limit: 10}, ids},
		{TaskFilter{Limit: 2}, ids[:2]},
		{TaskFilter{After: ids[1], Limit: 2}, ids[2:4]},
		{TaskFilter{After: ids[5], Limit: 2}, nil},
		{TaskFilter{Kinds: []string{"b"}, Limit: 10}, []string{ids[1], ids[3], ids[5]}},
		{TaskFilter{States: []TaskState{TaskRunning}, Limit: 10}, ids[:1]},
		{TaskFilter{States: []TaskState{TaskPending}, Kinds: []string{"a"}, After: ids[0], Limit: 1}, ids[2:3]},
	} {
		if got := list(tc.f); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Tasks(%+v) = %v, want %v", tc.f, got, tc.want)
		}
	}
	other, err := q.Session("other").Tasks(ctx, TaskFilter{Limit: 1})
	if err != nil || len(other) != 1 {
		t.Fatal(other, err)
	}
	for _, after := range []string{other[0].ID, "nope"} {
		if _, err := q.Session("s").Tasks(ctx, TaskFilter{After: after, Limit: 1}); !errors.Is(err, ErrTaskNotFound) {
			t.Errorf("After %s: %v, want ErrTaskNotFound", after, err)
		}
	}
}

func TestStats(t *testing.T) {
	ctx := context.Background()
	q := NewInMemory()
	s, err := q.StatsAt(ctx, at(0))
	if err != nil || s.DueNow != 0 || len(s.Kinds) != 0 || !s.OldestDueAt.IsZero() || s.Total != (StateCounts{}) {
		t.Fatalf("empty queue: %+v, %v", s, err)
	}
	mustSubmit(t, q, "s", TaskRequest{Kind: "b"}, at(0))
	mustSubmit(t, q, "s", TaskRequest{Kind: "a"}, at(1))
	mustSubmit(t, q, "s", TaskRequest{Kind: "a", RunAt: at(100)}, at(1))
	claimOne(t, q, at(2), 10*time.Second) // the b task, lease until 12
	if _, err := q.FinishAt(ctx, claimOne(t, q, at(2), time.Minute), Failure("x"), at(3)); err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, q, "s", TaskRequest{Kind: "a"}, at(5))
	s, err = q.StatsAt(ctx, at(20)) // due: the a task of 5 and the b task (lease expired at 12)
	if err != nil {
		t.Fatal(err)
	}
	want := QueueStats{
		At:    at(20),
		Total: StateCounts{Pending: 2, Running: 1, Failed: 1},
		Kinds: []KindStats{
			{Kind: "a", StateCounts: StateCounts{Pending: 2, Failed: 1}},
			{Kind: "b", StateCounts: StateCounts{Running: 1}},
		},
		DueNow: 2, OldestDueAt: at(5), OldestDueAge: 15 * time.Second,
	}
	if fmt.Sprint(s) != fmt.Sprint(want) {
		t.Errorf("StatsAt:\n got  %+v\n want %+v", s, want)
	}
}

func TestAge(t *testing.T) {
	if a := age(1<<62, -1<<62); a != time.Duration(1<<63-1) {
		t.Errorf("age beyond a Duration = %v", a)
	}
	if a := age(10, 4); a != 6 {
		t.Errorf("age = %v", a)
	}
}

// TestSettleAndClaimPartial: in one call, a settle that fails (stale, unknown, invalid)
// fails its own result only; the others and the claims happen, in one command; also when
// every closure runs twice (rerunEngine).
func TestSettleAndClaimPartial(t *testing.T) {
	for name, q := range map[string]*Queue{"in-memory": NewInMemory(), "rerun": newRerunQueue()} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			for i := range 4 {
				mustSubmit(t, q, "s", TaskRequest{Kind: []string{"a", "b"}[i%2]}, at(i))
			}
			ds, err := q.ClaimDueAt(ctx, at(10), time.Minute, 3)
			if err != nil || len(ds) != 3 {
				t.Fatal(len(ds), err)
			}
			stale := ds[2]
			if _, err := q.ReleaseAt(ctx, stale, ReleaseRequest{}, at(11)); err != nil {
				t.Fatal(err)
			}
			mustSubmit(t, q, "s", TaskRequest{Kind: "a"}, at(12))
			n := logLen(t, q)
			ok := Success([]byte(`1`))
			res, claimed, err := q.SettleAndClaimAt(ctx, []Settle{
				{Delivery: ds[0], Outcome: &ok},
				{Delivery: stale, Outcome: &ok},
				{Delivery: TaskDelivery{Task: Task{ID: "nope"}, Attempt: 1}, Outcome: &ok},
				{Delivery: ds[1]},                                        // neither outcome nor release
				{Delivery: ds[1], Outcome: &Outcome{State: TaskPending}}, // not terminal
				{Delivery: ds[1], Release: &ReleaseRequest{RunAt: at(50)}},
				{Delivery: ds[1], Release: &ReleaseRequest{}}, // the same delivery again: stale
			}, []string{"a"}, at(13), time.Minute, 5)
			if err != nil {
				t.Fatal(err)
			}
			wantErr := []error{nil, ErrStaleDelivery, ErrTaskNotFound, ErrInvalidRequest, ErrInvalidRequest, nil, ErrStaleDelivery}
			if len(res) != len(wantErr) {
				t.Fatalf("%d results", len(res))
			}
			for i, w := range wantErr {
				if w == nil && res[i].Err != nil || w != nil && !errors.Is(res[i].Err, w) {
					t.Errorf("result %d: %v, want %v", i, res[i].Err, w)
				}
			}
			if res[0].Task.State != TaskSucceeded || res[5].Task.State != TaskPending || !res[5].Task.ScheduledAt.Equal(at(50)) {
				t.Errorf("results: %+v, %+v", res[0].Task, res[5].Task)
			}
			// Kind a: the released stale task (attempt 2) and the new one; not ds[1] (b, at 50).
			if len(claimed) != 2 || claimed[0].Task.ID != stale.Task.ID || claimed[0].Attempt != 2 || claimed[1].Task.Kind != "a" {
				t.Errorf("claimed %+v", claimed)
			}
			// One settle, one release, one audit of the stale finish, two claims.
			if got := logLen(t, q) - n; got != 5 {
				t.Errorf("appended %d events, want 5", got)
			}
			// Settles only (limit 0), and a claim of any kind.
			res, claimed, err = q.SettleAndClaimAt(ctx, nil, nil, at(60), time.Minute, 0)
			if err != nil || len(res) != 0 || len(claimed) != 0 {
				t.Errorf("empty call: %v, %v, %v", res, claimed, err)
			}
			if _, claimed, err = q.SettleAndClaimAt(ctx, nil, nil, at(60), time.Minute, 5); err != nil || len(claimed) != 2 {
				t.Errorf("claim of any kind: %d, %v", len(claimed), err)
			}
			verify(t, q)
		})
	}
}

// countingReader counts the records a View reads and the session-list entries it walks.
type countingReader struct {
	projection.Reader
	tasks, listed *int
}

func (r countingReader) Task(id string) (*projection.Task, error) {
	*r.tasks++
	return r.Reader.Task(id)
}

func (r countingReader) ScanSessionTasks(session string, after uint64, fn func(uint64, string) bool) error {
	return r.Reader.ScanSessionTasks(session, after, func(seq uint64, id string) bool { *r.listed++; return fn(seq, id) })
}

type countingViews struct {
	*memEngine
	tasks, listed int
}

func (e *countingViews) View(ctx context.Context, fn func(r projection.Reader) error) error {
	return e.memEngine.View(ctx, func(r projection.Reader) error {
		return fn(countingReader{r, &e.tasks, &e.listed})
	})
}

// TestSessionTasksCost: a page of Session.Tasks reads the After task and the tasks it
// returns or skips in its session, whatever other sessions hold.
func TestSessionTasksCost(t *testing.T) {
	e := &countingViews{memEngine: newMemEngine()}
	q := queueOver(e)
	var mine []string
	for i := range 2000 {
		mustSubmit(t, q, "other", TaskRequest{Kind: "k"}, at(i))
		if i%400 == 0 {
			mine = append(mine, mustSubmit(t, q, "s", TaskRequest{Kind: []string{"a", "b"}[len(mine)%2]}, at(i)).ID)
		}
	}
	e.tasks, e.listed = 0, 0
	ts, err := q.Session("s").Tasks(context.Background(), TaskFilter{After: mine[0], Kinds: []string{"a"}, Limit: 1})
	if err != nil || len(ts) != 1 || ts[0].ID != mine[2] {
		t.Fatalf("Tasks = %+v, %v; want %s", ts, err, mine[2])
	}
	// The cursor's record, then mine[1] (skipped: kind b) and mine[2].
	if e.tasks != 3 || e.listed != 2 {
		t.Errorf("read %d records and walked %d list entries, want 3 and 2", e.tasks, e.listed)
	}
}
