package work_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestPruner runs the background pruner's scenarios (work/worktest, RunPruner) on a durable
// queue; postgres runs the same on PostgreSQL: one loop, package work's, for both. Break
// fails every write of the store's WAL (Pebble's errorfs).
func TestPruner(t *testing.T) {
	worktest.RunPruner(t, worktest.PrunerHarness{
		New: func(t *testing.T) worktest.PrunerStore {
			dir := t.TempDir()
			var broken atomic.Bool
			fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
				if broken.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
					return errorfs.ErrInjected
				}
				return nil
			}))
			return worktest.PrunerStore{
				Open: func(t *testing.T, retention, interval time.Duration, logger *slog.Logger) *work.Queue {
					t.Helper()
					q, err := work.Open(dir, &work.Options{Retention: retention, PruneInterval: interval, Logger: logger, FS: fs})
					if err != nil {
						t.Fatal(err)
					}
					return q
				},
				Break: func(*testing.T) { broken.Store(true) },
			}
		},
	})
}

// A task read while a prune removes it finds it whole or not at all. Pebble's View read the
// record and then the input from the task's creating event, each from the live database: a
// prune committed between the two made the read fail with "corrupt projection record: the
// event that created the record is missing" (found by RunPruner's close_during_a_long_prune
// under -race). View now reads one snapshot.
func TestTaskReadDuringPrune(t *testing.T) {
	defer work.SetPruneGroup(1)() // many commits for the reads to fall between
	q, err := work.Open(t.TempDir(), &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	s := q.Session("s")
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const n = 300
	ids := make([]string, n)
	for i := range n {
		tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"i":1}`)}, at)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = tk.ID
	}
	ds, err := q.ClaimDueAt(ctx, at, time.Hour, n)
	if err != nil || len(ds) != n {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	for _, d := range ds {
		if _, err := q.FinishAt(ctx, d, work.Success(nil), at); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := q.Prune(ctx, at.Add(time.Second))
		done <- err
	}()
	for reads := 0; ; reads++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d reads during the prune", reads)
			return
		default:
		}
		// The first task still there: the next one the prune removes.
		for _, id := range ids {
			tk, found, err := s.Task(ctx, id)
			if err != nil {
				t.Fatalf("Task(%s) during a prune: %v", id, err)
			}
			if found {
				if string(tk.Input) != `{"i":1}` {
					t.Fatalf("Task(%s) during a prune: input %s", id, tk.Input)
				}
				break
			}
		}
	}
}
