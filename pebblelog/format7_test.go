package pebblelog_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// TestFormat7StoreUpgradesToFormat8: a store whose format key and marker say 7 (what a
// build before the schedules wrote: no schedule keys) reads as it is read-only, with no
// schedules, and a read-write Open makes it format 8; its tasks stay, schedules then work,
// and Verify agrees.
func TestFormat7StoreUpgradesToFormat8(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	task, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "k"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	// Back to format 7: the format key and the marker.
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("mformat"), []byte("worklog store format 7"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, pebblelog.MarkerFile), []byte("worklog store format 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	ro, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := ro.Verify(ctx, pebblelog.VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("read-only Verify of the format-7 store: %v %v", p, err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	q, err = work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if m, _ := os.ReadFile(filepath.Join(dir, pebblelog.MarkerFile)); strings.TrimSpace(string(m)) != "worklog store format 8" {
		t.Fatalf("marker after the upgrade: %q", m)
	}
	if _, ok, err := q.Session("s").Task(ctx, task.ID); err != nil || !ok {
		t.Fatalf("the task after the upgrade: %v %v", ok, err)
	}
	sc := work.Schedule{Name: "n", Cron: "@every 10s", Task: work.TaskRequest{Kind: "k"}}
	if err := q.Session("s").SetScheduleAt(ctx, sc, t0); err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, t0.Add(10*time.Second), time.Minute, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claim after the upgrade: %d tasks, %v; want the old task and the tick", len(ds), err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
