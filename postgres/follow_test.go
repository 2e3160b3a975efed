package postgres

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// followed is one Queue.Follow in its own goroutine, its events handed to the test.
type followed struct {
	evs    chan events.Event
	done   chan error
	cancel context.CancelFunc
}

func startFollow(t *testing.T, q *work.Queue, from uint64) *followed {
	ctx, cancel := context.WithCancel(context.Background())
	f := &followed{evs: make(chan events.Event, 1<<12), done: make(chan error, 1), cancel: cancel}
	go func() {
		f.done <- q.Follow(ctx, from, func(ev events.Event) error { f.evs <- ev; return nil })
	}()
	t.Cleanup(cancel)
	return f
}

// take receives n events from f.
func (f *followed) take(t *testing.T, what string, n int) []events.Event {
	t.Helper()
	var out []events.Event
	deadline := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case ev := <-f.evs:
			out = append(out, ev)
		case err := <-f.done:
			t.Fatalf("%s: the follower ended after %d of %d events: %v", what, len(out), n, err)
		case <-deadline:
			t.Fatalf("%s: the follower handed out %d of %d events in 30 s", what, len(out), n)
		}
	}
	return out
}

func readAllEvents(t *testing.T, q *work.Queue) []events.Event {
	t.Helper()
	var out []events.Event
	if err := q.ReadLog(context.Background(), 0, func(ev events.Event) error { out = append(out, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// sameLog requires got to hold exactly want's sequences and types, in order.
func sameLog(t *testing.T, what string, got, want []events.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i].Head().Seq != want[i].Head().Seq || got[i].Type() != want[i].Type() {
			t.Fatalf("%s: event %d is seq %d %s, want seq %d %s", what, i,
				got[i].Head().Seq, got[i].Type(), want[i].Head().Seq, want[i].Type())
		}
	}
}

// A follower sees the commits of every queue sharing the schema (another postgres.Open, as
// another process would be), in sequence order, each once, as soon as they commit: it waits
// on the schema's LISTEN channel, not a timer.
func TestFollowSeesOtherQueuesCommits(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	qa, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	qb, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	if _, err := qa.Session("a").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	onA := startFollow(t, qa, 0)
	onB := startFollow(t, qb, 1)
	onA.take(t, "history on a", 1)
	onB.take(t, "history on b", 1)

	// Writers on both queues at once; each event once, in order, on both followers.
	const each = 15
	var wg sync.WaitGroup
	var failed atomic.Value
	for _, q := range []*work.Queue{qa, qb, qb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := q.Session("w").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(err)
	}
	all := readAllEvents(t, qa)
	if len(all) != 1+3*each {
		t.Fatalf("the log holds %d events, want %d", len(all), 1+3*each)
	}
	sameLog(t, "follower on a", onA.take(t, "live on a", 3*each), all[1:])
	sameLog(t, "follower on b", onB.take(t, "live on b", 3*each), all[1:])

	// One more commit of b alone reaches a's follower: only the notification can wake it.
	tk, err := qb.Session("b").Submit(ctx, work.TaskRequest{Kind: "marker"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := onA.take(t, "b's marker on a", 1)[0]; ev.(*events.TaskSubmitted).TaskID != tk.ID {
		t.Fatalf("a's follower handed out %s, want b's marker %s", ev.Type(), tk.ID)
	}
	onA.cancel()
	if err := <-onA.done; err != context.Canceled {
		t.Errorf("a canceled follower returned %v, want context.Canceled", err)
	}
}

// A group whose commit fails (its connection is lost before COMMIT) is rolled back: no
// follower, on this queue or another, ever hands out one of its events, and the next commit
// reaches them with the sequence the failed group would have taken.
func TestFollowNeverSeesAFailedGroup(t *testing.T) {
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	ctx := context.Background()
	other, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	here, there := startFollow(t, q, 0), startFollow(t, other, 0)
	here.take(t, "history here", 1)
	there.take(t, "history there", 1)

	var fired atomic.Int32
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(c *pgx.Conn) {
		if fired.Add(1) == 1 {
			dropConn(c) // the group's COMMIT never reaches the server
		}
	}
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "lost"}); !errors.Is(err, work.ErrBackend) {
		t.Fatalf("the submit of the failed group returned %v, want ErrBackend", err)
	}
	tracing(e).beforeCommit = nil
	e.ordinaryCommits = false
	after, err := s.Submit(ctx, work.TaskRequest{Kind: "after"})
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]*followed{"here": here, "there": there} {
		ev := f.take(t, "after the failed group, "+name, 1)[0]
		sub, ok := ev.(*events.TaskSubmitted)
		if !ok || sub.TaskID != after.ID || ev.Head().Seq != 2 {
			t.Fatalf("follower %s handed out seq %d %s (%+v), want seq 2, the submit after the failed group", name, ev.Head().Seq, ev.Type(), ev)
		}
	}
}

// storeFollower is a read-only Store following the log in its own goroutine (replay log
// --follow), its connections named app in pg_stat_activity, so that the test can find the
// server process of its listening connection.
func storeFollower(t *testing.T, dsn, app string) (*followed, *Store) {
	t.Helper()
	store, err := OpenReadOnly(context.Background(), withApp(t, dsn, app))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &followed{evs: make(chan events.Event, 1<<12), done: make(chan error, 1), cancel: cancel}
	go func() {
		f.done <- store.Follow(ctx, 0, func(ev events.Event) error { f.evs <- ev; return nil })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-f.done:
		case <-time.After(time.Minute):
			t.Error("the Store's follower did not end within a minute of its context")
		}
		store.Close()
	})
	return f, store
}

// listenerPID is the server process of the follower's listening connection, other than not;
// 0 when there is none: app's session that holds the listeners' shared advisory locks
// (listeners.go), or whose last statement was the LISTEN (before it took them). Not "its last
// statement was pgx's ping", as it was: the pool pings a connection idle for a second when it
// hands it out, so a read's connection matched too, and stopping it instead of the listener
// hung the follower's next read (1 run in 4 under load, once the listener's last statement
// was no longer its LISTEN).
func listenerPID(t *testing.T, admin *pgx.Conn, app string, not int32) int32 {
	t.Helper()
	var pid int32
	err := admin.QueryRow(context.Background(), `SELECT a.pid FROM pg_stat_activity a
		WHERE a.application_name = $1 AND a.pid <> $2 AND (a.query LIKE 'LISTEN %' OR EXISTS (
			SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.mode = 'ShareLock' AND l.granted))
		LIMIT 1`, app, not).Scan(&pid)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return pid
}

// Issue 25: a listening connection whose server process stops without the socket closing (a
// stuck or stopped backend; TCP keepalives are answered by the kernel) delivers nothing and
// fails nothing. Store.Follow used to wait on it forever, missing every commit; it now reads
// the log again after followRecheck of silence (the commit is handed out), and makes a new
// listener when the old one does not answer its ping. The listener's process is stopped
// with SIGSTOP: the commit's notification is queued for it and never sent.
func TestStoreFollowListenerStopped(t *testing.T) {
	dsn, s, admin := queueWithHistory(t)
	f, _ := storeFollower(t, dsn, "follow-stopped")
	f.take(t, "history", 1)
	stopListener(t, admin, "follow-stopped", s, f)
}

// A follower's recheck after silence keeps a listener that answers: the wait's timeout
// leaves the connection usable, the ping is answered on it, and the next commit's
// notification arrives on that same connection (followRecheck shortened to 50 ms, so that
// many rechecks run before the commit; the ping's bound is left at its 5 s, which a loaded
// machine's round trip stays under).
func TestStoreFollowQuietListenerKept(t *testing.T) {
	dsn, s, admin := queueWithHistory(t)
	ctx := context.Background()
	setFor(t, &followRecheck, 50*time.Millisecond)
	f, _ := storeFollower(t, dsn, "follow-quiet")
	f.take(t, "history", 1)
	var pid int32
	waitFor(t, time.Minute, "the listener to answer a recheck's ping", func() bool {
		var query string
		pid = listenerPID(t, admin, "follow-quiet", 0)
		err := admin.QueryRow(ctx, `SELECT query FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&query)
		return err == nil && query == "-- ping"
	})
	tk, err := s.Submit(ctx, work.TaskRequest{Kind: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := f.take(t, "a commit after the rechecks", 1)[0]; ev.(*events.TaskSubmitted).TaskID != tk.ID {
		t.Fatalf("the follower handed out %s, want the submit after the rechecks", ev.Type())
	}
	if now := listenerPID(t, admin, "follow-quiet", 0); now != pid {
		t.Errorf("the listener is server process %d, was %d: a listener that answered was replaced", now, pid)
	}
	select {
	case ev := <-f.evs:
		t.Errorf("the follower handed out seq %d twice or more", ev.Head().Seq)
	default:
	}
}

// Issue 25: the listener's server process is terminated (pg_terminate_backend, as an
// administrator or a restart does): it sends a FATAL error, a *PgError, before its socket
// closes. Store.Follow took that for a server refusing the LISTEN and ended with the error;
// it is a lost connection: the follower listens again, reads the log again, and goes on.
func TestStoreFollowListenerTerminated(t *testing.T) {
	dsn, s, admin := queueWithHistory(t)
	ctx := context.Background()
	f, _ := storeFollower(t, dsn, "follow-terminated")
	f.take(t, "history", 1)
	var old int32
	waitFor(t, time.Minute, "the follower's listener", func() bool {
		old = listenerPID(t, admin, "follow-terminated", 0)
		return old != 0
	})
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", old); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "a new listener", func() bool {
		select {
		case err := <-f.done:
			t.Fatalf("the follower ended when its listener was terminated: %v", err)
		default:
		}
		return listenerPID(t, admin, "follow-terminated", old) != 0
	})
	tk, err := s.Submit(ctx, work.TaskRequest{Kind: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := f.take(t, "a commit after the listener was terminated", 1)[0]; ev.(*events.TaskSubmitted).TaskID != tk.ID {
		t.Fatalf("the follower handed out %s, want the submit after the termination", ev.Type())
	}
}

// BenchmarkFollowLatency: a follower on one queue waits at the head; each op submits one task
// through a second postgres.Open on the same schema (another process, as far as the follower
// knows) and waits until the follower's fn has it: commit, NOTIFY, LISTEN, the follower's
// read. pgtest's server runs with fsync off: the figure compares designs, not disks.
func BenchmarkFollowLatency(b *testing.B) {
	dsn := pgtest.Schema(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reader, err := Open(ctx, dsn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer reader.Close()
	writer, err := Open(ctx, dsn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer writer.Close()
	got := make(chan time.Time, 1)
	go reader.Follow(ctx, 1, func(events.Event) error { got <- time.Now(); return nil })
	s := writer.Session("latency")
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-got).Sub(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "submit-to-follower-p50-µs")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds()), "submit-to-follower-p99-µs")
}

// Issue 25: the queue's own watcher (postgres.go watch), which wakes Queue.Follow, WaitTasks
// and the inbox of this process on the other processes' commits, waited on its listening
// connection without a bound, as Store.Follow did: with its server process stopped (the
// socket open, nothing delivered, nothing failing) a Queue.Follow of a process that does not
// write itself never saw another process's commit. It now wakes its waiters after
// followRecheck of silence and makes a new listener when the old one does not answer.
func TestQueueWatcherListenerStopped(t *testing.T) {
	// s writes, as another process's queue; reader only follows.
	dsn, s, admin := queueWithHistory(t)
	reader, err := Open(context.Background(), withApp(t, dsn, "watch-stopped"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	f := startFollow(t, reader, 0)
	f.take(t, "history", 1)
	stopListener(t, admin, "watch-stopped", s, f)
}

// stopListener stops the server process of app's listening connection with SIGSTOP (its
// socket stays open; a commit's notification is queued for it and never sent), then checks
// that f hands out a commit of s all the same, that a new listener is made, and that a
// commit after it reaches f.
func stopListener(t *testing.T, admin *pgx.Conn, app string, s *work.Session, f *followed) {
	t.Helper()
	ctx := context.Background()
	var stopped int32
	waitFor(t, time.Minute, "the listener, idle", func() bool {
		stopped = listenerPID(t, admin, app, 0)
		return stopped != 0 && stopIfIdle(t, admin, stopped)
	})

	tk, err := s.Submit(ctx, work.TaskRequest{Kind: "unheard"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := f.take(t, "a commit whose notification the stopped listener never sends", 1)[0]; ev.(*events.TaskSubmitted).TaskID != tk.ID {
		t.Fatalf("the follower handed out %s, want the unheard submit", ev.Type())
	}
	// The stopped listener does not answer its ping: a new one listens, and a commit's
	// notification reaches the follower again.
	waitFor(t, time.Minute, "a new listener", func() bool { return listenerPID(t, admin, app, stopped) != 0 })
	tk, err = s.Submit(ctx, work.TaskRequest{Kind: "heard"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := f.take(t, "a commit after the new listener", 1)[0]; ev.(*events.TaskSubmitted).TaskID != tk.ID {
		t.Fatalf("the follower handed out %s, want the heard submit", ev.Type())
	}
}

// queueWithHistory opens a queue on a schema of its own (closed at the test's end), submits
// one task of kind "before" in session "s", and returns the schema's DSN, that session and an
// administrator's connection: the history a follower's tests start from.
func queueWithHistory(t *testing.T) (string, *work.Session, *pgx.Conn) {
	t.Helper()
	dsn := pgtest.Schema(t)
	q, err := Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	s := q.Session("s")
	if _, err := s.Submit(context.Background(), work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	return dsn, s, connect(t, dsn)
}

// withApp is dsn with application_name set to app, so that the test finds the connections of
// that queue or store in pg_stat_activity.
func withApp(t *testing.T, dsn, app string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	v := u.Query()
	v.Set("application_name", app)
	u.RawQuery = v.Encode()
	return u.String()
}

// A follower's read of the log on a pooled connection whose server process stopped (the
// socket open, nothing answered) used to wait forever: Store.Follow's reads had no bound but
// the caller's context, which a follower keeps for its life. Every idle connection of the
// store's pool but the listener is stopped with SIGSTOP; the next commit's notification
// makes the follower read on one of them. It must give the read up after readStuckWait
// (shortened here), read again on a new connection, and hand the commit out.
func TestStoreFollowReadStopped(t *testing.T) {
	setFor(t, &readStuckWait, 2*time.Second) // before the engines are opened, which take it; a new connection, made and prepared, answers well within it
	dsn, s, admin := queueWithHistory(t)
	ctx := context.Background()
	const app = "follow-read-stopped"
	f, _ := storeFollower(t, dsn, app)
	f.take(t, "history", 1)
	var listener int32
	waitFor(t, time.Minute, "the follower's listener", func() bool {
		listener = listenerPID(t, admin, app, 0)
		return listener != 0
	})
	rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2`, app, listener)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	stopped := 0
	for _, pid := range pids {
		if stopIfIdle(t, admin, pid) {
			stopped++
		}
	}
	if stopped == 0 {
		t.Fatalf("no idle pooled connection of the store to stop (%d found)", len(pids))
	}
	tk, err := s.Submit(ctx, work.TaskRequest{Kind: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := f.take(t, "a commit read after a pooled connection stopped", 1)[0]; ev.(*events.TaskSubmitted).TaskID != tk.ID {
		t.Fatalf("the follower handed out %s, want the submit", ev.Type())
	}
	select {
	case ev := <-f.evs:
		t.Errorf("the follower handed out seq %d twice or more", ev.Head().Seq)
	default:
	}
}

// setFor sets *v to x for t: the old value comes back in a cleanup registered now, so after
// those registered later (a follower's end: cleanups run last first).
func setFor[T any](t *testing.T, v *T, x T) {
	was := *v
	*v = x
	t.Cleanup(func() { *v = was })
}

// stopIfIdle stops server process pid with SIGSTOP (its socket stays open: nothing it owes
// is sent) and reports whether it was idle, waiting for its client; one that was not is let
// go on at once. Only an idle one may stay stopped: a server process stopped inside a
// statement may hold a lightweight lock of the server's (a lock table partition, as when it
// takes or lets go its listener keys), and every other session needing it would wait too
// (stress run, 2026-12-05: the writer's Submit timed out after 30 s). Its state is read
// after the stop, which it can no longer change. A stopped process goes on when t ends.
func stopIfIdle(t *testing.T, admin *pgx.Conn, pid int32) bool {
	t.Helper()
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var state string
	err := admin.QueryRow(context.Background(), `SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		syscall.Kill(int(pid), syscall.SIGCONT)
		t.Fatal(err)
	}
	if state != "idle" {
		syscall.Kill(int(pid), syscall.SIGCONT)
		return false
	}
	t.Cleanup(func() { syscall.Kill(int(pid), syscall.SIGCONT) })
	return true
}
