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
// head lock), and blocks on the connection until the next notification. A lost listening
// connection is made again (waits doubling from 50 ms to 2 s), and the log read again, since
// a notification may have been missed meanwhile — a terminated server process (its FATAL), a
// restart and a failed connect are all lost connections; a failed read ends it with the
// error, as does a server that answers the LISTEN with an ERROR.
//
// A listening connection can also stop delivering without failing: its server process
// stopped or stuck while the socket stays open (TCP keepalives are answered by the kernel),
// or, across a failover, a listener left on a server the writers no longer use. So a wait
// that hears nothing for followRecheck ends: the log is read again (a commit whose
// notification was lost is handed out then), and the listener must answer a ping within
// followPingWait, or it is made again. Only silence costs this; a follower that is woken
// more often never reaches it.
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
		conn, err := pgx.ConnectConfig(lctx, e.listenerConfig())
		if err == nil {
			_, err = e.startListening(lctx, conn, false) // every writer notifies it (listeners.go)
			if err != nil {
				refused := serverRefused(err, conn) // an ERROR answer, not a lost connection
				conn.Close(context.Background())
				if refused && ctx.Err() == nil && !e.isClosed() {
					return ended(backendError(err)) // the server refused the LISTEN: not transient
				}
			}
		}
		if err == nil {
			wait = 50 * time.Millisecond
			for err == nil {
				if rerr := read(); rerr != nil {
					conn.Close(context.Background())
					return ended(rerr) // a read that fails ends the follower, as ReadLog's caller sees it
				}
				_, err = waitOrRecheck(lctx, conn, followRecheck)
			}
			conn.Close(context.Background())
		}
		if ctx.Err() != nil || e.isClosed() {
			return ended(backendError(err))
		}
		// The listening connection was lost, or could not be made: make it again. Its server
		// process may have been terminated (pg_terminate_backend, a restart): the FATAL it
		// sends is a *PgError too, but of a connection that no longer exists.
		select {
		case <-lctx.Done():
			return ended(lctx.Err())
		case <-time.After(wait):
			wait = min(2*wait, 2*time.Second)
		}
	}
}

// followRecheck is how long a follower waits on its listening connection for a notification
// before it reads the log again and pings the listener (Follow). It bounds how late a commit
// whose notification was lost is handed out, and how long a listener that stopped answering
// is kept. 5 s is a sixth of the keepalives' bound on a vanished peer (about 30 s: open's
// dialer), so a stuck listener is noticed well before a dead network would be, and an idle
// follower costs the server one indexed read that finds nothing and one empty statement
// every 5 s, against a notification's one read per commit.
var followRecheck = 5 * time.Second

// followPingWait bounds the recheck's ping of the listener: a listener that does not answer
// within it is made again. As long as the recheck's interval, for the same reasons; a
// variable of its own so that a test may recheck often without taking a slow answer (a
// loaded machine) for a stuck listener.
var followPingWait = 5 * time.Second

// watchRecheck is followRecheck for the queue's own watcher (postgres.go watch), for the
// same reasons; a variable of its own, read by a watcher that runs from Open to Close, so
// that a test may shorten a follower's without racing the watcher.
var watchRecheck = 5 * time.Second

// waitOrRecheck waits on conn for the next notification and returns it. After recheck
// (followRecheck, watchRecheck) of silence it pings conn, bounded by followPingWait, and returns no
// notification and no error when conn answered: the caller reads the log again (Follow) or
// wakes its waiters (the queue's watcher). An error is ctx's end or a listener that failed
// or did not answer.
func waitOrRecheck(ctx context.Context, conn *pgx.Conn, recheck time.Duration) (*pgconn.Notification, error) {
	wctx, cancel := context.WithTimeout(ctx, recheck)
	n, err := conn.WaitForNotification(wctx)
	cancel()
	if err == nil || ctx.Err() != nil || !errors.Is(wctx.Err(), context.DeadlineExceeded) || conn.IsClosed() {
		return n, err
	}
	// Silence for followRecheck: a timeout leaves the connection usable (pgx closes it only
	// on other errors).
	return nil, pingListener(ctx, conn)
}

// pingListener pings a listening connection after a recheck's silence, bounded by
// followPingWait. A notification that arrives during the ping is kept by pgx and returned by
// the next wait.
func pingListener(ctx context.Context, conn *pgx.Conn) error {
	pctx, cancel := context.WithTimeout(ctx, followPingWait)
	defer cancel()
	return conn.Ping(pctx)
}
