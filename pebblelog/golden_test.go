package pebblelog_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/goldenstore"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

var update = flag.Bool("update", false, "write the golden store of this build's format (testdata/golden-format<N>-store) and its expected state")

// goldenFormat is the format of the golden store this test opens: the format this release
// keeps. A later format adds its own golden store beside it; this one is never rewritten.
const goldenFormat = 8

var (
	goldenStore = filepath.Join("testdata", "golden-format8-store")
	goldenState = filepath.Join("testdata", "golden-format8-state.json")
	goldenNow   = goldenstore.T0.Add(2 * time.Hour) // the time of the state's Stats
)

// copyDir copies the store in src (no subdirectory but blobs) into dst, leaving out the lock
// files.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if rel == "WORKLOG.lock" || rel == "LOCK" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// writeGolden writes the golden store (goldenstore.Populate through work.Open) and its
// expected state; go test ./pebblelog -run TestGoldenStore -update.
func writeGolden(t *testing.T) {
	if pebblelog.FormatVersion != goldenFormat {
		t.Fatalf("this build writes format %d: the golden store of format %d is never rewritten; add one for format %d", pebblelog.FormatVersion, goldenFormat, pebblelog.FormatVersion)
	}
	ctx := context.Background()
	dir := t.TempDir()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := goldenstore.Populate(ctx, q, goldenstore.BigOutput); err != nil {
		t.Fatal(err)
	}
	st, err := goldenstore.Dump(ctx, q, goldenNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := goldenstore.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(goldenStore); err != nil {
		t.Fatal(err)
	}
	copyDir(t, dir, goldenStore)
	if err := os.WriteFile(goldenState, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenStore opens the golden store of format 8 (testdata/golden-format8-store, written
// once by writeGolden: every record kind, a blob, a pruned range) as a later build must
// forever: read-only, Verify finds nothing and the pruned range is there; then a copy opened
// read-write through work.Open verifies again and reads back exactly the expected state
// (testdata/golden-format8-state.json: the log, every task, the schedules, the kind
// policies and the stats).
func TestGoldenStore(t *testing.T) {
	if *update {
		writeGolden(t)
	}
	ctx := context.Background()
	dir := t.TempDir()
	copyDir(t, goldenStore, dir)
	before := readMarker(t, dir)

	s, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open of the golden store: %v", err)
	}
	if p, err := s.Verify(ctx, pebblelog.VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("read-only Verify of the golden store: %v %v", p, err)
	}
	if r, err := s.PrunedRanges(ctx); err != nil || len(r) == 0 {
		t.Fatalf("the golden store's pruned ranges: %v %v; want one", r, err)
	}
	blobs, err := os.ReadDir(filepath.Join(dir, pebblelog.BlobDir))
	if err != nil || len(blobs) == 0 {
		t.Fatalf("the golden store's blobs: %d, %v; want one", len(blobs), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m := readMarker(t, dir); m != before {
		t.Fatalf("a read-only Open changed the marker: %q, was %q", m, before)
	}

	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatalf("read-write Open of a copy of the golden store: %v", err)
	}
	defer q.Close()
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify after the read-write Open: %v", err)
	}
	if err := goldenstore.Check(ctx, q, goldenNow, goldenState); err != nil {
		t.Fatalf("the golden store: %v", err)
	}
}

func readMarker(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, pebblelog.MarkerFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
