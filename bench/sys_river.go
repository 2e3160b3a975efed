package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/mattn/go-sqlite3"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

// benchArgs is the job: the ~200-byte input plus the idempotency key. Only the key takes part
// in uniqueness (river:"unique" with UniqueOpts.ByArgs), so a job inserted again with the same
// key, while the first one is in any state of River's default unique set (available,
// completed, pending, retryable, running, scheduled), is skipped and the existing job returned.
type benchArgs struct {
	Key   string          `json:"key" river:"unique"`
	Input json.RawMessage `json:"input"`
}

func (benchArgs) Kind() string { return "bench" }

func (benchArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

type benchWorker struct {
	river.WorkerDefaults[benchArgs]
}

func (benchWorker) Work(context.Context, *river.Job[benchArgs]) error { return nil }

type riverQueue[TTx any] struct {
	driver  riverdriver.Driver[TTx]
	client  *river.Client[TTx]
	close   func() error
	count   func(ctx context.Context) (int, error) // completed jobs, after close
	workers int
}

func newRiverQueue[TTx any](ctx context.Context, driver riverdriver.Driver[TTx], workers int) (*riverQueue[TTx], error) {
	m, err := rivermigrate.New(driver, nil)
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	ws := river.NewWorkers()
	river.AddWorker(ws, benchWorker{})
	client, err := river.NewClient(driver, &river.Config{
		// River's own benchmark (cmd/river/riverbench) uses these two; the defaults (100 ms,
		// 1 s) cap a 16-worker queue at ~160 jobs/s.
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	return &riverQueue[TTx]{driver: driver, client: client, workers: workers}, nil
}

func (r *riverQueue[TTx]) Enqueue(ctx context.Context, key string, input []byte) (string, error) {
	res, err := r.client.Insert(ctx, benchArgs{Key: key, Input: input}, nil)
	if err != nil {
		return "", err
	}
	if res.UniqueSkippedAsDuplicate {
		return "", fmt.Errorf("first insert of %s was skipped as a duplicate", key)
	}
	return strconv.FormatInt(res.Job.ID, 10), nil
}

func (r *riverQueue[TTx]) Keys() bool { return true }

func (r *riverQueue[TTx]) Duplicate(ctx context.Context, key string, input []byte) (string, error) {
	res, err := r.client.Insert(ctx, benchArgs{Key: key, Input: input}, nil)
	if err != nil {
		return "", err
	}
	if !res.UniqueSkippedAsDuplicate || res.Job.State != rivertype.JobStateCompleted {
		return "", fmt.Errorf("insert of %s: skipped=%v state=%s, want the existing completed job",
			key, res.UniqueSkippedAsDuplicate, res.Job.State)
	}
	return strconv.FormatInt(res.Job.ID, 10), nil
}

// Work starts the client (a producer fetching up to `workers` jobs at a time, a batch
// completer) and counts completion events; River sends one after the completer's update
// committed.
func (r *riverQueue[TTx]) Work(ctx context.Context, total, _ int) error {
	events, cancel := r.client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: total + 1024,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancel()
	if err := r.client.Start(ctx); err != nil {
		return err
	}
	var completed atomic.Int64
	var failure error
	timeout := time.NewTimer(30 * time.Minute)
	defer timeout.Stop()
	for completed.Load() < int64(total) && failure == nil {
		select {
		case ev, ok := <-events:
			if !ok {
				failure = fmt.Errorf("subscription closed after %d completions", completed.Load())
				break
			}
			if ev.Kind != river.EventKindJobCompleted {
				failure = fmt.Errorf("job %d: event %s", ev.Job.ID, ev.Kind)
				break
			}
			completed.Add(1)
		case <-timeout.C:
			failure = fmt.Errorf("timed out after %d completions", completed.Load())
		}
	}
	stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer stopCancel()
	if err := r.client.Stop(stopCtx); err != nil && failure == nil {
		failure = err
	}
	return failure
}

func (r *riverQueue[TTx]) Close() error { return r.close() }

func (r *riverQueue[TTx]) Completed(ctx context.Context) (int, error) { return r.count(ctx) }

const countCompleted = `SELECT count(*) FROM river_job WHERE state = 'completed'`

// --- SQLite ---

func sqliteDSN(path, synchronous string) string {
	return "file:" + path + "?_journal_mode=WAL&_synchronous=" + synchronous + "&_busy_timeout=10000"
}

func openSQLite(path, synchronous string) (*sql.DB, error) {
	db, err := sql.Open("sqlite3", sqliteDSN(path, synchronous))
	if err != nil {
		return nil, err
	}
	// One connection, as both riversqlite and goqite document.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		db.Close()
		return nil, fmt.Errorf("journal_mode %q, want wal (%v)", mode, err)
	}
	return db, nil
}

func openRiverSQLite(synchronous string) func(context.Context, string, childConfig) (queue, error) {
	return func(ctx context.Context, dir string, cfg childConfig) (queue, error) {
		path := filepath.Join(dir, "river.db")
		db, err := openSQLite(path, synchronous)
		if err != nil {
			return nil, err
		}
		r, err := newRiverQueue(ctx, riversqlite.New(db), cfg.Workers)
		if err != nil {
			db.Close()
			return nil, err
		}
		r.close = db.Close
		r.count = func(ctx context.Context) (int, error) {
			db, err := openSQLite(path, synchronous)
			if err != nil {
				return 0, err
			}
			defer db.Close()
			var n int
			err = db.QueryRowContext(ctx, countCompleted).Scan(&n)
			return n, err
		}
		return r, nil
	}
}

// --- PostgreSQL ---

// openRiverPG creates a fresh database on the server cfg.PGDSN names, and drops it after the
// check.
func openRiverPG(ctx context.Context, _ string, cfg childConfig) (queue, error) {
	if cfg.PGDSN == "" {
		return nil, fmt.Errorf("no PostgreSQL server: pass -pg DSN, or use run.sh")
	}
	dbName := fmt.Sprintf("bench_%d_%d", cfg.Run, time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, cfg.PGDSN)
	if err != nil {
		return nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
		admin.Close(ctx)
		return nil, err
	}
	admin.Close(ctx)
	drop := func(ctx context.Context) error {
		admin, err := pgx.Connect(ctx, cfg.PGDSN)
		if err != nil {
			return err
		}
		defer admin.Close(ctx)
		_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)")
		return err
	}
	poolCfg, err := pgxpool.ParseConfig(cfg.PGDSN)
	if err != nil {
		return nil, err
	}
	poolCfg.ConnConfig.Database = dbName
	// pgxpool's default is max(4, NumCPU): too few for 16 inserting goroutines plus the
	// client's own connections.
	poolCfg.MaxConns = int32(2*cfg.Workers + 8)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		drop(ctx)
		return nil, err
	}
	r, err := newRiverQueue(ctx, riverpgxv5.New(pool), cfg.Workers)
	if err != nil {
		pool.Close()
		drop(ctx)
		return nil, err
	}
	r.close = func() error { pool.Close(); return nil }
	r.count = func(ctx context.Context) (int, error) {
		defer drop(ctx)
		pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
		if err != nil {
			return 0, err
		}
		defer pool.Close()
		var n int
		err = pool.QueryRow(ctx, countCompleted).Scan(&n)
		return n, err
	}
	return r, nil
}
