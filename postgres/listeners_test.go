package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// bareListener is a connection in LISTEN on e's channel that holds none of the listener
// locks: it hears whatever the groups send, and counts it.
type bareListener struct {
	t    *testing.T
	conn *pgx.Conn
}

func newBareListener(t *testing.T, e *engine) *bareListener {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{e.channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return &bareListener{t, conn}
}

// heard counts the notifications that arrive until 300 ms pass without one.
func (l *bareListener) heard() int {
	n := 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := l.conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			if l.conn.IsClosed() {
				l.t.Fatalf("the listener's connection closed: %v", err)
			}
			return n
		}
		n++
	}
}

func submitN(t *testing.T, q *work.Queue, n int) {
	t.Helper()
	s := q.Session("s")
	for i := range n {
		if _, err := s.Submit(context.Background(), work.TaskRequest{Kind: "k", Input: []byte{'0' + byte(i%10)}}); err != nil {
			t.Fatal(err)
		}
	}
}

// withWaiters makes e's process one that always has a waiter (waiters.hold keeps its
// listener keys: TestNoWaiterNoNotification tests the release) and waits until it holds them.
func withWaiters(t *testing.T, e *engine) {
	t.Helper()
	e.WatchWaiters(func() bool { return true })
	e.Waiting()
	waitFor(t, 10*time.Second, "the watcher to hold its listener keys", func() bool { return e.waiters.held.Load() })
}

// wokenByCommit checks that a commit of q (another process's queue) wakes e's watcher by
// a notification: within 3 s, under watchRecheck.
func wokenByCommit(t *testing.T, e *engine, q *work.Queue, what string) {
	t.Helper()
	select {
	case <-e.Changed(): // the signal of its (re)connection, or of taking its keys
	default:
	}
	submitN(t, q, 1)
	select {
	case <-e.Changed():
	case <-time.After(3 * time.Second):
		t.Fatalf("%s did not wake on a commit", what)
	}
}

func waitSlot(t *testing.T, e *engine) int {
	t.Helper()
	waitFor(t, 10*time.Second, "the watcher to own a slot", func() bool { return e.watcherSlot.Load() >= 0 })
	return int(e.watcherSlot.Load())
}

// TestGroupsNotifyOnlyOtherListeners (listeners.go): a writer alone on its queue sends no
// notification (its own watcher is the only listener); it sends one a group once a follower
// listens, and once another process's watcher does (each process owning its own slot).
func TestGroupsNotifyOnlyOtherListeners(t *testing.T) {
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	waitSlot(t, e)
	bare := newBareListener(t, e)
	submitN(t, q, 3)
	if n := bare.heard(); n != 0 {
		t.Fatalf("a writer alone on its queue sent %d notifications for 3 groups, want 0", n)
	}

	// A follower: it holds every listener key.
	ctx := context.Background()
	follower, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	if slot, err := e.registerListener(ctx, follower, false); err != nil || slot != -1 {
		t.Fatalf("a follower's registration: slot %d, %v; want -1, nil", slot, err)
	}
	submitN(t, q, 3)
	if n := bare.heard(); n != 3 {
		t.Fatalf("with a follower listening, 3 groups sent %d notifications, want 3", n)
	}
	// Its listener keys are session locks, released when its server process ends, which
	// comes after Close returns: until then the next group still sees a listener (CI, once:
	// "2 groups sent 1 notifications").
	pid := follower.PgConn().PID()
	follower.Close(ctx)
	waitFor(t, 10*time.Second, "the follower's server process to end", func() bool {
		var gone bool
		err := e.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int32(pid)).Scan(&gone)
		return err == nil && gone
	})
	submitN(t, q, 2)
	if n := bare.heard(); n != 0 {
		t.Fatalf("after the follower left, 2 groups sent %d notifications, want 0", n)
	}

	// Another process on the same queue: each notifies the other, in a slot of its own.
	e2, q2 := openEngine(t, dsn, nil)
	if s1, s2 := waitSlot(t, e), waitSlot(t, e2); s1 == s2 {
		t.Fatalf("two processes' watchers own the same slot %d", s1)
	}
	withWaiters(t, e)
	withWaiters(t, e2)
	submitN(t, q, 3)
	if n := bare.heard(); n != 3 {
		t.Fatalf("with another process listening, 3 groups sent %d notifications, want 3", n)
	}
	submitN(t, q2, 2)
	if n := bare.heard(); n != 2 {
		t.Fatalf("the other process's 2 groups sent %d notifications, want 2", n)
	}
	mustVerify(t, q)
}

// TestWriterWithoutSlotNotifiesEveryGroup: when every slot is owned (more processes than
// listenSlots), a process's watcher goes without one and its writer notifies at every group.
func TestWriterWithoutSlotNotifiesEveryGroup(t *testing.T) {
	dsn := pgtest.Schema(t)
	e0, _ := openEngine(t, dsn, nil) // for the channel and the keys, and a first slot
	waitSlot(t, e0)
	ctx := context.Background()
	hog, err := pgx.ConnectConfig(ctx, e0.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close(ctx)
	for s := range listenSlots {
		if _, err := hog.Exec(ctx, `SELECT pg_try_advisory_lock($1)`, e0.listenKeys.own+int64(s)); err != nil {
			t.Fatal(err)
		}
	}
	e, q := openEngine(t, dsn, nil)
	key := e0.listenKeys.listen + int64(e0.watcherSlot.Load()) // held by listeners other than e0's watcher
	waitFor(t, 10*time.Second, "the watcher to listen", func() bool {
		var n int
		err := e0.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid`, key).Scan(&n)
		return err == nil && n == 1
	})
	bare := newBareListener(t, e)
	submitN(t, q, 3)
	if s := e.watcherSlot.Load(); s != -1 {
		t.Fatalf("a watcher found slot %d free, every one was taken", s)
	}
	if n := bare.heard(); n != 3 {
		t.Fatalf("a writer without a slot sent %d notifications for 3 groups, want 3", n)
	}
}

// TestListenerWaitsForAGroupThatDidNotNotifyIt: a listener's registration returns only once a
// group that took its process's key (and so sent no notification) has committed, so its
// first read sees that group.
func TestListenerWaitsForAGroupThatDidNotNotifyIt(t *testing.T) {
	e, _ := openEngine(t, pgtest.Schema(t), nil)
	slot := waitSlot(t, e)
	ctx := context.Background()
	group, err := e.pool.Begin(ctx) // as a group of slot's process, between its try and its COMMIT
	if err != nil {
		t.Fatal(err)
	}
	var took bool
	if err := group.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, e.listenKeys.listen+int64(slot)).Scan(&took); err != nil || !took {
		t.Fatalf("the group's try: %v, %v; want true (no other listener)", took, err)
	}
	listener, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	registered := make(chan error, 1)
	go func() {
		_, err := e.registerListener(ctx, listener, false)
		registered <- err
	}()
	select {
	case err := <-registered:
		t.Fatalf("the registration returned (%v) while a group that did not notify it was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := group.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-registered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the registration did not return after the group committed")
	}
}

// TestListenerLockedOutListensUnregistered: a listener that cannot take its locks (here a
// session holds a listener key exclusively, as only another program's advisory lock on the
// same key could) listens without them after listenerLockWait instead of waiting for them
// forever: another process's watcher then wakes on this one's commits, and a follower hands
// them out. Before the bound, both waited in their registration for as long as the key was
// held: the watcher never woke its waiters, the follower never read.
func TestListenerLockedOutListensUnregistered(t *testing.T) {
	was := listenerLockWait
	listenerLockWait = 200 * time.Millisecond
	t.Cleanup(func() { listenerLockWait = was })
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	slot := waitSlot(t, e)
	ctx := context.Background()
	hog, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close(ctx)
	// Key slot: no listener of this queue holds it yet (e's watcher leaves its own out).
	if _, err := hog.Exec(ctx, `SELECT pg_advisory_lock($1)`, e.listenKeys.listen+int64(slot)); err != nil {
		t.Fatal(err)
	}

	e2, _ := openEngine(t, dsn, nil)
	time.Sleep(5 * listenerLockWait) // its watcher's registration gives up
	wokenByCommit(t, e2, q, "another process's watcher locked out of its locks")
	if s := e2.watcherSlot.Load(); s != -1 {
		t.Errorf("a watcher without its locks owns slot %d, want none (its writer notifies every group)", s)
	}

	f, _ := storeFollower(t, dsn, "follow-locked-out")
	f.take(t, "history", 1)
	submitN(t, q, 1)
	f.take(t, "a commit after the follower was locked out of its locks", 1)
}

// TestListenerStoppedInItsRegistration: a listener whose server process stops while it
// registers (here: it waits for a listener key a session holds, and is stopped with SIGSTOP;
// the socket stays open, nothing answers) is made again after listenerSetupWait, for the
// queue's watcher and for a follower. Before the bound, both waited in that statement
// forever: the watcher woke no waiter, the follower handed out nothing (CI, 2026-12-04:
// TestQueueWatcherListenerStopped stopped a watcher between its LISTEN and its locks).
func TestListenerStoppedInItsRegistration(t *testing.T) {
	wasLock, wasSetup := listenerLockWait, listenerSetupWait
	listenerLockWait = time.Minute // the server's lock_timeout does not end the wait first
	listenerSetupWait = time.Second
	t.Cleanup(func() { listenerLockWait, listenerSetupWait = wasLock, wasSetup })
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	slot := waitSlot(t, e)
	ctx := context.Background()
	admin := connect(t, dsn)

	// stopInRegistration holds key slot (no listener of this queue holds it yet: e's watcher
	// leaves its own out), starts app's listener, waits until it waits for that key, stops its
	// server process and lets the key go.
	stopInRegistration := func(t *testing.T, app string, start func()) {
		t.Helper()
		hog := connect(t, dsn)
		if _, err := hog.Exec(ctx, `SELECT pg_advisory_lock($1)`, e.listenKeys.listen+int64(slot)); err != nil {
			t.Fatal(err)
		}
		start()
		var pid int32
		waitFor(t, time.Minute, "a listener waiting for its locks", func() bool {
			err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock' AND query = $2`, app, holdListenSQL).Scan(&pid)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
			return err == nil
		})
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(int(pid), syscall.SIGCONT) })
		if _, err := hog.Exec(ctx, `SELECT pg_advisory_unlock($1)`, e.listenKeys.listen+int64(slot)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("watcher", func(t *testing.T) {
		var e2 *engine
		stopInRegistration(t, "watch-stopped-registering", func() {
			e2, _ = openEngine(t, withApp(t, dsn, "watch-stopped-registering"), nil)
		})
		waitSlot(t, e2) // a new listener registered
		withWaiters(t, e2)
		wokenByCommit(t, e2, q, "a watcher made again after a listener stopped in its registration")
	})
	t.Run("follower", func(t *testing.T) {
		var f *followed
		stopInRegistration(t, "follow-stopped-registering", func() {
			f, _ = storeFollower(t, dsn, "follow-stopped-registering")
		})
		submitN(t, q, 1)
		f.take(t, "the log, after a listener stopped in its registration", 2) // the watcher's submit and this one
	})
}

// TestNoWaiterNoNotification (listeners.go, "No waiter, no notification"): a process with no
// waiter lets its listener keys go, and the other process's groups then send no
// notification; a waiter coming takes them again, and learns of a commit made while they
// were not held: the commit of a group that had already skipped its notification (held open
// past its try here) is waited for before the keys are taken, and the waiters are signaled
// after. watchRecheck is 30 s: a waiter that learned of it only from the recheck would be too
// late.
func TestNoWaiterNoNotification(t *testing.T) {
	wasIdle, wasRecheck := watchIdle, watchRecheck
	watchIdle, watchRecheck = 100*time.Millisecond, 30*time.Second
	t.Cleanup(func() { watchIdle, watchRecheck = wasIdle, wasRecheck })
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	e2, q2 := openEngine(t, dsn, nil)
	waitSlot(t, e)
	waitSlot(t, e2)
	waitFor(t, 10*time.Second, "both processes to let their listener keys go", func() bool {
		return !e.waiters.held.Load() && !e2.waiters.held.Load()
	})
	bare := newBareListener(t, e)
	submitN(t, q, 3)
	submitN(t, q2, 2)
	if n := bare.heard(); n != 0 {
		t.Fatalf("with no waiter in either process, 5 groups sent %d notifications, want 0", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before the queues close: the waiters end quietly
	// awaited waits in q2, as a worker does (WaitTasks may return early: it then reads
	// again), until a task of kind is pending, and reports how long that took.
	type result struct {
		d   time.Duration
		err error
	}
	awaited := func(kind string) chan result {
		out := make(chan result, 1)
		go func() {
			start := time.Now()
			for {
				st, err := q2.Stats(ctx)
				if err != nil {
					out <- result{err: err}
					return
				}
				for _, k := range st.Kinds {
					if k.Kind == kind && k.Pending > 0 {
						out <- result{d: time.Since(start)}
						return
					}
				}
				if err := q2.WaitTasks(ctx, []string{kind}); err != nil {
					out <- result{err: err}
					return
				}
			}
		}()
		return out
	}
	learned := func(what string, got chan result) time.Duration {
		t.Helper()
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("%s: %v", what, r.err)
			}
			return r.d
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not learned in 10 s", what)
			return 0
		}
	}

	// A group of q's that took its key (no listener held it) and has not committed yet: it
	// sleeps before its COMMIT. A waiter of q2 comes meanwhile, reads nothing, and waits.
	var slow atomic.Bool
	slow.Store(true)
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).commitBatch = func(b *pgx.Batch) {
		if slow.CompareAndSwap(true, false) { // the next group's only
			last := len(b.QueuedQueries) - 1 // COMMIT
			sleep := &pgx.QueuedQuery{SQL: "SELECT pg_sleep(1)"}
			b.QueuedQueries = append(b.QueuedQueries[:last], sleep, b.QueuedQueries[last])
		}
	}
	submitted := make(chan error, 1)
	go func() {
		_, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "awaited"})
		submitted <- err
	}()
	admin := connect(t, dsn)
	waitFor(t, 10*time.Second, "the group to sleep before its COMMIT", func() bool {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(1)'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	learned("a commit made while the waiting process did not hold its listener keys", awaited("awaited"))
	if err := <-submitted; err != nil {
		t.Fatal(err)
	}
	if n := bare.heard(); n != 0 {
		t.Errorf("the group that took its key sent %d notifications, want 0", n)
	}

	// While a waiter waits, the other process's groups notify it.
	later := awaited("later")
	waitFor(t, 10*time.Second, "the waiting process to hold its listener keys", func() bool { return e2.waiters.held.Load() })
	time.Sleep(3 * watchIdle) // still held: a waiter waits
	submitN(t, q, 1)          // kind "k"
	if n := bare.heard(); n != 1 {
		t.Errorf("with a waiter in the other process, a group sent %d notifications, want 1", n)
	}
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "later"}); err != nil {
		t.Fatal(err)
	}
	if d := learned("a commit while the waiter waits", later); d > 5*time.Second {
		t.Errorf("learned after %v", d)
	}
}
