package postgres_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestPruner runs the background pruner's scenarios (work/worktest, RunPruner) on
// PostgreSQL: the loop is package work's, the same as work.Open's. Break renames the
// retention index's table away.
func TestPruner(t *testing.T) {
	t.Parallel() // see TestMain
	worktest.RunPruner(t, worktest.PrunerHarness{
		New: func(t *testing.T) worktest.PrunerStore {
			dsn := pgtest.Schema(t)
			return worktest.PrunerStore{
				Open: func(t *testing.T, retention, interval time.Duration, logger *slog.Logger) *work.Queue {
					t.Helper()
					q, err := postgres.Open(context.Background(), dsn, &postgres.Options{Retention: retention, PruneInterval: interval, Logger: logger})
					if err != nil {
						t.Fatal(err)
					}
					return q
				},
				Break: func(t *testing.T) {
					ctx := context.Background()
					c, err := pgx.Connect(ctx, dsn)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close(ctx)
					if _, err := c.Exec(ctx, "ALTER TABLE prunable RENAME TO prunable_broken"); err != nil {
						t.Fatal(err)
					}
				},
			}
		},
	})
}
