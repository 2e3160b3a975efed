package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/worklog/worklog/events"
)

// Follow is Queue.Follow for tools holding a read-only Store (replay log --follow): it calls
// fn for every event with seq >= from, in order, then for each event committed afterwards by
// any process sharing the queue, until ctx ends (ctx.Err()), fn fails (its error, as is) or
// the Store is closed.
//
// It holds one connection of its own in LISTEN on the queue's channel (the one every writing
// group notifies in its transaction), taken before the first read: a commit after the LISTEN
// leaves a notification queued on that connection, so no commit between a read and the wait
// is missed. It then reads the log to its end (committed rows only, a prefix of the log: the
// head lock), and blocks on the connection until the next notification: no polling. A lost
// listening connection is made again (waits doubling from 50 ms to 2 s), and the log read
// again, since a notification may have been missed meanwhile; a failed read ends it with the
// error, as does a server that refuses the LISTEN.
func (s *Store) Follow(ctx context.Context, from uint64, fn func(events.Event) error) error {
	e := s.e
	if e.isClosed() {
		return errClosed()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	lctx, stop := e.untilClose(ctx)
	defer stop()
	next := max(from, 1)
	var fnErr error
	read := func() error {
		return e.ReadLog(lctx, next, func(ev events.Event) error {
			if err := fn(ev); err != nil {
				fnErr = err
				return err
			}
			next = ev.Head().Seq + 1
			return nil
		})
	}
	ended := func(err error) error {
		switch {
		case fnErr != nil:
			return fnErr
		case ctx.Err() != nil:
			return ctx.Err()
		case e.isClosed():
			return errClosed()
		}
		return err
	}
	wait := 50 * time.Millisecond
	for {
		// The listener first, then the read: a commit after LISTEN is queued on conn.
		conn, err := pgx.ConnectConfig(lctx, e.pool.Config().ConnConfig.Copy())
		if err == nil {
			if _, err = conn.Exec(lctx, "LISTEN "+pgx.Identifier{e.channel}.Sanitize()); err != nil {
				conn.Close(context.Background())
			}
		}
		if err == nil {
			wait = 50 * time.Millisecond
			for err == nil {
				if rerr := read(); rerr != nil {
					conn.Close(context.Background())
					return ended(rerr) // a read that fails ends the follower, as ReadLog's caller sees it
				}
				_, err = conn.WaitForNotification(lctx)
			}
			conn.Close(context.Background())
		}
		var pe *pgconn.PgError
		if ctx.Err() != nil || e.isClosed() || errors.As(err, &pe) {
			return ended(backendError(err)) // the server refused the LISTEN: not transient
		}
		select { // the listening connection was lost: make it again
		case <-lctx.Done():
			return ended(lctx.Err())
		case <-time.After(wait):
			wait = min(2*wait, 2*time.Second)
		}
	}
}
