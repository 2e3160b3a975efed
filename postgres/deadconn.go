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
// the transaction ran, so beginning again on another connection is always safe: the reads
// and the writer's groups do, rather than fail a caller for a connection nobody used
// (issue 25: TestTerminateWriterUnderLoad's listing after the terminations). A closed
// connection is dropped by the pool when it is released, so the attempts are bounded by the
// pool's size (plus one new connection); a BEGIN that fails on a connection still open, or
// because ctx ended, is returned as it is.

// beginAttempts is how many connections a BEGIN is tried on: every pooled one may be dead.
func (e *engine) beginAttempts() int { return int(e.pool.Config().MaxConns) + 1 }

// retryBegin reports whether a BEGIN that failed on conn may be tried again on another one:
// the failure closed conn (so nothing of the transaction ran, or will), ctx has not ended, and
// attempt (from 1) is not the last.
func (e *engine) retryBegin(ctx context.Context, conn *pgxpool.Conn, attempt int) bool {
	return conn.Conn().IsClosed() && ctx.Err() == nil && attempt < e.beginAttempts()
}

// beginRead begins View's read-only, repeatable-read transaction on a live connection. The
// caller rolls tx back, then releases conn.
func (e *engine) beginRead(ctx context.Context) (pgx.Tx, *pgxpool.Conn, error) {
	for attempt := 1; ; attempt++ {
		conn, err := e.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err == nil {
			return tx, conn, nil
		}
		retry := e.retryBegin(ctx, conn, attempt)
		conn.Release()
		if !retry {
			return nil, nil, err
		}
	}
}

// acquireBegun acquires a connection and begins the writer's group on it (begin), on another
// connection when the one the pool gave was dead. On an error, conn is nil.
func (e *engine) acquireBegun(ctx context.Context) (*pgxpool.Conn, *txn, error) {
	for attempt := 1; ; attempt++ {
		conn, err := e.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		tx, err := e.begin(ctx, conn)
		if err == nil {
			return conn, tx, nil
		}
		retry := e.retryBegin(ctx, conn, attempt)
		rollback(conn)
		conn.Release()
		if !retry {
			return nil, nil, err
		}
	}
}
