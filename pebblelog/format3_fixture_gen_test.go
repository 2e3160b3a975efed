package pebblelog_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// format3Values is what testdata/format3-values.json records of the format-3 fixture: the
// ids of its tasks and wakes, and the SHA-256 of each value they hold, keyed by id.
type format3Values struct {
	Tasks   map[string]format3Task `json:"tasks"`
	Wakes   map[string]string      `json:"wakes"` // wake id -> sha256 of its payload or completion output
	Session string                 `json:"session"`
}

type format3Task struct {
	Input  string `json:"input"`
	Output string `json:"output,omitempty"`
	State  string `json:"state"`
}

// bigJSON is a JSON string of n bytes (n >= 2) drawn from rng: values the fixture stores
// inline in format 3 that format 4 would put in blobs (n >= pebblelog.BlobMin).
func bigJSON(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	b[0], b[n-1] = '"', '"'
	for i := 1; i < n-1; i++ {
		b[i] = 'a' + byte(rng.IntN(26))
	}
	return b
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestWriteFormat3Fixture writes testdata/format3-store and testdata/format3-values.json with
// the build it runs in. It ran once, on the last format-3 build (d4b31f8), to pin a format-3
// store holding large values inline (in its events and in a settled task's record), which
// format 4 keeps in blob files; later builds must not rewrite it, so it runs only when asked:
//
//	WORKLOG_WRITE_FORMAT3_FIXTURE=1 go test ./pebblelog -run TestWriteFormat3Fixture
func TestWriteFormat3Fixture(t *testing.T) {
	if os.Getenv("WORKLOG_WRITE_FORMAT3_FIXTURE") == "" {
		t.Skip("set WORKLOG_WRITE_FORMAT3_FIXTURE=1 to rewrite the format-3 fixture")
	}
	if pebblelog.FormatVersion != 3 {
		t.Fatalf("this build writes format %d, not 3", pebblelog.FormatVersion)
	}
	dir := filepath.Join("testdata", "format3-store")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, err := work.Open(dir, &work.Options{
		MaxValueBytes: 1 << 20,
		Entropy:       rand.NewChaCha8([32]byte{'f', 'o', 'r', 'm', 'a', 't', '3'}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(3, 3))
	const big = 300 << 10
	vals := format3Values{Tasks: map[string]format3Task{}, Wakes: map[string]string{}, Session: "s"}
	s := q.Session("s")

	// A task with a large input, settled with a large output, its completion wake acked.
	in1, out1 := bigJSON(rng, big), bigJSON(rng, big)
	t1, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "big", Input: in1, Wake: work.WakeOnCompletion}, at(0))
	must(err)
	ds, err := q.ClaimDueAt(ctx, at(1), time.Minute, 1)
	must(err)
	_, err = q.FinishAt(ctx, ds[0], work.Success(out1), at(2))
	must(err)
	wds, err := q.ClaimWakesAt(ctx, at(3), time.Minute, 1)
	must(err)
	must(q.AckWakeAt(ctx, wds[0], at(4)))
	vals.Tasks[t1.ID] = format3Task{Input: sum(in1), Output: sum(out1), State: "succeeded"}
	vals.Wakes[wds[0].Wake.ID] = sum(out1)

	// A pending task with a large input and a small one; a requested wake with a large payload.
	in2 := bigJSON(rng, big)
	t2, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "big", Input: in2}, at(5))
	must(err)
	vals.Tasks[t2.ID] = format3Task{Input: sum(in2), State: "pending"}
	small := []byte(`{"n":1}`)
	t3, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "small", Input: small}, at(6))
	must(err)
	vals.Tasks[t3.ID] = format3Task{Input: sum(small), State: "pending"}
	p := bigJSON(rng, big)
	w, err := s.WakeAt(ctx, work.WakeRequest{Payload: p}, at(7))
	must(err)
	vals.Wakes[w.ID] = sum(p)
	must(q.Close())

	b, err := json.MarshalIndent(vals, "", "  ")
	must(err)
	must(os.WriteFile(filepath.Join("testdata", "format3-values.json"), append(b, '\n'), 0o644))
}
