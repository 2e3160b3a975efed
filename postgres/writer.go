package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// command is one Update waiting for, or run by, the writer.
type command struct {
	fn   func(engineapi.Txn) error
	ctx  context.Context // the caller's: its end also ends the closure's reads (runWithin)
	done chan error      // buffered: the writer never waits for a caller that left

	mu        sync.Mutex
	idle      sync.Cond // signalled when running turns false
	running   bool
	abandoned bool // the caller left (its ctx ended): never run it again
}

func newCommand(ctx context.Context, fn func(engineapi.Txn) error) *command {
	c := &command{fn: fn, ctx: ctx, done: make(chan error, 1)}
	c.idle.L = &c.mu
	return c
}

// run runs the closure unless its caller has left; ok is false when it did not run.
func (c *command) run(tx engineapi.Txn) (err error, ok bool) {
	c.mu.Lock()
	if c.abandoned {
		c.mu.Unlock()
		return nil, false
	}
	c.running = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.idle.Broadcast()
		c.mu.Unlock()
	}()
	return c.fn(tx), true
}

// runWithin runs the closure with the transaction's reads bounded by ctx (the group's) and by
// the caller's context: a caller that leaves while its closure waits on the server (which may
// have stopped answering) ends that read at once, instead of waiting in abandon for as long
// as the group's WriteTimeout. The read's failure fails the closure, so the group is rolled
// back and re-run without it, like any failed closure.
func (c *command) runWithin(ctx context.Context, tx *txn) (error, bool) {
	if c.ctx == nil || c.ctx.Done() == nil {
		return c.run(tx)
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	tx.ctx = cctx
	defer func() {
		stop()
		cancel()
		tx.ctx = ctx
	}()
	err, ok := c.run(tx)
	if err != nil && c.ctx.Err() != nil {
		err = c.ctx.Err() // what ended the read: the caller left
	}
	return err, ok
}

// abandon stops the closure from running again, after waiting for a run in progress (so
// the caller may read what the closure set without a race).
func (c *command) abandon() {
	c.mu.Lock()
	for c.running {
		c.idle.Wait()
	}
	c.abandoned = true
	c.mu.Unlock()
}

// Update queues fn for the writer and waits for its group's commit. A command whose key a
// transaction still open has reserved waits for that transaction here, not under the log
// head's lock, and runs again (keyBusyError, submittx.go).
func (e *engine) Update(ctx context.Context, fn func(engineapi.Txn) error) error {
	for {
		err := e.update(ctx, fn)
		var busy *keyBusyError
		if !errors.As(err, &busy) {
			return err
		}
		if err := e.awaitKeys(ctx, busy.keys); err != nil {
			return backendError(err)
		}
	}
}

func (e *engine) update(ctx context.Context, fn func(engineapi.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := newCommand(ctx, fn)
	e.mu.RLock()
	if e.closed {
		e.mu.RUnlock()
		return errClosed()
	}
	select {
	case e.cmds <- c:
		e.mu.RUnlock()
	case <-ctx.Done():
		e.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		c.abandon()
		select {
		case err := <-c.done:
			return err
		default:
		}
		// Its group may still commit what it appended (an idempotency key makes a retry safe).
		return ctx.Err()
	}
}

func errClosed() error { return fmt.Errorf("%w: postgres queue closed", work.ErrClosed) }

// writer takes every command waiting (up to MaxBatchCommands) and runs them as one group.
func (e *engine) writer() {
	defer close(e.writerDone)
	e.mark.id = make([]byte, 16)
	rand.Read(e.mark.id) // crypto/rand: the id must differ from every other writer's
	group := make([]*command, 0, e.opts.MaxBatchCommands)
	for {
		select {
		case c := <-e.cmds:
			group = append(group[:0], c)
		drain:
			for len(group) < e.opts.MaxBatchCommands {
				select {
				case c := <-e.cmds:
					group = append(group, c)
				default:
					break drain
				}
			}
			e.runGroup(group)
		case <-e.closing:
			defer e.dropMark()
			for {
				select {
				case c := <-e.cmds:
					c.done <- errClosed()
				default:
					return
				}
			}
		}
	}
}

// groupOutcome is what became of one attempt at a group.
type groupOutcome int

const (
	committed    groupOutcome = iota
	notCommitted              // nothing of the group is in the database: callers get the error
	fnFailed                  // a closure failed: the group is discarded and re-run one by one
	rerunAlone                // the server refused the group's writes: re-run one by one
)

// runGroup runs the commands in one transaction. When one closure fails, or the server
// refuses the group's writes, nothing of the group is kept and each command runs again
// alone, so only the failing one fails (as pebblelog's writer does).
func (e *engine) runGroup(group []*command) {
	if len(group) == 1 {
		e.runAlone(group[0], true)
		return
	}
	out, _, err := e.attempt(group, true)
	switch out {
	case committed, notCommitted:
		for _, c := range group {
			c.done <- err // a caller that left reads nothing: done is buffered
		}
	case fnFailed, rerunAlone:
		for _, c := range group {
			e.runAlone(c, false) // the ordinary way: a command runs at most twice when its group fails
		}
	}
}

func (e *engine) runAlone(c *command, mayFast bool) {
	out, _, err := e.attempt([]*command{c}, mayFast)
	if out == notCommitted && keyReserved(err) {
		// A key the command read as absent was reserved meanwhile by a SubmitTx, whose
		// commit its insert waited for (submittx.go): once more, taking that one in first.
		_, _, err = e.attempt([]*command{c}, false)
	}
	c.done <- err
}

// attempt runs the group once. ran is the commands whose closures ran (the others' callers
// left); err is their answer when the outcome is committed (nil) or notCommitted, the
// failing closure's error when fnFailed. mayFast: the group may run before the lock
// (fast.go) when the cache allows.
func (e *engine) attempt(group []*command, mayFast bool) (out groupOutcome, ran []*command, err error) {
	ctx, cancel := context.WithTimeout(e.ctx, e.opts.WriteTimeout) // deadlines on the connection's I/O
	defer cancel()
	read := e.head.fastRead.Load()
	defer func() { // before the callers are answered: whether the next group may take keys unread (readfirst.go)
		e.readFirst.fast.Store(e.fastOK() && e.head.fastRead.Load() == read)
	}()
	prior := e.claimReads // of the last commit's head: only the next group may use them
	e.claimReads = nil
	if mayFast && e.fastOK() {
		if out, ran, err, done := e.attemptFast(ctx, group, prior); done {
			return out, ran, err
		}
	}
	start := time.Now() // the log head's hold (headstats.go): read-only instrumentation
	conn, tx, err := e.acquireBegun(ctx)
	if err != nil {
		e.cache.valid = false
		return notCommitted, group, backendError(err)
	}
	locked := time.Now()
	defer conn.Release()
	if tx.inboxWaiting {
		if err := e.takeDecided(tx); err != nil { // submittx.go
			e.cache = newCache()
			rollback(conn)
			return notCommitted, group, backendError(err)
		}
	}
	ran = make([]*command, 0, len(group))
	for i, c := range group {
		if e.savepointEach {
			sp := "SAVEPOINT cmd"
			if i > 0 {
				sp = "RELEASE SAVEPOINT cmd; SAVEPOINT cmd"
			}
			if _, err := conn.Exec(ctx, sp); err != nil {
				rollback(conn)
				return notCommitted, ran, backendError(err)
			}
		}
		ferr, ok := c.runWithin(ctx, tx)
		if !ok {
			continue
		}
		ran = append(ran, c)
		if ferr != nil {
			e.cache = newCache() // the closure may have changed the cache's records
			rollback(conn)
			return fnFailed, ran, ferr
		}
	}
	e.plan.learn(tx) // what the next begins read for claims (claimpre.go)
	wrote := tx.seq != tx.startSeq || tx.pruned || tx.sideWrites || len(tx.evs) > 0
	if !wrote {
		// The group wrote nothing (duplicates, claims that found nothing): every answer
		// came from committed rows, read under the head lock, or from the cache of committed
		// groups, so there is nothing to commit. ROLLBACK frees the head lock without a
		// COMMIT's WAL flush (locking the head gave the transaction an id, so a COMMIT would
		// wait for one); its failure changes no answer (rollback drops the connection).
		// Every write of a group sets one of wrote's terms: an event, a prune (which may
		// take every event it appends), or a statement of its own (sideWrites).
		rollback(conn)
		e.adopt(tx)
		return committed, ran, nil
	}
	if out, err, ok := e.copyGroup(conn, tx, len(group)); !ok {
		return out, ran, err
	}
	b := &pgx.Batch{}
	tx.queueCommit(b, e.queueNotify)
	e.mark.n++
	b.Queue(e.st.setMark, e.mark.id, e.mark.n)
	var didCommit bool
	var reads *claimReads
	if e.cache.alone && !e.savepointEach && !e.ordinaryCommits {
		reads = e.queueCommitAndClaimReads(b, &didCommit) // the next claim's, after the COMMIT (claimpre.go)
	} else {
		b.Queue("COMMIT")
	}
	if e.trace != nil {
		e.trace.sendingCommit(conn.Conn(), b, false)
	}
	br := conn.Conn().SendBatch(ctx, b)
	if e.trace != nil {
		e.trace.sentCommit(conn.Conn())
	}
	cerr := br.Close()
	if cerr != nil && didCommit {
		// The claim reads after the COMMIT failed; the group committed.
		rollback(conn)
		cerr, reads = nil, nil
	}
	if cerr == nil {
		e.head.record(start, locked, time.Now(), tx.reads)
		e.adopt(tx)
		e.claimReads = reads
		if tx.tookIn {
			e.signal() // the waiters of this process: the tasks a SubmitTx decided are claimable
		}
		return committed, ran, nil
	}
	e.cache = newCache()
	if rolledBack(conn.Conn(), cerr) {
		// An ERROR on a connection that is still up: the server rolled the transaction
		// back (an ERROR in the batch skips the rest of it, COMMIT included; an ERROR of
		// COMMIT itself is a rollback), and ends it on the ROLLBACK below.
		rollback(conn)
		if len(group) > 1 {
			return rerunAlone, ran, nil
		}
		return notCommitted, ran, backendError(tx.keyBusy(cerr))
	}
	conn.Conn().Close(context.Background())
	if pgconn.SafeToRetry(cerr) {
		// Nothing of the batch was sent: the transaction dies with its connection.
		return notCommitted, ran, backendError(cerr)
	}
	// The connection failed (an I/O error, or a FATAL or PANIC, which the server may send
	// after COMMIT completed: pg_terminate_backend, a shutdown) while the batch, its COMMIT
	// or their answers were on the wire: the transaction may have committed. Never re-run
	// the group (it would collide with its own rows, or store a keyless submit twice): learn
	// its outcome from its mark, and answer the callers with that.
	ok, rerr := e.resolve(e.mark.id, e.mark.n)
	if rerr != nil {
		return notCommitted, ran, backendError(fmt.Errorf("%w: %v (the connection failed during COMMIT: %v)", ErrCommitUnknown, rerr, cerr))
	}
	if ok {
		return committed, ran, nil
	}
	return notCommitted, ran, backendError(cerr)
}

// rolledBack reports an error that proves the transaction rolled back: the server's answer
// at ERROR severity, on a connection that is still open. A FATAL or PANIC closes the
// connection, and may come after the COMMIT completed. (COMMIT is the batch's last
// statement, so an ERROR is never an answer to a statement after it.)
func rolledBack(conn *pgx.Conn, err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || conn.IsClosed() {
		return false
	}
	sev := pe.SeverityUnlocalized
	if sev == "" { // a server before 9.6 sends only the localized one
		sev = pe.Severity
	}
	return sev == "ERROR"
}

// begin starts the group's transaction, locks the log head (which orders every writer of
// every process) and reads what the group needs to know about the stored state, in one
// round trip. The cache stays valid when nobody committed since the writer's last group, and
// is caught up with the events others appended otherwise (catchup.go), read in the same
// round trip after the lock. The transaction is READ COMMITTED whatever the database's
// default: each statement after the lock sees everything committed up to the locked head.
func (e *engine) begin(ctx context.Context, conn *pgxpool.Conn) (*txn, error) {
	var seq, prunes int64
	var maxTask, maxWake []byte
	var chs []change
	var last []byte
	c := e.cache
	keep := c.valid && c.size() <= cacheMax && c.last != nil
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(e.st.lockHead).QueryRow(func(r pgx.Row) error { return r.Scan(&seq, &prunes) })
	b.Queue(e.st.maxTask).QueryRow(func(r pgx.Row) error { return r.Scan(&maxTask) })
	b.Queue(e.st.maxWake).QueryRow(func(r pgx.Row) error { return r.Scan(&maxWake) })
	b.Queue(e.st.headLast).QueryRow(func(r pgx.Row) error { return r.Scan(&last) })
	var inboxWaiting bool // a SubmitTx committed: taken in before the group's commands (submittx.go)
	b.Queue(e.inbox.waiting).QueryRow(func(r pgx.Row) error { return r.Scan(&inboxWaiting) })
	if keep {
		b.Queue(e.st.changesSince, int64(c.seq), catchUpMax+2).Query(func(rows pgx.Rows) error {
			var err error
			chs, err = collect(rows, scanChange)
			return err
		})
	}
	var pols map[string]*projection.KindPolicy
	pre := e.queuePrefetch(b, &pols) // a claim's reads, when the writer's recent groups claimed (claimpre.go)
	if err := conn.Conn().SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	// Another writer committed (or the history changed: a failover that lost commits).
	stale := c.valid && (c.seq != uint64(seq) || c.prunes != uint64(prunes) || !bytes.Equal(c.last, last))
	keep = keep && c.prunes == uint64(prunes)
	dropped := 0
	switch {
	case !keep:
	case c.seq == uint64(seq):
		keep = bytes.Equal(c.last, last)
	case c.seq < uint64(seq):
		dropped, keep = c.catchUp(chs)
	default: // the head went back
		keep = false
	}
	if stale {
		e.head.caughtUp(keep, dropped)
		e.alone = 0
	} else {
		e.alone++
	}
	alone := c.valid && !stale
	if !keep {
		e.cache = newCache()
		e.cache.from = uint64(seq) // empty, and exact: nothing committed since seq
	}
	e.cache.valid = false // until this group commits
	e.cache.alone = alone
	tx := newTxn(ctx, conn.Conn(), e.st, e.cache)
	tx.hints, tx.trace = &e.hints, e.trace
	tx.seq, tx.maxTask, tx.maxWake = uint64(seq), string(maxTask), string(maxWake)
	tx.startSeq, tx.prunes, tx.last = tx.seq, uint64(prunes), last
	tx.inboxWaiting = inboxWaiting
	if pre != nil {
		tx.pre, tx.pols = pre, pols
	}
	return tx, nil
}

// adopt keeps the committed group's records as the cache of the new log head, but for those
// holding large values.
//
// It keeps the bounds of the fast path (fast.go): every stored id that is not in the cache is
// at most c.maxTask (c.maxWake). The group's bound was such (the greatest stored id at its
// begin, or the cache's bound for a group run before the lock); the ids the group put are
// in the cache; a record dropped here raises the bound to its id. The group's own puts do
// not raise it: at one goroutine the next group's new id, random after its millisecond,
// would fall below the last one half the time, and cost a read.
func (e *engine) adopt(tx *txn) {
	c := tx.c
	c.maxTask, c.maxWake = tx.maxTask, tx.maxWake
	// The records too large to keep: only those the group put into the cache can be
	// (noteBig), the others were checked at the end of the group that put them.
	for _, b := range tx.big {
		if b.wake {
			if r := c.wakes[b.id]; r != nil && wakeTable.valueLen(r) > cacheValueMax {
				delete(c.wakes, b.id)
				c.maxWake = max(c.maxWake, b.id)
			}
		} else if r := c.tasks[b.id]; r != nil && taskTable.valueLen(r) > cacheValueMax {
			delete(c.tasks, b.id)
			c.maxTask = max(c.maxTask, b.id)
		}
	}
	c.seq, c.prunes, c.valid = tx.seq, tx.prunes, true
	c.last = tx.last
	if tx.seq != tx.startSeq {
		c.last = nil // the head's event is the group's last, unless a prune of the group took it
		if n := len(tx.evs); n > 0 && tx.evs[n-1].seq == tx.seq {
			c.last = lastOf(tx.evs[n-1].body)
		}
	}
}

func rollback(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		conn.Conn().Close(ctx) // the pool drops a closed connection
	}
}

// commitMark is the writer's row in commit_marks, the proof of its groups' commits. Every
// group that writes sets the row to its own number, in its transaction. Only this writer
// writes the row (its id is random), one group at a time, and it learns the outcome of a
// group before it runs the next: so once a group's transaction has ended, the row holds the
// group's number exactly when it committed. The proof costs one small upsert in the commit
// batch (no round trip); only resolve reads it. One row per writer, overwritten, removed
// when the writer stops; Open removes the rows of writers gone for a day (markMaxAge).
type commitMark struct {
	id []byte // 16 bytes from crypto/rand, drawn when the writer starts
	n  int64  // the number of the writer's last group that wrote
}

// markMaxAge is how long a writer's row outlives its last group, for the processes that
// stopped without removing theirs. Far above any CommitResolveTimeout: a row is read only
// while its writer resolves its last group.
const markMaxAge = 24 * time.Hour

// resolve learns whether the writer's group n committed. It waits, on another connection,
// for the log head's lock: the group's transaction held it from its first statement to its
// end, so once the lock is free the transaction has ended (committed, rolled back, or gone
// with a crashed server) and a statement that starts after it sees its outcome. Then it reads
// the writer's mark. It asks again while the server cannot be reached or the lock stays
// taken (the transaction still runs: its server process has not yet noticed the lost
// connection), for at most Options.CommitResolveTimeout.
//
// A transaction id cannot tell: after a crash the server hands the id of a transaction whose
// WAL was lost to the next transaction of any client, and pg_xact_status then reads
// "committed" for the lost one (TestLostCommitWhoseTransactionIDIsReused).
func (e *engine) resolve(id []byte, n int64) (bool, error) {
	deadline := time.Now().Add(e.opts.CommitResolveTimeout)
	for wait := 10 * time.Millisecond; ; wait = min(wait*2, time.Second) {
		got, err := e.readMark(id, max(time.Until(deadline), 10*time.Millisecond))
		switch {
		case err == nil && got == n:
			return true, nil
		case err == nil && got < n:
			return false, nil
		case err == nil:
			return false, fmt.Errorf("commit_marks holds group %d of this writer, after its last group %d", got, n)
		}
		if time.Now().After(deadline) || e.ctx.Err() != nil {
			return false, err
		}
		time.Sleep(min(wait, max(time.Until(deadline), 0)))
	}
}

// readMark reads the writer's mark (0 when it has none) once no transaction holds the log
// head, waiting at most lockWait for it.
func (e *engine) readMark(id []byte, lockWait time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(e.ctx, lockWait+5*time.Second)
	defer cancel()
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var got int64
	b := &pgx.Batch{}
	// READ COMMITTED whatever the database's default: the mark is read by a statement of its
	// own, whose snapshot is taken after the lock was granted.
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue("SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(max(lockWait.Milliseconds(), 1), 10))
	b.Queue(e.st.waitHead)
	b.Queue(e.st.getMark, id).QueryRow(func(r pgx.Row) error {
		if err := r.Scan(&got); !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return nil
	})
	b.Queue("ROLLBACK")
	if err := conn.Conn().SendBatch(ctx, b).Close(); err != nil {
		rollback(conn)
		return 0, fmt.Errorf("waiting for the log head to read the commit mark: %w", err)
	}
	return got, nil
}

// dropMark removes the writer's row when it stops (best effort: Open removes it a day later).
func (e *engine) dropMark() {
	if e.mark.n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second) // bounds what it adds to Close
	defer cancel()
	e.pool.Exec(ctx, e.st.delMark, e.mark.id)
}
