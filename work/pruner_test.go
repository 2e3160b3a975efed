package work_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestPruner runs the background pruner's scenarios (work/worktest, RunPruner) on a durable
// queue; postgres runs the same on PostgreSQL: one loop, package work's, for both.
func TestPruner(t *testing.T) {
	worktest.RunPruner(t, worktest.PrunerHarness{
		New: func(t *testing.T) func(*testing.T, time.Duration, time.Duration, *slog.Logger) *work.Queue {
			dir := t.TempDir()
			return func(t *testing.T, retention, interval time.Duration, logger *slog.Logger) *work.Queue {
				t.Helper()
				q, err := work.Open(dir, &work.Options{Retention: retention, PruneInterval: interval, Logger: logger})
				if err != nil {
					t.Fatal(err)
				}
				return q
			}
		},
	})
}
