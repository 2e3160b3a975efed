package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// The timeline, log line and task explanation of heartbeats (task_extended) and releases
// (task_released), on stories built from event sequences.

var runT0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC).UnixNano()

func at(sec int) int64 { return runT0 + int64(sec)*int64(time.Second) }

// runStory builds the story of session "s" from evs (sequence numbers and the session are
// filled in), ending at end.
func runStory(t *testing.T, end int64, evs ...events.Event) (*sessionStory, *taskStory) {
	t.Helper()
	s := &sessionStory{Session: "s", tasks: map[string]*taskStory{}, wakes: map[string]*wakeStory{}}
	for i, ev := range evs {
		h := ev.Head()
		h.Seq, h.SessionID = uint64(i+1), "s"
		if !s.add(ev) {
			t.Fatalf("add(%s) has no case", ev.Type())
		}
	}
	s.EndAt = max(s.LastAt, end)
	s.finish()
	if len(s.Tasks) != 1 {
		t.Fatalf("%d tasks in the story", len(s.Tasks))
	}
	return s, s.Tasks[0]
}

func submitted(sec int) *events.TaskSubmitted {
	return &events.TaskSubmitted{Header: events.Header{At: at(sec)}, TaskID: "task_1", Kind: "mail", Input: []byte(`{}`)}
}

func claimed(sec, attempt, untilSec int) *events.TaskClaimed {
	return &events.TaskClaimed{Header: events.Header{At: at(sec)}, TaskID: "task_1", Attempt: uint32(attempt),
		LeaseToken: "lease_secret", LeaseExpiresAt: at(untilSec)}
}

func extended(sec, attempt, untilSec int) *events.TaskExtended {
	return &events.TaskExtended{Header: events.Header{At: at(sec)}, TaskID: "task_1", Attempt: uint32(attempt), LeaseExpiresAt: at(untilSec)}
}

func released(sec, attempt, runAtSec int, reason string) *events.TaskReleased {
	return &events.TaskReleased{Header: events.Header{At: at(sec)}, TaskID: "task_1", Attempt: uint32(attempt), RunAt: at(runAtSec), Reason: reason}
}

func marksOf(ts *taskStory) []markKind {
	var out []markKind
	for _, m := range ts.Marks {
		out = append(out, m.Kind)
	}
	return out
}

func timelineText(s *sessionStory) string {
	var b bytes.Buffer
	(&app{}).writeTimelineText(&b, s)
	return b.String()
}

// An extended lease is one bar that ends at the last expiry; a release ends it at its own
// time, and the task waits (pending again) until the next claim, which is no redelivery.
func TestStoryExtendThenRelease(t *testing.T) {
	settled := &events.TaskSettled{Header: events.Header{At: at(140)}, TaskID: "task_1", Attempt: 2,
		LeaseToken: "lease_secret", Outcome: events.Outcome{State: events.StateSucceeded}}
	s, ts := runStory(t, 0,
		submitted(0), claimed(1, 1, 31), extended(20, 1, 60), extended(40, 1, 90),
		released(50, 1, 120, "smtp 421"), claimed(130, 2, 160), settled)

	if len(ts.Leases) != 2 {
		t.Fatalf("%d lease bars, want 2 (one per claim): %+v", len(ts.Leases), ts.Leases)
	}
	l := ts.Leases[0]
	if l.Until != at(90) || l.End != endRelease || l.EndAt != at(50) || l.Extensions != 2 || l.Canceled {
		t.Errorf("attempt 1's bar: until %s, end %s at %s, %d extensions, canceled %v; want until 09:01:30, released at 09:00:50, 2 extensions",
			fmtTime(l.Until), l.End, fmtTime(l.EndAt), l.Extensions, l.Canceled)
	}
	if l := ts.Leases[1]; l.End != endSettled || l.EndAt != at(140) {
		t.Errorf("attempt 2's bar: %s at %s", l.End, fmtTime(l.EndAt))
	}
	if ts.Redeliveries != 0 {
		t.Errorf("a claim after a release counted as a redelivery")
	}
	if len(ts.Waits) != 1 || *ts.Waits[0] != (waitSpan{From: at(50), DueAt: at(120), Until: at(130), Ended: true}) {
		t.Errorf("waits %+v, want one from the release to the next claim, due at its RunAt", ts.Waits)
	}
	want := []markKind{markSubmitted, markClaimed, markExtended, markExtended, markReleased, markClaimed, markSettled}
	if got := marksOf(ts); !slices.Equal(got, want) {
		t.Errorf("marks %v, want %v", got, want)
	}
	text := timelineText(s)
	for _, w := range []string{
		"heartbeat by attempt 1: lease extended to 09:01:00.000 (40s), was until 09:00:31.000",
		"heartbeat by attempt 1: lease extended to 09:01:30.000 (50s), was until 09:01:00.000",
		`released by attempt 1: pending again at 09:02:00.000 (in 1m10s), reason "smtp 421"`,
		"attempt 2 claimed, lease until",
		"succeeded after 2 attempts (1 release, 2 lease extensions)",
	} {
		if !strings.Contains(text, w) {
			t.Errorf("timeline text lacks %q:\n%s", w, text)
		}
	}
	if strings.Contains(text, "expired") || strings.Contains(text, "redelivery") {
		t.Errorf("timeline text speaks of an expiry:\n%s", text)
	}

	page := timelineHTML(s, "store")
	if n := strings.Count(page, `<rect class="lease `); n != 2 {
		t.Errorf("the page draws %d lease bars, want 2", n)
	}
	for _, w := range []string{`<rect class="lease released"`, `class="m m-released"`, `class="m m-extended"`, `<line class="waiting"`} {
		if !strings.Contains(page, w) {
			t.Errorf("the page lacks %s", w)
		}
	}
}

// A lease that was extended and then expired expires at its new expiry: the inferred mark and
// the redelivery say so, not the claim's first expiry.
func TestStoryExtendedLeaseExpires(t *testing.T) {
	_, ts := runStory(t, 0, submitted(0), claimed(1, 1, 31), extended(20, 1, 60), claimed(70, 2, 100))
	if l := ts.Leases[0]; l.End != endExpired || l.EndAt != at(60) || !l.Redelivered {
		t.Errorf("attempt 1's bar: %s at %s, redelivered %v; want expired at 09:01:00", l.End, fmtTime(l.EndAt), l.Redelivered)
	}
	var exp []mark
	for _, m := range ts.Marks {
		if m.Kind == markExpired {
			exp = append(exp, m)
		}
	}
	if len(exp) != 1 || exp[0].At != at(60) {
		t.Errorf("expiry marks %+v, want one at the extended expiry", exp)
	}
	// At the end of the log: still open until the new expiry, then expired at it.
	_, ts = runStory(t, at(50), submitted(0), claimed(1, 1, 31), extended(20, 1, 60))
	if l := ts.Leases[0]; l.End != endOpen || l.EndAt != at(60) {
		t.Errorf("open bar: %s at %s, want open until 09:01:00", l.End, fmtTime(l.EndAt))
	}
	s, ts := runStory(t, at(65), submitted(0), claimed(1, 1, 31), extended(20, 1, 60))
	if l := ts.Leases[0]; l.End != endExpired || l.EndAt != at(60) {
		t.Errorf("bar at the end: %s at %s, want expired at 09:01:00", l.End, fmtTime(l.EndAt))
	}
	if got := s.taskSummary(ts); !strings.Contains(got, "lease expired at 09:01:00.000") {
		t.Errorf("summary %q", got)
	}
}

// A release while a cancel was requested cancels the task: the bar ends there, drawn as a
// cancellation, and no wait follows. A cancel request after a release (pending again)
// cancels at once and ends the wait.
func TestStoryReleaseCancels(t *testing.T) {
	cancel := &events.TaskCancelRequested{Header: events.Header{At: at(10)}, TaskID: "task_1"}
	s, ts := runStory(t, 0, submitted(0), claimed(1, 1, 31), cancel, released(20, 1, 20, ""))
	l := ts.Leases[0]
	if l.End != endRelease || !l.Canceled || l.EndAt != at(20) {
		t.Errorf("bar: %s at %s, canceled %v", l.End, fmtTime(l.EndAt), l.Canceled)
	}
	if ts.State != events.StateCanceled || ts.FinishedAt != at(20) || len(ts.Waits) != 0 {
		t.Errorf("task %s finished %s, %d waits; want canceled at 09:00:20, no wait", ts.State, fmtTime(ts.FinishedAt), len(ts.Waits))
	}
	last := ts.Marks[len(ts.Marks)-1]
	if last.Kind != markReleased || last.State != events.StateCanceled || markCSS(last) != "m-settled-canceled" ||
		last.Text != "released by attempt 1 while a cancel was requested: canceled" {
		t.Errorf("last mark %+v (class %s)", last, markCSS(last))
	}
	if got := s.taskSummary(ts); got != "canceled after 1 attempt (1 release, cancel requested at 09:00:10.000)" {
		t.Errorf("summary %q", got)
	}
	if page := timelineHTML(s, "store"); !strings.Contains(page, `<rect class="lease settled-canceled"`) ||
		!strings.Contains(page, "while a cancel was requested: canceled") {
		t.Errorf("the page does not draw the released lease as canceled")
	}

	cancel = &events.TaskCancelRequested{Header: events.Header{At: at(40)}, TaskID: "task_1"}
	_, ts = runStory(t, 0, submitted(0), claimed(1, 1, 31), released(20, 1, 60, ""), cancel)
	if ts.State != events.StateCanceled || len(ts.Waits) != 1 || !ts.Waits[0].Ended || ts.Waits[0].Until != at(40) {
		t.Errorf("task %s, waits %+v; want canceled, the wait ended at 09:00:40", ts.State, ts.Waits)
	}
	if m := ts.Marks[len(ts.Marks)-1]; m.Text != "cancel requested while pending: canceled at once" {
		t.Errorf("last mark %q", m.Text)
	}
}

// A release at once, still pending when the log ends: due since the release.
func TestStoryReleasedPending(t *testing.T) {
	s, ts := runStory(t, at(30), submitted(0), claimed(1, 1, 31), released(20, 1, 20, ""))
	if got := s.taskSummary(ts); got != "pending, due since 09:00:20.000 (1 release)" {
		t.Errorf("summary %q", got)
	}
	if m := ts.Marks[len(ts.Marks)-1]; m.Text != "released by attempt 1: pending again at once" {
		t.Errorf("mark %q", m.Text)
	}
	s, ts = runStory(t, at(30), submitted(0), claimed(1, 1, 31), released(20, 1, 3600, ""))
	if got := s.taskSummary(ts); got != "pending, scheduled for 10:00:00.000 (1 release)" {
		t.Errorf("summary %q", got)
	}
}

// The log line cuts a long reason; the JSON carries it whole. Neither has a token to show.
func TestReleaseLineAndJSON(t *testing.T) {
	long := strings.Repeat("é", events.MaxReleaseReason/2)
	ev := released(20, 3, 80, long)
	ev.Seq, ev.SessionID = 9, "s"
	a := &app{}
	line := a.eventLine(ev, 2, 1)
	if len(line) > 250 || !strings.Contains(line, "attempt=3  run_at=2026-03-02T09:01:20.000Z  reason=éé") || !strings.HasSuffix(line, "…") {
		t.Errorf("log line (%d bytes): %.300s", len(line), line)
	}
	b, err := json.Marshal(a.eventJSON(ev))
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(b, &j); err != nil {
		t.Fatal(err)
	}
	if j["reason"] != long || j["run_at"] != "2026-03-02T09:01:20Z" || j["attempt"] != 3.0 || j["task_id"] != "task_1" {
		t.Errorf("JSON %.300s", b)
	}
	// No reason: no reason field.
	ev.Reason = ""
	if line := a.eventLine(ev, 2, 1); strings.Contains(line, "reason") {
		t.Errorf("log line %q", line)
	}
	if b, _ := json.Marshal(a.eventJSON(ev)); strings.Contains(string(b), "reason") {
		t.Errorf("JSON %s", b)
	}

	x := extended(20, 2, 50)
	x.Seq, x.SessionID = 10, "s"
	if line := a.eventLine(x, 2, 1); !strings.HasSuffix(line, "task=task_1  attempt=2  lease_until=2026-03-02T09:00:50.000Z") {
		t.Errorf("log line %q", line)
	}
}

// replay task explains each of them from the task before and after the fold.
func TestTaskRuleRunning(t *testing.T) {
	running := &projection.Task{ID: "task_1", State: events.StateRunning, Attempts: 2, LeaseExpiresAt: at(30)}
	r, _ := taskRule(extended(20, 2, 90), running, running)
	if want := "heartbeat by attempt 2: owns the claim → lease extended to 2026-03-02T09:01:30.000Z (was until 2026-03-02T09:00:30.000Z)"; r != want {
		t.Errorf("rule\n %q\nwant\n %q", r, want)
	}
	r, _ = taskRule(extended(40, 2, 90), running, running)
	if !strings.Contains(r, "its lease had expired at 2026-03-02T09:00:30.000Z, but only a new claim fences a late worker") {
		t.Errorf("rule of a late heartbeat: %q", r)
	}

	r, _ = taskRule(released(20, 2, 80, "backing off"), running, running)
	if want := "released by attempt 2: owns the claim → pending again at 2026-03-02T09:01:20.000Z (reason \"backing off\"), no claim; attempts stay 2, the next claim is attempt 3"; r != want {
		t.Errorf("rule\n %q\nwant\n %q", r, want)
	}
	r, _ = taskRule(released(20, 2, 20, ""), running, running)
	if !strings.Contains(r, "pending again at once (2026-03-02T09:00:20.000Z), no claim") {
		t.Errorf("rule of a release at once: %q", r)
	}

	cancelRequested := *running
	cancelRequested.CancelRequested, cancelRequested.CancelRequestedAt = true, at(10)
	after := &projection.Task{ID: "task_1", State: events.StateCanceled, WakeOnCompletion: true}
	r, _ = taskRule(released(20, 2, 20, ""), &cancelRequested, after)
	if want := "released by attempt 2 while a cancel was requested (at 2026-03-02T09:00:10.000Z): canceled at 2026-03-02T09:00:20.000Z, as a cancel of pending work; a completion wake follows (policy on_completion)"; r != want {
		t.Errorf("rule\n %q\nwant\n %q", r, want)
	}
	r, _ = taskRule(extended(20, 2, 90), &cancelRequested, &cancelRequested)
	if !strings.Contains(r, "a cancel was requested at 2026-03-02T09:00:10.000Z") {
		t.Errorf("rule of a heartbeat after a cancel request: %q", r)
	}
}

// A task released while a cancel was requested, in a real store: replay task explains the
// release with the fold's own rule (no refusal), the completion wake follows, and the
// timeline ends the lease as canceled.
func TestReleaseCancelsInStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	q, err := work.Open(dir, &work.Options{Entropy: rand.NewChaCha8([32]byte{3})})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(0, runT0)
	s := q.Session("s")
	task, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "mail", Wake: work.WakeOnCompletion}, t0)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, t0.Add(time.Second), 30*time.Second, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %d", err, len(ds))
	}
	d, err := q.ExtendAt(ctx, ds[0], time.Minute, t0.Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CancelAt(ctx, task.ID, t0.Add(8*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, err := q.ReleaseAt(ctx, d, work.ReleaseRequest{Reason: "stopping"}, t0.Add(10*time.Second)); err != nil || got.State != work.TaskCanceled {
		t.Fatalf("release: %v, %v", got.State, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	out := mustReplay(t, "task", dir, task.ID)
	for _, w := range []string{
		"is canceled after 1 attempt",
		"heartbeat by attempt 1: owns the claim → lease extended to 2026-03-02T09:01:05.000Z (was until 2026-03-02T09:00:31.000Z)",
		`released by attempt 1 while a cancel was requested (at 2026-03-02T09:00:08.000Z): canceled at 2026-03-02T09:00:10.000Z, as a cancel of pending work (reason stopping); a completion wake follows (policy on_completion)`,
		"completion wake wake_",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("replay task lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "REFUSED") || strings.Contains(out, unknownEventNote) || strings.Contains(out, "differs") {
		t.Errorf("replay task:\n%s", out)
	}
	out = mustReplay(t, "timeline", dir, "--session", "s")
	for _, w := range []string{
		"canceled after 1 attempt (1 release, 1 lease extension, cancel requested at 09:00:08.000)",
		"released by attempt 1 while a cancel was requested: canceled, reason stopping",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("replay timeline lacks %q:\n%s", w, out)
		}
	}
	mustReplay(t, "verify", dir)
}
