package postgres

import (
	"context"
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A writing group notifies the queue's channel only when a listener of another process (or a
// follower, of any process) would hear it. A NOTIFY is not free: the server queues it,
// signals every listening backend, each wakes and forwards it, and the listening process
// wakes to read it. A queue's own watcher has no use for its own writer's notifications (the
// work layer signals this process's commits itself: work/wait.go), so a process alone on its
// queue paid all of that for nothing at every commit: 15–20% of a keyed submit from one
// goroutine (BenchmarkKeyedSubmit, 2026-12-04).
//
// The listeners say so with advisory locks, which any role may take and which the server
// drops with their connection (a crashed process's included): no table, nothing stale.
// There are listenSlots listener keys. A process's watcher owns a slot (a session lock on
// that slot's ownership key, so no two processes share one) and holds, on its listening
// connection, a shared lock on every listener key but its own slot's; a follower (Follow)
// holds every listener key. A group of the process owning slot s then sends its NOTIFY only
// when pg_try_advisory_xact_lock on key s fails, that is when some other listener holds it:
// one lock table probe, no scan. (Reading pg_locks for the same answer cost more than the
// NOTIFY it saved: measured.) A process whose watcher has no slot (none free, or not
// listening yet) notifies at every group, as before.
//
// Nothing is missed in between. A listener LISTENs before it takes its locks, so a group
// whose try fails notifies a listener already listening. A group whose try succeeded holds
// key s exclusively until its COMMIT, and a listener taking key s waits for that COMMIT: so
// when registerListener returns, every group that did not notify this listener has
// committed, and the listener's first read sees it.
//
// One case is not covered: when a process's watcher connection dies without the process
// noticing yet (a server process gone while its socket stays open: the recheck finds it,
// watchRecheck + followPingWait), its slot is free on the server and another process may take
// it; until the first process's watcher notices, its groups do not notify that process,
// whose waiters fall back to their own recheck. A listener of an older version (no locks)
// hears only the groups of writers without a slot.
//
// A listener whose locks the server refuses (its shared lock table full) or keeps waiting
// longer than listenerLockWait (a session holding a listener key exclusively: a group holds
// one for milliseconds, so only another program's advisory lock on the same 63-bit key
// could) listens without them rather than not at all: the writers with a slot may not notify
// it, and its waiters fall back to the recheck, as with a lost notification
// (TestListenerLockedOutListensUnregistered).

// listenSlots bounds the processes whose watchers own a slot; more run correctly, their
// writers notifying at every group. A watcher holds listenSlots-1 advisory locks, a
// follower listenSlots: entries of the server's shared lock table (sized by
// max_locks_per_transaction × max_connections, 6,400 by default).
const listenSlots = 32

// listenKeys are the advisory lock keys of the queue's listeners on channel: listener key i
// is listen+i, slot i's ownership key own+i. 63-bit hashes with their low bits cleared, so
// the keys of one queue are consecutive and positive.
type listenKeys struct{ listen, own int64 }

func newListenKeys(channel string) listenKeys {
	key := func(what string) int64 {
		h := fnv.New64a()
		h.Write([]byte("worklog " + what + " " + channel))
		return int64(h.Sum64()&math.MaxInt64) &^ (listenSlots - 1)
	}
	return listenKeys{listen: key("listener"), own: key("listener slot")}
}

// notifyAll is a group's NOTIFY for every listener; notifyOthers sends it only when another
// listener holds $2, the listener key of this process's slot.
const (
	notifyAll    = `SELECT pg_notify($1, '')`
	notifyOthers = `SELECT pg_notify($1, '') WHERE NOT pg_try_advisory_xact_lock($2::bigint)`
)

// The listener's registration statements (registerListener), on its own connection.
const (
	takeSlotSQL   = `SELECT pg_try_advisory_lock($1)`
	holdListenSQL = `SELECT pg_advisory_lock_shared(k) FROM unnest($1::bigint[]) AS k`
)

// listenerLockWait bounds a listener's wait for its locks (the listening connection's
// lock_timeout). A var for the test that waits it out.
var listenerLockWait = 5 * time.Second

// listenerConfig is the configuration of a listening connection: the pool's, with
// lock_timeout set (sent at connect: no statement of its own).
func (e *engine) listenerConfig() *pgx.ConnConfig {
	c := e.pool.Config().ConnConfig.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(listenerLockWait.Milliseconds(), 1), 10)
	return c
}

// serverRefused reports an ERROR answer on a connection that is still open: the statement
// failed, the connection did not.
func serverRefused(err error, conn *pgx.Conn) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && !conn.IsClosed()
}

// queueNotify queues the group's notification into b.
func (e *engine) queueNotify(b *pgx.Batch) {
	if s := e.watcherSlot.Load(); s >= 0 {
		b.Queue(notifyOthers, e.channel, e.listenKeys.listen+int64(s))
		return
	}
	b.Queue(notifyAll, e.channel)
}

// listenerSetupWait bounds a listener's LISTEN and registration together. A server process
// that stops answering with its socket open (a stuck or stopped backend: TCP keepalives are
// answered by the kernel) would otherwise hold the watcher or the follower in that statement
// forever, before the loop whose recheck finds such a listener (waitOrRecheck): the queue's
// waiters and followers would miss every other process's commit for as long. Past the
// bound, the connection is closed and the listener made again. Longer than
// listenerLockWait, so that a registration the server answers (its lock_timeout) is not cut
// first; a var for the test that stops a listener in its registration.
var listenerSetupWait = 10 * time.Second

// startListening puts conn in LISTEN on the queue's channel and registers it
// (registerListener), within listenerSetupWait. An error is the LISTEN's (an ERROR answer of
// the server on a connection still open is its refusal), or conn's: the caller makes the
// listener again.
func (e *engine) startListening(ctx context.Context, conn *pgx.Conn, own bool) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, listenerSetupWait)
	defer cancel()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{e.channel}.Sanitize()); err != nil {
		return -1, err
	}
	return e.registerListener(ctx, conn, own)
}

// registerListener makes conn, already in LISTEN on the queue's channel, a listener the
// writers notify, and returns once every group that will not notify it has committed (see
// above). own: take a slot for this process's writer (the watcher), and return it (-1: none
// free); else hold every listener key (a follower). An error is conn's: the caller makes the
// listener again; a refusal of the server is no error: conn then listens without the locks
// (slot -1; see above).
func (e *engine) registerListener(ctx context.Context, conn *pgx.Conn, own bool) (int, error) {
	slot := -1
	if own {
		start := rand.IntN(listenSlots)
		for i := range listenSlots {
			s := (start + i) % listenSlots
			var ok bool
			if err := conn.QueryRow(ctx, takeSlotSQL, e.listenKeys.own+int64(s)).Scan(&ok); err != nil {
				return -1, unlessRefused(err, conn)
			}
			if ok {
				slot = s
				break
			}
		}
	}
	keys := make([]int64, 0, listenSlots)
	for i := range listenSlots {
		if i != slot {
			keys = append(keys, e.listenKeys.listen+int64(i))
		}
	}
	// A shared lock waits only for a group holding its key exclusively, until that group's
	// COMMIT; groups never wait for a listener's locks.
	if _, err := conn.Exec(ctx, holdListenSQL, keys); err != nil {
		return -1, unlessRefused(err, conn) // a slot taken stays unused until conn closes
	}
	return slot, nil
}

// unlessRefused is err, or nil when it is the server's refusal on a connection still open.
func unlessRefused(err error, conn *pgx.Conn) error {
	if serverRefused(err, conn) {
		return nil
	}
	return err
}
