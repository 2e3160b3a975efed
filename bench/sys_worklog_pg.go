package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// openWorklogPG runs worklog's queue on PostgreSQL (postgres.Open) on a fresh database of the
// server cfg.PGDSN names, the server River on PostgreSQL uses in the same run, with its
// defaults (fsync=on, synchronous_commit=on). The workloads run through the same adapter as
// the Pebble row (worklogQueue: the same W2 pool), so the rows differ only in the engine.
// The database is dropped after the check.
func openWorklogPG(ctx context.Context, _ string, cfg childConfig) (queue, error) {
	if cfg.PGDSN == "" {
		return nil, fmt.Errorf("no PostgreSQL server: pass -pg DSN, or use run.sh")
	}
	dbName := fmt.Sprintf("bench_wl_%d_%d", cfg.Run, time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, cfg.PGDSN)
	if err != nil {
		return nil, err
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+dbName)
	admin.Close(ctx)
	if err != nil {
		return nil, err
	}
	drop := func(ctx context.Context) error {
		if os.Getenv("BENCH_PG_KEEP") != "" { // kept for a look afterwards (pg_stat_user_tables, sizes)
			fmt.Fprintf(os.Stderr, "bench: database %s kept\n", dbName)
			return nil
		}
		admin, err := pgx.Connect(ctx, cfg.PGDSN)
		if err != nil {
			return err
		}
		defer admin.Close(ctx)
		_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)")
		return err
	}
	u, err := url.Parse(cfg.PGDSN)
	if err != nil {
		drop(ctx)
		return nil, err
	}
	u.Path = "/" + dbName
	qs := u.Query()
	qs.Set("search_path", "worklog")
	u.RawQuery = qs.Encode()
	dsn := u.String()
	// Reads (W3's duplicates are each one read on the pool, outside the writer; Session.Task
	// and the check read there too) get room for the workers besides the writer.
	opts := &postgres.Options{MaxConns: int32(cfg.Workers + 2)}
	q, err := postgres.Open(ctx, dsn, opts)
	if err != nil {
		drop(ctx)
		return nil, err
	}
	return &worklogQueue{q: q, s: q.Session(worklogSession), pool: cfg.WorklogPool,
		reopen: func(ctx context.Context) (*work.Queue, error) { return postgres.Open(ctx, dsn, opts) },
		done:   drop,
	}, nil
}
