package postgres

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// These tests are about what the writer answers when the connection of a group's COMMIT
// fails: never a success for a group that did not commit (issue 27 item 1), never a failure
// or a re-run for one that did (item 2).

func connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cuttableNetwork makes the pools opened while it is installed fail to connect while cut is
// set: the queue cannot reach the server, other clients can.
func cuttableNetwork(t *testing.T, cut *atomic.Bool) {
	d := &net.Dialer{}
	testConfigHook = func(c *pgxpool.Config) {
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if cut.Load() {
				return nil, errors.New("test: network cut")
			}
			return d.DialContext(ctx, network, addr)
		}
	}
	t.Cleanup(func() { testConfigHook = nil })
}

// kindCounts counts session s's tasks by kind.
func kindCounts(t *testing.T, s *work.Session) map[string]int {
	t.Helper()
	n := map[string]int{}
	after := ""
	for {
		ts, err := s.Tasks(context.Background(), work.TaskFilter{After: after, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range ts {
			n[task.Kind]++
		}
		if len(ts) < 500 {
			return n
		}
		after = ts[len(ts)-1].ID
	}
}

type submitResult struct {
	task work.Task
	err  error
}

// Issue 27 item 1. The server is killed while a group waits for a lock inside its commit
// batch: its transaction had an id but none of its WAL reached the disk, so the restarted
// server hands the same id to the next transaction, which commits. pg_xact_status(id) then
// says "committed" about a transaction that never did. The writer must not answer success:
// the task does not exist. (When the server happened to write the lost transaction's WAL,
// its id is not reused: in about half the rounds here, for reasons not pinned down. The
// round is repeated, up to five times.)
func TestLostCommitWhoseTransactionIDIsReused(t *testing.T) {
	srv := pgtest.Need(t)
	if !srv.Owned() {
		t.Skip("the server was not started by this test binary")
	}
	dsn := pgtest.Schema(t)
	var cut atomic.Bool
	cuttableNetwork(t, &cut)
	e, q := openEngine(t, dsn, &Options{CommitResolveTimeout: 3 * time.Minute})
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "first"}); err != nil {
		t.Fatal(err)
	}
	for round := 1; ; round++ {
		xid, reused := lostCommitRound(t, srv, e, s, dsn, &cut, round)
		if reused {
			break
		}
		t.Logf("round %d: the lost transaction's WAL reached the disk after all: id %d not reused", round, xid)
		if round == 5 {
			t.Log("the transaction id was never reused: this run checked less than it should")
			break
		}
	}
	mustVerify(t, q)
}

func lostCommitRound(t *testing.T, srv *pgtest.Server, e *engine, s *work.Session, dsn string, cut *atomic.Bool, round int) (int64, bool) {
	ctx := context.Background()
	blocker := connect(t, dsn)
	if _, err := blocker.Exec(ctx, "BEGIN; LOCK TABLE events IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	pids := make(chan uint32, 1)
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(c *pgx.Conn) {
		select {
		case pids <- c.PgConn().PID():
		default:
		}
	}
	defer func() { tracing(e).beforeCommit = nil; e.ordinaryCommits = false }()
	kind := fmt.Sprintf("lost-%d", round)
	res := make(chan submitResult, 1)
	go func() {
		task, err := s.Submit(ctx, work.TaskRequest{Kind: kind})
		res <- submitResult{task, err}
	}()
	pid := <-pids
	watcher := connect(t, dsn)
	var xid int64
	waitFor(t, time.Minute, "the group to wait for the lock", func() bool {
		err := watcher.QueryRow(ctx, `SELECT backend_xid::text::bigint FROM pg_stat_activity
			WHERE pid = $1 AND wait_event_type = 'Lock' AND backend_xid IS NOT NULL`, pid).Scan(&xid)
		return err == nil
	})
	watcher.Close(ctx)
	cut.Store(true) // the writer learns nothing until the id was reused
	if err := srv.StopServer("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	status := consumeTransactionIDs(t, srv.DSN, xid)
	cut.Store(false)
	var r submitResult
	select {
	case r = <-res:
	case <-time.After(4 * time.Minute):
		t.Fatal("the submit did not return")
	}
	if r.err == nil {
		_, found, err := s.Task(ctx, r.task.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			t.Fatalf("submit acknowledged task %s, which does not exist (transaction id %d reads %s)", r.task.ID, xid, status)
		}
	} else if !errors.Is(r.err, work.ErrBackend) {
		t.Fatalf("submit = %v, want success or ErrBackend", r.err)
	}
	t.Logf("round %d: submit across the crash: %v (the lost transaction %d reads %s)", round, r.err, xid, status)
	if n := kindCounts(t, s)[kind]; n != 0 {
		t.Errorf("%d tasks of the lost group exist", n)
	}
	return xid, status == "committed"
}

// consumeTransactionIDs commits transactions on a new connection until the server has handed
// out xid, and returns what pg_xact_status says of xid then.
func consumeTransactionIDs(t *testing.T, dsn string, xid int64) string {
	ctx := context.Background()
	other := connect(t, dsn)
	defer other.Close(ctx)
	for i := 0; ; i++ {
		var x int64
		if err := other.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x); err != nil {
			t.Fatal(err)
		}
		if x >= xid {
			break
		}
		if i > 1e5 {
			t.Fatalf("the server's transaction ids do not reach %d", xid)
		}
	}
	var status string
	if err := other.QueryRow(ctx, "SELECT pg_xact_status($1::text::xid8)", strconv.FormatInt(xid, 10)).Scan(&status); err != nil {
		t.Fatal(err)
	}
	return status
}

// resolve, directly: the mark of a committed group, of one that rolled back, of one whose
// transaction is still running (it waits for its end), of one that runs past
// CommitResolveTimeout (an error: unknown), and of one lost in a crash whose transaction id
// the restarted server gave to a transaction that committed.
func TestResolveReadsTheCommitMark(t *testing.T) {
	dsn := pgtest.Schema(t)
	e, _ := openEngine(t, dsn, &Options{CommitResolveTimeout: 2 * time.Minute})
	ctx := context.Background()
	id := make([]byte, 16)
	crand.Read(id)
	resolved := func(e *engine, n int64) (bool, error) { return e.resolve(id, n) }
	if ok, err := resolved(e, 1); ok || err != nil {
		t.Fatalf("resolve without a mark = %v, %v; want not committed", ok, err)
	}
	c := connect(t, dsn)
	if _, err := c.Exec(ctx, e.st.setMark, id, int64(1)); err != nil {
		t.Fatal(err)
	}
	if ok, err := resolved(e, 1); !ok || err != nil {
		t.Fatalf("resolve of the mark's group = %v, %v; want committed", ok, err)
	}
	if ok, err := resolved(e, 2); ok || err != nil {
		t.Fatalf("resolve of the group after the mark's = %v, %v; want not committed", ok, err)
	}

	// A group's transaction still running: resolve waits for it to end.
	watcher := connect(t, dsn)
	running := func(n int64, end string) (bool, error) {
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, e.st.lockHead); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, e.st.setMark, id, n); err != nil {
			t.Fatal(err)
		}
		type result struct {
			ok  bool
			err error
		}
		res := make(chan result, 1)
		go func() { ok, err := resolved(e, n); res <- result{ok, err} }()
		waitFor(t, time.Minute, "resolve to wait for the log head", func() bool {
			if len(res) > 0 {
				return true // it did not wait: the select below says so
			}
			var waiting bool
			err := watcher.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query = $1`, e.st.waitHead).Scan(&waiting)
			return err == nil && waiting
		})
		select {
		case r := <-res:
			t.Fatalf("resolve returned %v, %v while the transaction ran", r.ok, r.err)
		default:
		}
		if _, err := c.Exec(ctx, end); err != nil {
			t.Fatal(err)
		}
		r := <-res
		return r.ok, r.err
	}
	if ok, err := running(2, "COMMIT"); !ok || err != nil {
		t.Fatalf("resolve of a running group that then committed = %v, %v", ok, err)
	}
	if ok, err := running(3, "ROLLBACK"); ok || err != nil {
		t.Fatalf("resolve of a running group that then rolled back = %v, %v", ok, err)
	}

	// Past CommitResolveTimeout: unknown.
	short, _ := openEngine(t, dsn, &Options{CommitResolveTimeout: 300 * time.Millisecond})
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, short.st.lockHead); err != nil {
		t.Fatal(err)
	}
	if ok, err := short.resolve(id, 3); ok || err == nil {
		t.Fatalf("resolve while the log head stays locked = %v, %v; want an error", ok, err)
	}
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}

	// Lost in a crash, its transaction id reused by a commit.
	srv := pgtest.Need(t)
	if !srv.Owned() {
		t.Skip("the server was not started by this test binary")
	}
	// (When the server happened to write the transaction's WAL, its id is not reused: up to
	// five rounds.)
	for round, n := 1, int64(3); ; round, n = round+1, n+1 {
		c := connect(t, dsn)
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, e.st.lockHead); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, e.st.setMark, id, n); err != nil {
			t.Fatal(err)
		}
		var xid int64
		if err := c.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if err := srv.StopServer("immediate"); err != nil {
			t.Fatal(err)
		}
		if err := srv.StartServer(); err != nil {
			t.Fatal(err)
		}
		status := consumeTransactionIDs(t, srv.DSN, xid)
		if ok, err := resolved(e, n); ok || err != nil {
			t.Fatalf("resolve of a group lost in a crash (its transaction id %d reads %s) = %v, %v; want not committed", xid, status, ok, err)
		}
		if status == "committed" {
			return
		}
		t.Logf("round %d: the lost transaction's id %d reads %s: not reused", round, xid, status)
		if round == 5 {
			t.Log("the transaction id was never reused: this run checked less than it should")
			return
		}
	}
}

// sleepAfterCommit is queued after the group's COMMIT (testTrace.commitBatch), so the server has
// committed when it is terminated in it: its FATAL comes in the commit batch's answer.
const sleepAfterCommit = "SELECT pg_sleep(61.25)"

// terminateSleepers terminates, until stop closes, every backend asleep in sleepAfterCommit.
// Asleep, not merely showing it: pgx prepares a statement new to the connection in a round
// trip of its own before it sends the batch, and the server shows the statement as the
// backend's active query while it parses it, in the open transaction, before the COMMIT.
// Terminated then, the group did not commit, and rightly fails (the test failed one run in a
// few under load, issue 25). The PgSleep wait event is set only inside pg_sleep, which runs
// after the COMMIT completed.
func terminateSleepers(t *testing.T, dsn string, stop <-chan struct{}) *sync.WaitGroup {
	killer := connect(t, dsn)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			killer.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE query = $1 AND state = 'active' AND wait_event = 'PgSleep'
				AND pid <> pg_backend_pid()`, sleepAfterCommit)
		}
	}()
	return &wg
}

// Issue 27 item 2. pg_terminate_backend's FATAL arrives after the COMMIT completed (here the
// server is terminated in a statement queued after it): the group committed, and every
// caller gets its success, once. The writer used to take any server error for a rollback:
// a lone command got ErrBackend although it committed, and a group was re-run command by
// command, storing every keyless submit twice.
func TestTerminatedAfterCommit(t *testing.T) {
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	wg := terminateSleepers(t, dsn, stop)
	defer func() { close(stop); wg.Wait() }()
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).commitBatch = func(b *pgx.Batch) { b.Queue(sleepAfterCommit) }

	// One command alone.
	task, err := s.Submit(ctx, work.TaskRequest{Kind: "alone"})
	if err != nil {
		t.Errorf("a submit whose transaction committed before the FATAL: %v", err)
	} else if _, found, err := s.Task(ctx, task.ID); err != nil || !found {
		t.Errorf("Task(%s) = %v, %v", task.ID, found, err)
	}

	// A group: the writer is held until every submit is queued behind the first.
	const n = 8
	held := make(chan struct{})
	var fired atomic.Int32
	tracing(e).beforeCommit = func(*pgx.Conn) {
		if fired.Add(1) == 1 {
			<-held
		}
	}
	res := make([]chan submitResult, n+1)
	submit := func(i int) {
		res[i] = make(chan submitResult, 1)
		go func() {
			task, err := s.Submit(ctx, work.TaskRequest{Kind: fmt.Sprintf("group-%d", i)})
			res[i] <- submitResult{task, err}
		}()
	}
	submit(0)
	waitFor(t, time.Minute, "the first group to reach its commit", func() bool { return fired.Load() > 0 })
	for i := 1; i <= n; i++ {
		submit(i)
	}
	waitFor(t, time.Minute, "the submits to queue", func() bool { return len(e.cmds) == n })
	close(held)
	for i := 0; i <= n; i++ {
		r := <-res[i]
		if r.err != nil {
			t.Errorf("group submit %d: %v", i, r.err)
		}
	}
	tracing(e).commitBatch, tracing(e).beforeCommit = nil, nil
	e.ordinaryCommits = false
	counts := kindCounts(t, s)
	if counts["alone"] != 1 {
		t.Errorf("%d tasks of the lone submit, want 1", counts["alone"])
	}
	for i := 0; i <= n; i++ {
		if c := counts[fmt.Sprintf("group-%d", i)]; c != 1 {
			t.Errorf("group submit %d stored %d times, want once", i, c)
		}
	}
	mustVerify(t, q)
}

// Issue 27 item 2 under load: the writer's server process is terminated at random moments
// (in its transaction, during its COMMIT, after it: some groups sleep after COMMIT) while
// workers submit, keyed and keyless, each submit a kind of its own. Every acknowledged
// submit is stored once; a submit that failed other than ErrCommitUnknown is not stored; none
// is stored twice (the writer never re-runs a group that may have committed).
func TestTerminateWriterUnderLoad(t *testing.T) {
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, &Options{CommitResolveTimeout: time.Minute})
	ctx := context.Background()
	s := q.Session("s")
	var pid atomic.Uint32
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(c *pgx.Conn) { pid.Store(c.PgConn().PID()) }
	var sleepy atomic.Int32
	tracing(e).commitBatch = func(b *pgx.Batch) {
		if sleepy.Add(1)%4 == 0 {
			b.Queue(sleepAfterCommit)
		}
	}
	stop := make(chan struct{})
	sleepers := terminateSleepers(t, dsn, stop)
	killer := connect(t, dsn)
	var terminated atomic.Int32
	var killerDone sync.WaitGroup
	killerDone.Add(1)
	go func() { // the writer's backend at random moments
		defer killerDone.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(rand.IntN(60)) * time.Millisecond):
			}
			if p := pid.Load(); p != 0 {
				var ok bool
				if killer.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(p)).Scan(&ok) == nil && ok {
					terminated.Add(1)
				}
			}
		}
	}()

	type outcome struct {
		kind string
		err  error
	}
	var mu sync.Mutex
	var outs []outcome
	var wg sync.WaitGroup
	const workers, each = 6, 60
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r := work.TaskRequest{Kind: fmt.Sprintf("w%d-%d", w, i)}
				if i%2 == 0 {
					r.IdempotencyKey = r.Kind
				}
				_, err := s.Submit(ctx, r)
				mu.Lock()
				outs = append(outs, outcome{r.Kind, err})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	killerDone.Wait()
	sleepers.Wait()
	tracing(e).beforeCommit, tracing(e).commitBatch = nil, nil
	e.ordinaryCommits = false

	counts := kindCounts(t, s)
	var ok, failed, unknown int
	for _, o := range outs {
		c := counts[o.kind]
		switch {
		case c > 1:
			t.Errorf("submit %s stored %d times", o.kind, c)
		case o.err == nil:
			ok++
			if c != 1 {
				t.Errorf("submit %s acknowledged, not stored", o.kind)
			}
		case errors.Is(o.err, ErrCommitUnknown):
			unknown++
		case !errors.Is(o.err, work.ErrBackend):
			t.Errorf("submit %s: %v, want success or ErrBackend", o.kind, o.err)
		default:
			failed++
			if c != 0 {
				t.Errorf("submit %s failed (%v) but is stored", o.kind, o.err)
			}
		}
	}
	t.Logf("%d backends terminated; %d submits acknowledged, %d failed, %d unknown", terminated.Load(), ok, failed, unknown)
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "after"}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, q)
}

// commit_marks: Open creates it in a queue made before it (OpenReadOnly does not), removes
// the rows of writers idle for more than markMaxAge, and a writer removes its own row when
// it closes.
func TestCommitMarksTable(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	admin := connect(t, dsn)
	marks := func() int {
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM commit_marks").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if n := marks(); n != 1 {
		t.Fatalf("%d commit marks after a submit, want the writer's", n)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if n := marks(); n != 0 {
		t.Fatalf("%d commit marks after Close, want none", n)
	}

	// A queue made before commit_marks.
	if _, err := admin.Exec(ctx, "DROP TABLE commit_marks"); err != nil {
		t.Fatal(err)
	}
	ro, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatalf("OpenReadOnly of a queue without commit_marks: %v", err)
	}
	ro.Close()
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT to_regclass('commit_marks') IS NOT NULL").Scan(&exists); err != nil || exists {
		t.Fatalf("OpenReadOnly created commit_marks (%v, %v)", exists, err)
	}
	q, err = Open(ctx, dsn, nil)
	if err != nil {
		t.Fatalf("Open of a queue without commit_marks: %v", err)
	}
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	// Rows of writers that stopped without removing theirs: one a day and more old, one not.
	if _, err := admin.Exec(ctx, `INSERT INTO commit_marks VALUES ('old', 7, now() - interval '25 hours'),
		('recent', 3, now() - interval '23 hours')`); err != nil {
		t.Fatal(err)
	}
	q2, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	q2.Close()
	rows, err := admin.Query(ctx, "SELECT writer FROM commit_marks WHERE writer IN ('old', 'recent')")
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || string(left[0]) != "recent" {
		t.Errorf("rows left after Open: %q, want only recent's", left)
	}
	if n := marks(); n != 2 {
		t.Errorf("%d commit marks, want recent's and the open queue's", n)
	}
	mustVerify(t, q)
	q.Close()
}

// A prune appends no event: its commit needs the proof as much as any other group's. Its
// transaction is terminated after COMMIT (as in TestTerminatedAfterCommit): the prune
// succeeds, and the pruned tasks are gone.
func TestPruneTerminatedAfterCommit(t *testing.T) {
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	ctx := context.Background()
	base := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	s := q.Session("s")
	const n = 3
	for range n {
		if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "old"}, base); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := q.ClaimKindsAt(ctx, []string{"old"}, base.Add(time.Second), time.Hour, n)
	if err != nil || len(ds) != n {
		t.Fatalf("claimed %d of %d: %v", len(ds), n, err)
	}
	for _, d := range ds {
		if _, err := q.FinishAt(ctx, d, work.Success(nil), base.Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	wg := terminateSleepers(t, dsn, stop)
	var terminated atomic.Int32
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).commitBatch = func(b *pgx.Batch) {
		if terminated.Add(1) == 1 { // the first group only: the prune's
			b.Queue(sleepAfterCommit)
		}
	}
	res, err := q.Prune(ctx, base.Add(time.Hour))
	close(stop)
	wg.Wait()
	tracing(e).commitBatch = nil
	e.ordinaryCommits = false
	if err != nil {
		t.Fatalf("a prune whose transaction committed before the FATAL: %v", err)
	}
	if res.Tasks != n {
		t.Errorf("pruned %d tasks, want %d", res.Tasks, n)
	}
	for _, d := range ds {
		if _, found, err := s.Task(ctx, d.Task.ID); err != nil || found {
			t.Errorf("Task(%s) after the prune = %v, %v", d.Task.ID, found, err)
		}
	}
	mustVerify(t, q)
}
