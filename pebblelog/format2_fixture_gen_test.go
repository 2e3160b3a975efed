package pebblelog_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// TestWriteFormat2Fixture writes testdata/format2-store and its record dump
// (testdata/format2-records.json) with the build it runs in. It ran once, on the last
// format-2 build, to pin what a format-2 store looks like (records without their values, no
// kind index, session task lists or counts); later builds must not rewrite it, so it runs
// only when asked:
//
//	WORKLOG_WRITE_FORMAT2_FIXTURE=1 go test ./pebblelog -run TestWriteFormat2Fixture
//
// The history gives the upgrade to format 3 something to build in every new keyspace:
// several kinds and sessions, tasks in every state (pending now and later, running, running
// with an expired lease, each terminal state), and more than one task of a kind in a state.
func TestWriteFormat2Fixture(t *testing.T) {
	if os.Getenv("WORKLOG_WRITE_FORMAT2_FIXTURE") == "" {
		t.Skip("set WORKLOG_WRITE_FORMAT2_FIXTURE=1 to rewrite the format-2 fixture")
	}
	if pebblelog.FormatVersion != 2 {
		t.Fatalf("this build writes format %d, not 2", pebblelog.FormatVersion)
	}
	dir := filepath.Join("testdata", "format2-store")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, err := work.Open(dir, &work.Options{
		MaxValueBytes: 1 << 20,
		Entropy:       rand.NewChaCha8([32]byte{'f', 'o', 'r', 'm', 'a', 't', '2'}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s1, s2, s3 := q.Session("s1"), q.Session("s2"), q.Session("s3")
	var tasks, wakes []string
	submit := func(s *work.Session, r work.TaskRequest, now int) work.Task {
		t.Helper()
		task, err := s.SubmitAt(ctx, r, at(now))
		must(err)
		tasks = append(tasks, task.ID)
		return task
	}
	claim := func(now int, lease time.Duration) work.TaskDelivery {
		t.Helper()
		ds, err := q.ClaimDueAt(ctx, at(now), lease, 1)
		must(err)
		if len(ds) != 1 {
			t.Fatalf("claim at %d: %d deliveries", now, len(ds))
		}
		return ds[0]
	}
	big := `{"blob":"` + strings.Repeat("x", 20<<10) + `"}`

	// Succeeded, with a completion wake claimed and acknowledged.
	submit(s1, work.TaskRequest{Kind: "email.send", Input: json.RawMessage(`{"to":"a@example.com"}`), Wake: work.WakeOnCompletion}, 1)
	d := claim(2, time.Minute)
	_, err = q.FinishAt(ctx, d, work.SuccessWithSummary("sent", json.RawMessage(`{"id":42}`)), at(3))
	must(err)
	wd, err := q.ClaimWakesAt(ctx, at(4), time.Minute, 1)
	must(err)
	wakes = append(wakes, wd[0].Wake.ID)
	must(q.AckWakeAt(ctx, wd[0], at(5)))

	// A second email, succeeded too: two tasks of one kind in one state.
	submit(s2, work.TaskRequest{Kind: "email.send", Input: json.RawMessage(`{"to":"b@example.com"}`)}, 6)
	d = claim(7, time.Minute)
	_, err = q.FinishAt(ctx, d, work.Success(nil), at(8))
	must(err)

	// The big input; a lease that expired, a re-claim, a stale finish (audit), a failure.
	submit(s1, work.TaskRequest{Kind: "blob.process", Input: json.RawMessage(big), IdempotencyKey: "big"}, 10)
	first := claim(11, time.Second)
	second := claim(20, time.Minute)
	_, err = q.FinishAt(ctx, first, work.Success(nil), at(21))
	if err == nil {
		t.Fatal("stale finish succeeded")
	}
	_, err = q.FinishAt(ctx, second, work.Failure("disk full"), at(22))
	must(err)

	// Pending, run at later times, with keys; the same key in another session.
	submit(s1, work.TaskRequest{Kind: "report.build", Input: json.RawMessage(`[1,2,3]`), RunAt: at(3600), IdempotencyKey: "daily"}, 30)
	submit(s2, work.TaskRequest{Kind: "report.build", Input: json.RawMessage(`[4]`), RunAt: at(7200), IdempotencyKey: "daily"}, 31)

	// Canceled while pending, wakes on completion: its wake is recorded, unclaimed.
	c := submit(s2, work.TaskRequest{Kind: "cleanup", Wake: work.WakeOnCompletion}, 40)
	_, err = s2.CancelAt(ctx, c.ID, at(41))
	must(err)

	// Running with a cancel requested.
	submit(s1, work.TaskRequest{Kind: "crawl", Input: json.RawMessage(`{"url":"https://example.com/"}`)}, 50)
	claim(51, time.Hour)
	_, err = s1.CancelAt(ctx, tasks[len(tasks)-1], at(52))
	must(err)

	// Running with a lease that has expired by the end of the history (due again).
	submit(s3, work.TaskRequest{Kind: "crawl", Input: json.RawMessage(`{"url":"https://example.org/"}`)}, 53)
	claim(54, 5*time.Second)

	// A requested wake with a payload and a key, claimed but not acknowledged.
	w, err := s1.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"hello":"world"}`), IdempotencyKey: "hi"}, at(60))
	must(err)
	wakes = append(wakes, w.ID)
	_, err = q.ClaimWakesAt(ctx, at(61), time.Minute, 1)
	must(err)

	// Pending, due now: a string input, and three of one kind across two sessions.
	submit(s2, work.TaskRequest{Kind: "noop", Input: json.RawMessage(`"just a string"`)}, 70)
	submit(s3, work.TaskRequest{Kind: "resize", Input: json.RawMessage(`{"w":64}`)}, 71)
	submit(s3, work.TaskRequest{Kind: "resize", Input: json.RawMessage(`{"w":128}`)}, 72)
	submit(s1, work.TaskRequest{Kind: "resize", Input: json.RawMessage(`{"w":256}`)}, 73)
	must(q.Close())

	// The dump, read back through the format-2 store's own reader.
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	must(err)
	dump := fixtureDump{}
	must(st.View(func(r projection.Reader) error {
		for _, id := range tasks {
			task, err := r.Task(id)
			if err != nil {
				return err
			}
			dump.Tasks = append(dump.Tasks, task)
			if task.CompletionWakeID != "" && !slices.Contains(wakes, task.CompletionWakeID) {
				wakes = append(wakes, task.CompletionWakeID)
			}
		}
		for _, id := range wakes {
			wake, err := r.Wake(id)
			if err != nil {
				return err
			}
			dump.Wakes = append(dump.Wakes, wake)
		}
		return nil
	}))
	dump.LastSeq, err = st.LastSeq()
	must(err)
	must(st.Close())
	for _, lock := range []string{"WORKLOG.lock", "LOCK"} {
		must(os.Remove(filepath.Join(dir, lock)))
	}
	b, err := json.MarshalIndent(dump, "", "  ")
	must(err)
	must(os.WriteFile(filepath.Join("testdata", "format2-records.json"), append(b, '\n'), 0o644))
}
