package pebblelog_test

import (
	"cmp"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// format4Wakes is what testdata/format4-wakes.json records of the format-4 fixture: every
// wake id by session, and the time the fixture was written at (the times below are from it).
type format4Wakes struct {
	Sessions map[string][]string `json:"sessions"` // session -> its wake ids, in creation order
	Acked    []string            `json:"acked"`
	Leased   []string            `json:"leased"` // claimed, lease until T0+600s
	T0       time.Time           `json:"t0"`
}

// TestWriteFormat4Fixture writes testdata/format4-store and testdata/format4-wakes.json with
// the build it runs in. It ran once, on the last format-4 build, to pin a format-4 store
// (no per-session wake index) holding wakes of several sessions in every wake state:
//
//	WORKLOG_WRITE_FORMAT4_FIXTURE=1 go test ./pebblelog -run TestWriteFormat4Fixture
func TestWriteFormat4Fixture(t *testing.T) {
	if os.Getenv("WORKLOG_WRITE_FORMAT4_FIXTURE") == "" {
		t.Skip("set WORKLOG_WRITE_FORMAT4_FIXTURE=1 to rewrite the format-4 fixture")
	}
	if pebblelog.FormatVersion != 4 {
		t.Fatalf("this build writes format %d, not 4", pebblelog.FormatVersion)
	}
	dir := filepath.Join("testdata", "format4-store")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, err := work.Open(dir, &work.Options{Entropy: rand.NewChaCha8([32]byte{'f', 'o', 'r', 'm', 'a', 't', '4'})})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	out := format4Wakes{Sessions: map[string][]string{}, T0: t0}
	sessions := []string{"alpha", "beta", "gamma", "a"} // "a" is a prefix of "alpha"
	for i := range 24 {
		s := sessions[i%len(sessions)]
		w, err := q.Session(s).WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"n":` + string(rune('0'+i%10)) + `}`)}, at(i))
		must(err)
		_ = w
	}
	// A task with a completion wake in session beta.
	task, err := q.Session("beta").SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage(`1`), Wake: work.WakeOnCompletion}, at(30))
	must(err)
	ds, err := q.ClaimDueAt(ctx, at(31), time.Minute, 1)
	must(err)
	_, err = q.FinishAt(ctx, ds[0], work.Success(json.RawMessage(`2`)), at(32))
	must(err)
	_ = task
	// Claim the first 8 (lease until t0+600s), ack 4 of them.
	wd, err := q.ClaimWakesAt(ctx, at(40), 560*time.Second, 8)
	must(err)
	for i, d := range wd {
		if i%2 == 0 {
			must(q.AckWakeAt(ctx, d, at(41)))
			out.Acked = append(out.Acked, d.Wake.ID)
		} else {
			out.Leased = append(out.Leased, d.Wake.ID)
		}
	}
	must(q.Close())
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	must(err)
	var all []*projection.Wake
	must(st.ScanWakes(ctx, func(w *projection.Wake) error { all = append(all, w); return nil }))
	must(st.Close())
	slices.SortFunc(all, func(a, b *projection.Wake) int { return cmp.Compare(a.RecordSeq, b.RecordSeq) })
	for _, w := range all {
		out.Sessions[w.SessionID] = append(out.Sessions[w.SessionID], w.ID)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	must(err)
	must(os.WriteFile(filepath.Join("testdata", "format4-wakes.json"), append(b, '\n'), 0o644))
}
