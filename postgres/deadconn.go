package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A pooled connection whose server process ended while it sat idle in the pool
// (pg_terminate_backend, idle_session_timeout, a server restart) is handed out as if alive:
// the pool pings only connections idle for more than a second. Its first statement fails,
// and the failure closes it. When that statement is the BEGIN of a transaction, nothing of
// the transaction ran; when it is a read whose rows no caller has seen yet (a page is read
// whole before its callback runs), nothing was delivered. Either may run again on another
// connection, and every read and the writer's groups do (onLive), rather than fail a caller
// for a connection nobody used (issue 25: TestTerminateWriterUnderLoad's listing after the
// terminations). A closed connection is dropped by the pool when it is released, so the
// attempts are bounded by the pool's size (plus one new connection); a failure on a
// connection still open, or because ctx ended, is returned as it is.

// liveAttempts is how many connections onLive tries: every pooled one may be dead.
func (e *engine) liveAttempts() int { return int(e.pool.Config().MaxConns) + 1 }

// onLive acquires a connection of the pool and runs fn on it. When fn fails and the failure
// closed the connection, and ctx has not ended, fn runs again on another connection (at most
// liveAttempts times); failed, when not nil, cleans up a connection fn failed on before it is
// released. So fn must be safe to run again after a failure that closed its connection: a
// BEGIN, or a read that delivers nothing before it returns. On success the connection is the
// caller's to release; on an error it is nil.
func (e *engine) onLive(ctx context.Context, fn func(*pgxpool.Conn) error, failed func(*pgxpool.Conn)) (*pgxpool.Conn, error) {
	for attempt := 1; ; attempt++ {
		conn, err := e.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		if err = fn(conn); err == nil {
			return conn, nil
		}
		retry := conn.Conn().IsClosed() && ctx.Err() == nil && attempt < e.liveAttempts()
		if failed != nil {
			failed(conn)
		}
		conn.Release()
		if !retry {
			return nil, err
		}
	}
}

// reads is where a read runs its statements: a transaction's (onTx: as it is, on the
// transaction's one connection) or the pool's (the engine: on a live connection, onLive).
// fn must deliver nothing to a caller before it returns: it may run more than once.
type reads interface {
	run(ctx context.Context, fn func(querier) error) error
}

// run runs the read fn on a live connection of the pool.
func (e *engine) run(ctx context.Context, fn func(querier) error) error {
	conn, err := e.onLive(ctx, func(c *pgxpool.Conn) error { return fn(c) }, nil)
	if conn != nil {
		conn.Release()
	}
	return err
}

// onTx runs reads inside a transaction (View's, Verify's snapshot): a dead connection there
// fails the transaction, whose BEGIN onLive already retried.
type onTx struct{ q querier }

func (t onTx) run(_ context.Context, fn func(querier) error) error { return fn(t.q) }

// readValue is a read of one value through r.
func readValue[T any](ctx context.Context, r reads, fn func(querier) (T, error)) (T, error) {
	var v T
	err := r.run(ctx, func(q querier) error {
		var err error
		v, err = fn(q)
		return err
	})
	return v, err
}

// queryRow scans the one row of sql into dest, through r.
func queryRow(ctx context.Context, r reads, sql string, args []any, dest ...any) error {
	return r.run(ctx, func(q querier) error { return q.QueryRow(ctx, sql, args...).Scan(dest...) })
}

// beginRead begins View's read-only, repeatable-read transaction on a live connection. The
// caller rolls tx back, then releases conn.
func (e *engine) beginRead(ctx context.Context) (pgx.Tx, *pgxpool.Conn, error) {
	var tx pgx.Tx
	conn, err := e.onLive(ctx, func(c *pgxpool.Conn) error {
		var err error
		tx, err = c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		return err
	}, nil)
	if err != nil {
		return nil, nil, err
	}
	return tx, conn, nil
}

// acquireBegun acquires a connection and begins the writer's group on it (begin), on another
// connection when the one the pool gave was dead. On an error, conn is nil.
func (e *engine) acquireBegun(ctx context.Context) (*pgxpool.Conn, *txn, error) {
	var tx *txn
	conn, err := e.onLive(ctx, func(c *pgxpool.Conn) error {
		var err error
		tx, err = e.begin(ctx, c)
		return err
	}, rollback)
	if err != nil {
		return nil, nil, err
	}
	return conn, tx, nil
}
