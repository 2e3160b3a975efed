package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// openEngine opens a queue on dsn and returns its engine too, for its tracer and counters.
func openEngine(t testing.TB, dsn string, opts *Options) (*engine, *work.Queue) {
	t.Helper()
	o := opts.withDefaults()
	e, err := open(context.Background(), dsn, o, false)
	if err != nil {
		t.Fatal(err)
	}
	e.startWriter()
	q := engineapi.NewQueue(e, engineapi.Config{}).(*work.Queue)
	t.Cleanup(func() { q.Close() })
	return e, q
}

// dropConn closes the client side of the connection: a dropped network connection.
func dropConn(c *pgx.Conn) { c.PgConn().Conn().Close() }

func logLen(t *testing.T, q *work.Queue) int {
	t.Helper()
	n := 0
	if err := q.ReadLog(context.Background(), 0, func(events.Event) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustVerify(t *testing.T, q *work.Queue) {
	t.Helper()
	if err := q.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A connection lost before the group's COMMIT reached the server: every caller of the group
// gets ErrBackend, nothing of the group is stored, and the next call reconnects.
func TestConnectionLostBeforeCommit(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	// Hold the writer in the hook until several submits are queued, so they share the group.
	var fired atomic.Int32
	release := make(chan struct{})
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(c *pgx.Conn) {
		if fired.Add(1) == 1 {
			<-release
			dropConn(c)
		}
	}
	const n = 8
	errs := make(chan error, n+1)
	go func() { _, err := s.Submit(ctx, work.TaskRequest{Kind: "lost"}); errs <- err }()
	for fired.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _, err := s.Submit(ctx, work.TaskRequest{Kind: "lost"}); errs <- err }()
	}
	time.Sleep(50 * time.Millisecond) // the n submits queue behind the held group
	close(release)
	wg.Wait()
	failed := 0
	for i := 0; i < n+1; i++ {
		err := <-errs
		switch {
		case err == nil:
		case errors.Is(err, work.ErrBackend):
			failed++
		default:
			t.Errorf("submit: %v, want nil or ErrBackend", err)
		}
	}
	if failed == 0 {
		t.Fatal("no submit failed with the dropped connection")
	}
	tracing(e).beforeCommit = nil
	e.ordinaryCommits = false
	// Every acknowledged submit is stored, and only those: the log has the first task and
	// one event per submit that succeeded.
	if got, want := logLen(t, q), 1+(n+1-failed); got != want {
		t.Errorf("log has %d events, want %d (%d submits failed)", got, want, failed)
	}
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "after"}); err != nil {
		t.Fatalf("submit after the lost connection: %v", err)
	}
	mustVerify(t, q)
}

// A connection lost after the COMMIT was sent: the writer asks the server what became of
// the transaction (pg_xact_status) and reports the commit as the success it was.
func TestConnectionLostDuringCommitThatCommitted(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	var fired atomic.Int32
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).afterCommitSent = func(c *pgx.Conn) {
		if fired.Add(1) == 1 {
			time.Sleep(300 * time.Millisecond) // the server receives and commits it
			dropConn(c)
		}
	}
	task, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "committed", IdempotencyKey: "k"})
	if err != nil {
		t.Fatalf("a submit whose COMMIT succeeded but whose answer was lost: %v", err)
	}
	if fired.Load() == 0 {
		t.Fatal("the hook did not run")
	}
	tracing(e).afterCommitSent = nil
	e.ordinaryCommits = false
	got, found, err := q.Session("s").Task(ctx, task.ID)
	if err != nil && strings.Contains(err.Error(), "use of closed network connection") {
		// When pgx had read COMMIT's answer before the hook closed the socket, the writer
		// saw a success and gave the connection back to the pool, whose next user finds
		// the socket closed under pgx: an artefact of closing it from outside, once.
		got, found, err = q.Session("s").Task(ctx, task.ID)
	}
	if err != nil || !found || got.Kind != "committed" {
		t.Fatalf("Task after the lost answer = %+v, %v, %v", got, found, err)
	}
	if n := logLen(t, q); n != 1 {
		t.Errorf("log has %d events, want 1", n)
	}
	mustVerify(t, q)
}

// A commit whose outcome the server cannot tell within CommitResolveTimeout is ErrBackend
// wrapping ErrCommitUnknown, never a success nor a plain failure. Here the network to the
// server is cut (new connections fail: pgx's cancel request for the lost query cannot reach
// the server either) while the transaction waits on the server for a lock another
// connection holds, so it stays in progress.
func TestCommitOutcomeUnknown(t *testing.T) {
	dsn := pgtest.Schema(t)
	var cut atomic.Bool
	testConfigHook = func(c *pgxpool.Config) {
		d := &net.Dialer{}
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if cut.Load() {
				return nil, errors.New("test: network cut")
			}
			return d.DialContext(ctx, network, addr)
		}
	}
	defer func() { testConfigHook = nil }()
	e, q := openEngine(t, dsn, &Options{CommitResolveTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "first"}); err != nil {
		t.Fatal(err)
	}
	// A row only the group's INSERT of its events waits for: the blocker's uncommitted event
	// at the next seq, whose unique check the INSERT waits on while it executes. (A table
	// lock was used before, but the parse of an INSERT takes the table's lock too: a pool
	// connection new to the statement then failed in pgx's prepare round trip, before COMMIT
	// was sent, as the inbox's reads made such connections likelier.)
	blocker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	if _, err := blocker.Exec(ctx, `BEGIN; INSERT INTO events (seq, session, type, body, subject)
		SELECT coalesce(max(seq), 0) + 1, '\x', 1, '\x', '\x' FROM events`); err != nil {
		t.Fatal(err)
	}
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).afterCommitSent = func(c *pgx.Conn) {
		time.Sleep(50 * time.Millisecond)
		cut.Store(true)
		dropConn(c)
	}
	_, err = q.Session("s").Submit(ctx, work.TaskRequest{Kind: "unknown"})
	tracing(e).afterCommitSent = nil
	e.ordinaryCommits = false
	cut.Store(false)
	if !errors.Is(err, work.ErrBackend) || !errors.Is(err, ErrCommitUnknown) {
		t.Fatalf("submit = %v, want ErrBackend wrapping ErrCommitUnknown", err)
	}
	// The server kills the orphaned transaction (it never gets to COMMIT, or commits: either
	// way the queue goes on and what it stored is consistent).
	blocker.Exec(ctx, "ROLLBACK")
	blocker.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()")
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "after"}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, q)
}

// The server restarts (an immediate shutdown: every server process killed, recovery from
// the WAL) while workers submit, claim and finish. Calls fail only with ErrBackend; every
// acknowledged submit and finish is there afterwards; the queue reconnects by itself.
func TestServerRestartUnderLoad(t *testing.T) {
	srv := pgtest.Need(t)
	if !srv.Owned() {
		t.Skip("the server was not started by this test binary")
	}
	_, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")

	var mu sync.Mutex
	acked := map[string]bool{}    // task ids whose submit was acknowledged
	finished := map[string]bool{} // ... and whose finish was
	var okAfter atomic.Int32
	var restarted atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad []error
	fail := func(err error) {
		mu.Lock()
		bad = append(bad, err)
		mu.Unlock()
	}
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				task, err := s.Submit(ctx, work.TaskRequest{Kind: "load", IdempotencyKey: fmt.Sprintf("%d-%d", w, i)})
				if err != nil {
					if !errors.Is(err, work.ErrBackend) {
						fail(err)
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				mu.Lock()
				acked[task.ID] = true
				mu.Unlock()
				ds, err := q.ClaimDue(ctx, time.Minute, 1)
				if err != nil {
					if !errors.Is(err, work.ErrBackend) {
						fail(err)
					}
					continue
				}
				for _, d := range ds {
					if _, err := q.Finish(ctx, d, work.Success(nil)); err == nil {
						mu.Lock()
						finished[d.Task.ID] = true
						mu.Unlock()
						if restarted.Load() {
							okAfter.Add(1)
						}
					} else if !errors.Is(err, work.ErrBackend) {
						fail(err)
					}
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := srv.StopServer("immediate"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	restarted.Store(true)
	deadline := time.Now().Add(20 * time.Second)
	for okAfter.Load() < 20 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if n := okAfter.Load(); n < 20 {
		t.Fatalf("only %d finishes succeeded after the restart: the queue did not reconnect", n)
	}
	for _, err := range bad {
		t.Errorf("a call failed with %v, want ErrBackend", err)
	}
	for id := range acked {
		task, found, err := s.Task(ctx, id)
		if err != nil || !found {
			t.Fatalf("acknowledged task %s: found %v, %v", id, found, err)
		}
		if finished[id] && task.State != work.TaskSucceeded {
			t.Errorf("task %s: finish acknowledged, state %s", id, task.State)
		}
	}
	t.Logf("%d submits and %d finishes acknowledged, %d finishes after the restart", len(acked), len(finished), okAfter.Load())
	mustVerify(t, q)
}
