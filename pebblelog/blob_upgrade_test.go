package pebblelog_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// copyDir copies the files of testdata/<name> into a new temporary directory.
func copyDir(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("testdata", name)
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func blobFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, pebblelog.BlobDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// A format-3 store holds its large values inline: in its events and, for a settled task's
// output, in the record. Read-only it reads as it is; opened read-write it becomes format 4
// without rewriting anything (no blob is made), every value reads back the same, Verify
// agrees, new large values go to blobs, and a prune of the old subjects works (they have no
// blob index entries).
func TestFormat3StoreUpgradesToFormat4(t *testing.T) {
	var want format3Values
	b, err := os.ReadFile(filepath.Join("testdata", "format3-values.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	dir := copyDir(t, "format3-store")
	ctx := context.Background()

	ro, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	err = ro.ScanTasks(ctx, func(tk *projection.Task) error {
		w, ok := want.Tasks[tk.ID]
		if !ok {
			t.Errorf("task %s is not in the fixture's values", tk.ID)
			return nil
		}
		seen++
		if sum(tk.Input) != w.Input || (w.Output != "" && sum(tk.Outcome.Output) != w.Output) {
			t.Errorf("read-only: task %s: values differ from the fixture's", tk.ID)
		}
		return nil
	})
	if err != nil || seen != len(want.Tasks) {
		t.Fatalf("read-only ScanTasks: %d of %d tasks, %v", seen, len(want.Tasks), err)
	}
	if p, err := ro.Verify(ctx, pebblelog.VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("read-only Verify: %v %v", p, err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	q, err := work.Open(dir, &work.Options{MaxValueBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { q.Close() }()
	if m, _ := os.ReadFile(filepath.Join(dir, pebblelog.MarkerFile)); strings.TrimSpace(string(m)) != "worklog store format "+strconv.Itoa(pebblelog.FormatVersion) {
		t.Fatalf("marker after the upgrade: %q", m)
	}
	if f := blobFiles(t, dir); len(f) > 0 {
		t.Fatalf("the upgrade wrote blobs: %v", f)
	}
	s := q.Session(want.Session)
	check := func(when string) {
		t.Helper()
		for id, w := range want.Tasks {
			got, ok, err := s.Task(ctx, id)
			if err != nil || !ok {
				t.Fatalf("%s: task %s: %v %v", when, id, ok, err)
			}
			if sum(got.Input) != w.Input || got.State.String() != w.State {
				t.Errorf("%s: task %s: input or state differ (state %s)", when, id, got.State)
			}
			if w.Output != "" && (got.Outcome == nil || sum(got.Outcome.Output) != w.Output) {
				t.Errorf("%s: task %s: output differs", when, id)
			}
		}
	}
	check("after the upgrade")
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify after the upgrade: %v", err)
	}

	// The requested wake's payload, read through a claim.
	wds, err := q.ClaimWakesAt(ctx, time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC), time.Minute, 10)
	if err != nil || len(wds) != 1 {
		t.Fatalf("claiming the fixture's wake: %d, %v", len(wds), err)
	}
	if sum(wds[0].Wake.Reason.Payload) != want.Wakes[wds[0].Wake.ID] {
		t.Errorf("wake %s: payload differs", wds[0].Wake.ID)
	}

	// A new large value goes to a blob.
	in := bigJSON(rand.New(rand.NewPCG(9, 9)), pebblelog.BlobMin+1)
	nt, err := s.Submit(ctx, work.TaskRequest{Kind: "big", Input: in})
	if err != nil {
		t.Fatal(err)
	}
	if f := blobFiles(t, dir); len(f) != 1 {
		t.Fatalf("a new large input made blobs %v, want one", f)
	}
	// The old settled task and its acknowledged completion wake are prunable: their values
	// are inline, there is no blob to remove.
	res, err := q.Prune(ctx, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	if err != nil || res.Tasks != 1 || res.Wakes != 1 {
		t.Fatalf("Prune: %+v, %v", res, err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify after the prune: %v", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if q, err = work.Open(dir, &work.Options{MaxValueBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := q.Session(want.Session).Task(ctx, nt.ID)
	if err != nil || !ok || sum(got.Input) != sum(in) {
		t.Fatalf("the new task after reopening: %v %v", ok, err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify after reopening: %v", err)
	}
}

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
