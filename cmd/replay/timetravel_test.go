package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// stateDoc is what `state --json` prints.
type stateDoc struct {
	Seq   uint64     `json:"seq"`
	Tasks []taskJSON `json:"tasks"`
	Wakes []wakeJSON `json:"wakes"`
}

func parseState(t *testing.T, s string) stateDoc {
	t.Helper()
	var d stateDoc
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		t.Fatalf("state --json is not JSON: %v\n%s", err, s)
	}
	return d
}

// checkpoint is the live state of one session's tasks right after an event.
type checkpoint struct {
	seq   uint64
	step  string
	tasks map[string]work.Task
	lease map[string]time.Time // the lease expiry of the tasks held at this point, by id
}

func lastSeq(t *testing.T, q *work.Queue) uint64 {
	t.Helper()
	var last uint64
	if err := q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		last = ev.Head().Seq
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return last
}

// TestTimeTravelMatchesLive builds a store through work.Open, records after every step the
// live state of a session's tasks (Session.Task) and the sequence reached (ReadLog), and
// then checks that `state --at-seq N --json` gives exactly that state, both through the
// session index and through the full fold (with small snapshot segments, twice: building
// the cache, then reading it).
func TestTimeTravelMatchesLive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	q, err := work.Open(dir, &work.Options{Entropy: rand.NewChaCha8([32]byte{7})})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	s := q.Session("alpha")
	other := q.Session("beta")
	var ids []string
	var points []checkpoint
	record := func(step string) {
		cp := checkpoint{seq: lastSeq(t, q), step: step, tasks: map[string]work.Task{}}
		for _, id := range ids {
			task, ok, err := s.Task(ctx, id)
			if err != nil || !ok {
				t.Fatalf("%s: reading %s: %v %v", step, id, ok, err)
			}
			cp.tasks[id] = task
		}
		points = append(points, cp)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	submit := func(sess *work.Session, sec int, r work.TaskRequest) string {
		task, err := sess.SubmitAt(ctx, r, at(sec))
		must(err)
		if sess == s {
			ids = append(ids, task.ID)
		}
		return task.ID
	}
	claim := func(sec int, n int) []work.TaskDelivery {
		ds, err := q.ClaimDueAt(ctx, at(sec), 10*time.Second, n)
		must(err)
		return ds
	}

	record("empty")
	a := submit(s, 0, work.TaskRequest{Kind: "resize", Input: json.RawMessage(`{"w":64}`), Wake: work.WakeOnCompletion, IdempotencyKey: "k1"})
	record("submit a")
	submit(other, 1, work.TaskRequest{Kind: "noise"})
	b := submit(s, 2, work.TaskRequest{Kind: "email", RunAt: at(60)})
	record("submit b scheduled")
	c := submit(s, 3, work.TaskRequest{Kind: "index"})
	record("submit c")
	d1 := claim(4, 3) // a, noise, c
	if len(d1) != 3 {
		t.Fatalf("claimed %d", len(d1))
	}
	record("claim a, noise, c")
	_, err = s.CancelAt(ctx, c, at(5))
	must(err)
	record("cancel c while running")
	d2 := map[string]work.TaskDelivery{} // a, noise and c again: their leases expired at 14
	for _, d := range claim(20, 3) {
		d2[d.Task.ID] = d
	}
	if len(d2) != 3 {
		t.Fatalf("claimed %d", len(d2))
	}
	record("redeliver a, noise and c")
	_, err = q.FinishAt(ctx, d1[0], work.Success(nil), at(21)) // stale: attempt 1 of a
	if err == nil {
		t.Fatal("stale finish accepted")
	}
	record("stale finish of a rejected")
	_, err = q.FinishAt(ctx, d2[a], work.SuccessWithSummary("done", json.RawMessage(`{"ok":true}`)), at(22))
	must(err)
	record("finish a (completion wake)")
	_, err = q.FinishAt(ctx, d2[c], work.Cancellation(), at(23))
	must(err)
	record("c settles canceled")
	for id, d := range d2 {
		if id != a && id != c {
			_, err = q.FinishAt(ctx, d, work.Success(nil), at(24))
			must(err)
		}
	}
	_, err = s.CancelAt(ctx, b, at(30))
	must(err)
	record("cancel b while pending")
	e := submit(s, 31, work.TaskRequest{Kind: "fail-me"})
	d3 := claim(32, 5)
	if len(d3) != 1 || d3[0].Task.ID != e {
		t.Fatalf("claimed %v", d3)
	}
	must(func() error { _, err := q.FinishAt(ctx, d3[0], work.Failure("boom"), at(33)); return err }())
	record("e failed")
	w, err := q.ClaimWakesAt(ctx, at(34), time.Second, 10)
	must(err)
	must(q.AckWakeAt(ctx, w[0], at(35)))
	record("wake acked")

	// Heartbeats and releases: an extended lease, a release for later (pending again, the
	// attempt kept), a second claim, and a release after a cancel request (canceled).
	f := submit(s, 40, work.TaskRequest{Kind: "retry-me", Wake: work.WakeOnCompletion})
	d4 := claim(41, 5)
	if len(d4) != 1 || d4[0].Task.ID != f {
		t.Fatalf("claimed %v", d4)
	}
	record("claim f")
	points[len(points)-1].lease = map[string]time.Time{f: d4[0].LeaseExpiresAt}
	d4[0], err = q.ExtendAt(ctx, d4[0], 25*time.Second, at(45))
	must(err)
	record("extend f")
	points[len(points)-1].lease = map[string]time.Time{f: d4[0].LeaseExpiresAt}
	_, err = q.ReleaseAt(ctx, d4[0], work.ReleaseRequest{RunAt: at(60), Reason: "rate limited"}, at(46))
	must(err)
	record("release f until 60")
	if d5 := claim(55, 5); len(d5) != 0 {
		t.Fatalf("claimed %v before the release's run_at", d5)
	}
	d5 := claim(60, 5)
	if len(d5) != 1 || d5[0].Task.ID != f || d5[0].Attempt != 2 {
		t.Fatalf("claimed %v", d5)
	}
	record("claim f again")
	_, err = s.CancelAt(ctx, f, at(61))
	must(err)
	_, err = q.ReleaseAt(ctx, d5[0], work.ReleaseRequest{}, at(62))
	must(err)
	record("release f after a cancel request: canceled")
	must(q.Close())

	cache := t.TempDir()
	for pass := 0; pass < 2; pass++ {
		for _, cp := range points {
			seq := strconv.FormatUint(cp.seq, 10)
			docs := map[string]stateDoc{
				"full": parseState(t, mustReplay(t, "state", dir, "--at-seq", seq, "--json", "--cache-dir", cache, "--snapshot-every", "10")),
			}
			if pass == 0 { // the session fold reads no cache: once is enough
				docs["session"] = parseState(t, mustReplay(t, "state", dir, "--at-seq", seq, "--session", "alpha", "--json"))
			}
			for name, doc := range docs {
				got := map[string]taskJSON{}
				for _, tj := range doc.Tasks {
					if tj.Session == "alpha" {
						got[tj.ID] = tj
					}
				}
				if len(got) != len(cp.tasks) {
					t.Errorf("pass %d, %s, after %q (seq %d): %d tasks, live had %d", pass, name, cp.step, cp.seq, len(got), len(cp.tasks))
				}
				for id, live := range cp.tasks {
					tj, ok := got[id]
					if !ok {
						t.Errorf("%s, after %q: task %s missing", name, cp.step, id)
						continue
					}
					if diff := compareTask(live, tj); diff != "" {
						t.Errorf("pass %d, %s, after %q (seq %d), task %s: %s", pass, name, cp.step, cp.seq, live.Kind, diff)
					}
					if l, ok := cp.lease[id]; ok && tj.LeaseExpiresAt != l.UTC().Format(time.RFC3339Nano) {
						t.Errorf("pass %d, %s, after %q (seq %d), task %s: lease_expires_at %s, the delivery's %s",
							pass, name, cp.step, cp.seq, live.Kind, tj.LeaseExpiresAt, l.UTC().Format(time.RFC3339Nano))
					}
				}
			}
		}
		if pass == 0 && len(must2(filepath.Glob(filepath.Join(cache, "*", "k10", "seg-*.snap")))) == 0 {
			t.Error("the full fold wrote no snapshot segment")
		}
	}
}

func must2[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// compareTask compares a live snapshot with the time-travelled JSON, field by field.
func compareTask(live work.Task, j taskJSON) string {
	ts := func(tm time.Time) string {
		if tm.IsZero() {
			return ""
		}
		return tm.UTC().Format(time.RFC3339Nano)
	}
	var diffs []string
	check := func(field string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			diffs = append(diffs, fmt.Sprintf("%s: live %v, state %v", field, a, b))
		}
	}
	check("state", live.State.String(), j.State)
	check("attempts", live.Attempts, j.Attempts)
	check("kind", live.Kind, j.Kind)
	check("input", string(live.Input), string(j.Input))
	check("idempotency_key", live.IdempotencyKey, j.IdempotencyKey)
	check("created_at", ts(live.CreatedAt), j.CreatedAt)
	check("scheduled_at", ts(live.ScheduledAt), j.ScheduledAt)
	check("cancel_requested_at", ts(live.CancelRequestedAt), j.CancelRequestedAt)
	check("finished_at", ts(live.FinishedAt), j.FinishedAt)
	switch {
	case live.Outcome == nil && j.Outcome != nil:
		diffs = append(diffs, "outcome: live none, state has one")
	case live.Outcome != nil && j.Outcome == nil:
		diffs = append(diffs, "outcome: live has one, state none")
	case live.Outcome != nil:
		check("outcome.state", live.Outcome.State.String(), j.Outcome.State)
		check("outcome.summary", live.Outcome.Summary, j.Outcome.Summary)
		check("outcome.error", live.Outcome.Error, j.Outcome.Error)
		check("outcome.output", string(live.Outcome.Output), string(j.Outcome.Output))
	}
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprint(diffs)
}
