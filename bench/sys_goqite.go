package main

import (
	"context"
	"database/sql"
	_ "embed"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"maragu.dev/goqite"
)

// goqiteSchema is goqite v0.4.0's schema_sqlite.sql (MIT licence, Copyright (c) Maragu ApS), which the
// package does not export: its README has the application execute the file.
//
//go:embed goqite_schema_sqlite.sql
var goqiteSchema string

type goqiteQueue struct {
	path, synchronous string
	db                *sql.DB
	q                 *goqite.Queue
	sent              atomic.Int64
}

func openGoqite(synchronous string) func(context.Context, string, childConfig) (queue, error) {
	return func(ctx context.Context, dir string, _ childConfig) (queue, error) {
		path := filepath.Join(dir, "goqite.db")
		db, err := openSQLite(path, synchronous)
		if err != nil {
			return nil, err
		}
		if _, err := db.ExecContext(ctx, goqiteSchema); err != nil {
			db.Close()
			return nil, err
		}
		// The redelivery timeout is far longer than the run, as worklog's lease: no message is
		// received twice.
		q := goqite.New(goqite.NewOpts{DB: db, Name: "bench", Timeout: 10 * time.Minute})
		return &goqiteQueue{path: path, synchronous: synchronous, db: db, q: q}, nil
	}
}

func (g *goqiteQueue) Enqueue(ctx context.Context, _ string, input []byte) (string, error) {
	id, err := g.q.SendAndGetID(ctx, goqite.Message{Body: input})
	if err == nil {
		g.sent.Add(1)
	}
	return string(id), err
}

func (g *goqiteQueue) Keys() bool { return false }
func (g *goqiteQueue) Duplicate(context.Context, string, []byte) (string, error) {
	return "", errNotApplicable
}

// Work runs `workers` goroutines that each Receive a message and Delete it (goqite's
// acknowledgment: a completed message is deleted), until Receive finds nothing.
func (g *goqiteQueue) Work(ctx context.Context, total, workers int) error {
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := g.q.Receive(ctx)
				if err != nil {
					errs <- err
					return
				}
				if m == nil {
					return
				}
				if err := g.q.Delete(ctx, m.ID); err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return poolResult(errs, done.Load(), total)
}

func (g *goqiteQueue) Close() error { return g.db.Close() }

// Completed: goqite deletes a message when it is done, so completed = sent - left in the table.
func (g *goqiteQueue) Completed(ctx context.Context) (int, error) {
	db, err := openSQLite(g.path, g.synchronous)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM goqite`).Scan(&left); err != nil {
		return 0, err
	}
	return int(g.sent.Load()) - left, nil
}
