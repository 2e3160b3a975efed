package proptest

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// The package's tests run with a throwaway PostgreSQL server (internal/pgtest), for the
// postgres differential below; without PostgreSQL only that test skips.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, "proptest")) }

// postgresRuns is the share of the budget the postgres differential runs: each history
// empties the queue's tables and opens it again, a few tens of milliseconds.
const postgresRuns = 20

// postgresBackend is postgres.Open on one schema that every history empties first
// (TRUNCATE: creating a schema per history costs its DDL, ~0.2 s). Reopen closes the queue
// and opens the schema again; Crash opens it again without closing the old queue first: a
// client process that dies leaves the server with exactly what it committed, which is every
// acknowledged call.
func postgresBackend(t *testing.T, srv *pgtest.Server) backendSpec {
	dsn := pgtest.Schema(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := u.Query().Get("search_path")
	first := true
	return backendSpec{
		name:        "postgres",
		restartable: true,
		inbox:       true,
		open: func() (store, error) {
			if !first {
				if err := srv.Exec("TRUNCATE " + strings.Join(prefixAll(schema+".", "events", "tasks", "wakes",
					"task_keys", "wake_keys", "due", "kind_due", "wake_index", "session_tasks", "counts", "prunable", "pruned",
					"session_wakes", "schedules", "submit_inbox", "submit_inbox_rejects", "kind_policies", "kind_leases"), ", ") +
					"; UPDATE " + schema + ".log_head SET seq = 0"); err != nil {
					return nil, err
				}
			}
			first = false
			q, err := postgres.Open(context.Background(), dsn, nil)
			if err != nil {
				return nil, err
			}
			return &pgStore{dsn: dsn, q: q}, nil
		},
	}
}

func prefixAll(p string, names ...string) []string {
	for i, n := range names {
		names[i] = p + n
	}
	return names
}

type pgStore struct {
	dsn  string
	q    *work.Queue
	conn *pgx.Conn // the application's connection of SubmitTxOp; nil until its first
}

func (s *pgStore) appConn(ctx context.Context) (*pgx.Conn, error) {
	if s.conn == nil {
		c, err := pgx.Connect(ctx, s.dsn)
		if err != nil {
			return nil, err
		}
		s.conn = c
	}
	return s.conn, nil
}

func (s *pgStore) submitTx(ctx context.Context, q *work.Queue, session string, r work.TaskRequest, commit bool) (work.Task, error) {
	c, err := s.appConn(ctx)
	if err != nil {
		return work.Task{}, err
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return work.Task{}, err
	}
	task, err := postgres.SubmitTx(ctx, tx, q, session, r)
	if err != nil {
		_ = tx.Rollback(ctx)
		return work.Task{}, err
	}
	if !commit {
		return task, tx.Rollback(ctx)
	}
	return task, tx.Commit(ctx)
}

func (s *pgStore) queue() *work.Queue { return s.q }

func (s *pgStore) reopen() error {
	if err := s.q.Close(); err != nil {
		return err
	}
	return s.crash()
}

func (s *pgStore) crash() error {
	q, err := postgres.Open(context.Background(), s.dsn, nil)
	if err != nil {
		return err
	}
	_ = s.q.Close() // after the new open: nothing of the old queue's is needed by it
	s.q = q
	return nil
}

func (s *pgStore) close() {
	_ = s.q.Close()
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
	}
}

// TestDifferentialPostgres compares the in-memory queue with the PostgreSQL one, history by
// history, with every model check on both, Reopen and Crash ops included.
func TestDifferentialPostgres(t *testing.T) {
	srv := pgtest.Need(t)
	checkHistories(t, &harness{backends: []backendSpec{memoryBackend, postgresBackend(t, srv)}}, runsFor(postgresRuns))
}

// TestPropertiesPostgresInbox runs histories on the PostgreSQL queue alone, with
// SubmitTxOps among the ops (the in-memory queue has no SubmitTx to compare with): each is
// answered inside its transaction with Submit's rules (a new task, the same one, or the
// conflict naming the task and the field), read at once after its commit as answered, a
// rolled-back one never stored, and every model check holds around them (claims in order,
// the log, Verify), Reopen and Crash included.
func TestPropertiesPostgresInbox(t *testing.T) {
	srv := pgtest.Need(t)
	checkHistories(t, &harness{backends: []backendSpec{postgresBackend(t, srv)}}, runsFor(postgresRuns))
}

// TestRegressionsPostgres replays the saved histories (testdata/regress) that prune on
// PostgreSQL, as TestRegressions replays all of them on the in-memory and the durable queue
// (mut-36 killed a mutant of the PostgreSQL prune only). Only those: a replay costs about
// 0.3 s there (a TRUNCATE, an Open and a Verify per step), and the others' rules are the
// differential test's.
func TestRegressionsPostgres(t *testing.T) {
	srv := pgtest.Need(t)
	replayRegressions(t, []backendSpec{postgresBackend(t, srv)}, func(ops []op) bool {
		for _, o := range ops {
			if _, ok := o.(PruneOp); ok {
				return true
			}
		}
		return false
	})
}
