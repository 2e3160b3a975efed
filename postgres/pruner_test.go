package postgres_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestPruner runs the background pruner's scenarios (work/worktest, RunPruner) on
// PostgreSQL: the loop is package work's, the same as work.Open's.
func TestPruner(t *testing.T) {
	worktest.RunPruner(t, worktest.PrunerHarness{
		New: func(t *testing.T) func(*testing.T, time.Duration, time.Duration, *slog.Logger) *work.Queue {
			dsn := pgtest.Schema(t)
			return func(t *testing.T, retention, interval time.Duration, logger *slog.Logger) *work.Queue {
				t.Helper()
				q, err := postgres.Open(context.Background(), dsn, &postgres.Options{Retention: retention, PruneInterval: interval, Logger: logger})
				if err != nil {
					t.Fatal(err)
				}
				return q
			}
		},
	})
}
