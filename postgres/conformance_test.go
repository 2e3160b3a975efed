package postgres_test

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, "postgres")) }

// harness runs the conformance suite on postgres.Open, one fresh schema per queue. Reopen
// closes the queue and opens its schema again; after every test the schema is opened once
// more and verified, as the durable harness does with its directories.
func harness(opts *postgres.Options) worktest.Harness {
	var mu sync.Mutex
	dsns := map[*work.Queue]string{}
	open := func(t *testing.T, dsn string) *work.Queue {
		t.Helper()
		q, err := postgres.Open(context.Background(), dsn, opts)
		if err != nil {
			t.Fatalf("postgres.Open: %v", err)
		}
		mu.Lock()
		dsns[q] = dsn
		mu.Unlock()
		return q
	}
	h := worktest.Harness{
		New: func(t *testing.T) *work.Queue {
			dsn := pgtest.Schema(t)
			t.Cleanup(func() {
				q, err := postgres.Open(context.Background(), dsn, opts)
				if err != nil {
					t.Errorf("reopening after the test: %v", err)
					return
				}
				defer q.Close()
				if err := q.Verify(context.Background()); err != nil {
					t.Errorf("Verify of the reopened queue after the test: %v", err)
				}
			})
			return open(t, dsn)
		},
		Reopen: func(t *testing.T, q *work.Queue) *work.Queue {
			mu.Lock()
			dsn, ok := dsns[q]
			mu.Unlock()
			if !ok {
				t.Fatal("Reopen of a queue the harness did not open")
			}
			if err := q.Close(); err != nil {
				t.Fatalf("Close before reopening: %v", err)
			}
			return open(t, dsn)
		},
		SubmitTx: func(t *testing.T, q *work.Queue, session string, r work.TaskRequest, commit bool) {
			mu.Lock()
			dsn := dsns[q]
			mu.Unlock()
			c, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			submitTx(t, c, q, session, r, commit)
		},
	}
	if opts != nil {
		h.MaxValueBytes = opts.MaxValueBytes
	}
	return h
}

// TestConformance runs work/worktest's whole suite on PostgreSQL.
func TestConformance(t *testing.T) {
	worktest.Run(t, harness(nil))
}
