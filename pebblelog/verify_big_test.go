package pebblelog_test

import (
	"context"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/storegen"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// TestVerifyAcrossRebuildChunks: Verify's rebuild commits to its scratch store in chunks and
// keeps what the writer keeps in memory across them (the kind policies, the ids known to
// have no record, the record cache). On a generated store of many chunks, with a kind policy
// set before the first task and its claims spread over every chunk, a store that was never
// damaged verifies clean.
func TestVerifyAcrossRebuildChunks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	if err := q.SetKindPolicyAt(ctx, "kind-3", work.KindPolicy{MaxRunning: 10_000}, start); err != nil {
		t.Fatal(err)
	}
	if _, err := storegen.Build(ctx, q, 3000, storegen.Options{Start: start, Round: 500}); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	problems, err := st.Verify(ctx, pebblelog.VerifyOptions{})
	if err != nil || len(problems) > 0 {
		t.Fatalf("Verify: %v, %d problems: %q", err, len(problems), problems[:min(len(problems), 10)])
	}
}
