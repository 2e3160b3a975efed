package postgres

import (
	"context"
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
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

// No waiter, no notification. A process whose watcher owns a slot holds its listener keys
// only while it has waiters (the queue's WaitTasks, WaitWakes, Follow, a runner with idle
// slots: engineapi.WaiterWatcher): a group of another process notifies it only then. With
// four processes' runners busy on one queue, every group paid a NOTIFY that woke three
// watchers whose processes had nobody waiting: 0.5 ms of a 3 ms commit batch
// (BenchmarkProcesses, 2026-12-05). The keys are let go once no waiter came for watchIdle
// and none waits (waiters.hold), and taken again when one comes (Waiting wakes the watcher;
// see waiters.wait). Nothing is missed: a waiter takes its signal's channel before it reads
// the state it waits on, and that is when the queue calls Waiting; if the keys were not held,
// the watcher takes them (waiting for every group that did not notify this process, as at a
// registration) and then signals Changed, so the waiter reads again and sees every commit
// those groups made. A waiter that came while they were held is seen by the release: held
// is cleared before waiting is asked, so a waiter either finds it cleared (and wakes the
// watcher) or is seen waiting (and the keys are kept). The cost of a waiter coming to a
// process that let its keys go: one statement on the listening connection before its
// read sees other processes' commits.

// watchIdle is how long no waiter must come before the watcher lets its listener keys go.
// A var for the tests.
var watchIdle = time.Second

// releaseListenSQL lets the listener keys a registration took go (the slot stays owned).
const releaseListenSQL = `SELECT pg_advisory_unlock_shared(k) FROM unnest($1::bigint[]) AS k`

// waiters is what the watcher knows of this process's waiters (No waiter, no notification).
type waiters struct {
	waiting atomic.Pointer[func() bool] // the queue's report (WatchWaiters); nil: always one
	calls   atomic.Int64                // Waiting's calls
	held    atomic.Bool                 // the watcher holds its listener keys
	came    chan struct{}               // (1) a waiter came while they were not held
}

// WatchWaiters is engineapi.WaiterWatcher's: waiting reports whether a waiter waits now.
func (e *engine) WatchWaiters(waiting func() bool) { e.waiters.waiting.Store(&waiting) }

// Waiting is engineapi.WaiterWatcher's: a waiter is about to read the state it waits on.
func (e *engine) Waiting() {
	w := &e.waiters
	w.calls.Add(1)
	if !w.held.Load() {
		select {
		case w.came <- struct{}{}:
		default:
		}
	}
}

func (w *waiters) anyWaiting() bool {
	f := w.waiting.Load()
	return f == nil || (*f)()
}

// idleSince is the start of the watcher's current stretch without a waiter coming.
type idleSince struct {
	at    time.Time
	calls int64
}

// start is the stretch of a new registration, which took the keys: the first hold lets them
// go at once unless a waiter waits or comes meanwhile (a process opened to submit, or one
// whose workers are busy, needs none).
func (w *waiters) start() *idleSince { return &idleSince{calls: w.calls.Load()} }

// hold runs before each of the watcher's waits on conn (registered, owning slot): it takes
// the listener keys when a waiter came or waits, and lets them go after watchIdle without
// one; w.held says which for the wait. An error is conn's or the server's (a lock not
// granted within lock_timeout): the caller makes the listener again, which closes conn and
// drops its locks.
func (w *waiters) hold(ctx context.Context, e *engine, conn *pgx.Conn, slot int, idle *idleSince) error {
	if !w.held.Load() {
		select {
		case <-w.came:
		default:
			if !w.anyWaiting() {
				return nil
			}
		}
		if err := execListener(ctx, conn, holdListenSQL, e.listenKeys.others(slot)); err != nil {
			return err
		}
		w.held.Store(true)
		*idle = idleSince{time.Now(), w.calls.Load()}
		e.signal() // every group that did not notify this process has committed: read again
		return nil
	}
	if time.Since(idle.at) < watchIdle {
		return nil
	}
	if calls := w.calls.Load(); calls != idle.calls {
		*idle = idleSince{time.Now(), calls}
		return nil
	}
	w.held.Store(false) // before waiting is asked: a waiter after it wakes the watcher
	if w.anyWaiting() {
		w.held.Store(true)
		*idle = idleSince{time.Now(), w.calls.Load()}
		return nil
	}
	return execListener(ctx, conn, releaseListenSQL, e.listenKeys.others(slot))
}

// execListener runs sql on a listening connection within listenerSetupWait (a server
// process that stops answering must not hold the watcher: see listenerSetupWait).
func execListener(ctx context.Context, conn *pgx.Conn, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, listenerSetupWait)
	defer cancel()
	_, err := conn.Exec(ctx, sql, args...)
	return err
}

// wait is the watcher's wait on conn for the next notification, until until (no
// notification, no error); without the listener keys held, a waiter's coming ends it too.
// An error is ctx's end or conn's.
func (w *waiters) wait(ctx context.Context, conn *pgx.Conn, held bool, until time.Time) (*pgconn.Notification, error) {
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	came := false
	if !held {
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			select {
			case <-w.came:
				came = true
				cancel()
			case <-stop:
			}
		}()
		defer func() {
			close(stop)
			<-done
			if came {
				select { // for hold
				case w.came <- struct{}{}:
				default:
				}
			}
		}()
	}
	n, err := conn.WaitForNotification(wctx)
	if err == nil || ctx.Err() != nil || conn.IsClosed() {
		return n, err
	}
	// The deadline or a waiter's coming: a wait's timeout leaves the connection usable
	// (pgx closes it only on other errors; see waitOrRecheck).
	if errors.Is(wctx.Err(), context.DeadlineExceeded) || errors.Is(wctx.Err(), context.Canceled) {
		return nil, nil
	}
	return nil, err
}

// listenSlots bounds the processes whose watchers own a slot; more run correctly, their
// writers notifying at every group. A watcher holds listenSlots-1 advisory locks, a
// follower listenSlots: entries of the server's shared lock table (sized by
// max_locks_per_transaction × max_connections, 6,400 by default).
const listenSlots = 32

// listenKeys are the advisory lock keys of the queue's listeners on channel: listener key i
// is listen+i, slot i's ownership key own+i. 63-bit hashes with their low bits cleared, so
// the keys of one queue are consecutive and positive.
type listenKeys struct{ listen, own int64 }

// others are the listener keys but slot's (every key: slot -1).
func (k listenKeys) others(slot int) []int64 {
	keys := make([]int64, 0, listenSlots)
	for i := range listenSlots {
		if i != slot {
			keys = append(keys, k.listen+int64(i))
		}
	}
	return keys
}

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

// listenerSetupWait bounds a listener's LISTEN and registration together, and each later
// statement that takes or lets go its keys (waiters.hold). A server process
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
	// A shared lock waits only for a group holding its key exclusively, until that group's
	// COMMIT; groups never wait for a listener's locks.
	if _, err := conn.Exec(ctx, holdListenSQL, e.listenKeys.others(slot)); err != nil {
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
