package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	engineapi "github.com/worklog/worklog/internal/engine"
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

// Update queues fn for the writer and waits for its group's commit.
func (e *engine) Update(ctx context.Context, fn func(engineapi.Txn) error) error {
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
		e.runAlone(group[0])
		return
	}
	out, _, err := e.attempt(group)
	switch out {
	case committed, notCommitted:
		for _, c := range group {
			c.done <- err // a caller that left reads nothing: done is buffered
		}
	case fnFailed, rerunAlone:
		for _, c := range group {
			e.runAlone(c)
		}
	}
}

func (e *engine) runAlone(c *command) {
	_, _, err := e.attempt([]*command{c})
	c.done <- err
}

// attempt runs the group once. ran is the commands whose closures ran (the others' callers
// left); err is their answer when the outcome is committed (nil) or notCommitted, the
// failing closure's error when fnFailed.
func (e *engine) attempt(group []*command) (out groupOutcome, ran []*command, err error) {
	ctx, cancel := context.WithTimeout(e.ctx, e.opts.WriteTimeout) // deadlines on the connection's I/O
	defer cancel()
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		e.cache.valid = false
		return notCommitted, group, backendError(err)
	}
	defer conn.Release()
	tx, err := e.begin(ctx, conn)
	if err != nil {
		e.cache.valid = false
		rollback(conn)
		return notCommitted, group, backendError(err)
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
	b := &pgx.Batch{}
	tx.queueCommit(b, e.channel)
	b.Queue("COMMIT")
	if e.hookBeforeCommit != nil {
		e.hookBeforeCommit(conn.Conn())
	}
	br := conn.Conn().SendBatch(ctx, b)
	if e.hookAfterCommitSent != nil {
		e.hookAfterCommitSent(conn.Conn())
	}
	cerr := br.Close()
	if cerr == nil {
		e.adopt(tx)
		return committed, ran, nil
	}
	e.cache = newCache()
	var pe *pgconn.PgError
	switch {
	case errors.As(cerr, &pe):
		// The server answered with an error: it rolled the transaction back (or will on
		// the ROLLBACK below), and the connection is fine.
		rollback(conn)
		if len(group) > 1 {
			return rerunAlone, ran, nil
		}
		return notCommitted, ran, backendError(cerr)
	case pgconn.SafeToRetry(cerr):
		// Nothing was sent: the transaction dies with its connection, uncommitted.
		conn.Conn().Close(context.Background())
		return notCommitted, ran, backendError(cerr)
	}
	// The connection failed while the COMMIT was on its way or its answer was: the
	// transaction may have committed. Ask the server (on another connection) what became
	// of it, and answer the callers with that.
	conn.Conn().Close(context.Background())
	ok, rerr := e.resolve(tx.xid)
	if rerr != nil {
		return notCommitted, ran, backendError(fmt.Errorf("%w: %v (the connection failed during COMMIT: %v)", ErrCommitUnknown, rerr, cerr))
	}
	if ok {
		return committed, ran, nil
	}
	return notCommitted, ran, backendError(cerr)
}

// begin starts the group's transaction, locks the log head (which orders every writer of
// every process) and reads what the group needs to know about the stored state, in one
// round trip. The cache stays valid only if nobody committed since the writer's last group.
func (e *engine) begin(ctx context.Context, conn *pgxpool.Conn) (*txn, error) {
	var seq, prunes int64
	var xid string
	var maxTask, maxWake []byte
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(e.st.lockHead).QueryRow(func(r pgx.Row) error { return r.Scan(&seq, &prunes, &xid) })
	b.Queue(e.st.maxTask).QueryRow(func(r pgx.Row) error { return r.Scan(&maxTask) })
	b.Queue(e.st.maxWake).QueryRow(func(r pgx.Row) error { return r.Scan(&maxWake) })
	if err := conn.Conn().SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	if !e.cache.valid || e.cache.seq != uint64(seq) || e.cache.prunes != uint64(prunes) || e.cache.size() > cacheMax {
		e.cache = newCache()
	}
	e.cache.valid = false // until this group commits
	tx := newTxn(ctx, conn.Conn(), e.st, e.cache)
	tx.seq, tx.xid, tx.maxTask, tx.maxWake = uint64(seq), xid, string(maxTask), string(maxWake)
	tx.startSeq, tx.prunes = tx.seq, uint64(prunes)
	return tx, nil
}

// adopt keeps the committed group's records as the cache of the new log head, but for those
// holding large values.
func (e *engine) adopt(tx *txn) {
	c := tx.c
	for id, r := range c.tasks {
		if r != nil && len(r.Input)+len(r.Outcome.Output) > cacheValueMax {
			delete(c.tasks, id)
		}
	}
	for id, r := range c.wakes {
		if r != nil && len(r.Payload)+len(r.Outcome.Output) > cacheValueMax {
			delete(c.wakes, id)
		}
	}
	c.seq, c.prunes, c.valid = tx.seq, tx.prunes, true
}

// inTheFuture reports pg_xact_status's refusal of a transaction id the server has not yet
// assigned ("transaction ID %s is in the future", invalid_parameter_value).
func inTheFuture(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22023" && strings.Contains(pe.Message, "in the future")
}

func rollback(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		conn.Conn().Close(ctx) // the pool drops a closed connection
	}
}

// resolve learns whether the transaction xid committed, from another connection: committed
// is final, aborted too; "in progress" means its server process has not yet noticed the lost
// connection, so it asks again. It gives up after Options.CommitResolveTimeout.
func (e *engine) resolve(xid string) (bool, error) {
	deadline := time.Now().Add(e.opts.CommitResolveTimeout)
	var last error
	for wait := 10 * time.Millisecond; ; wait = min(wait*2, time.Second) {
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		var status *string
		err := e.pool.QueryRow(ctx, `SELECT pg_xact_status($1::text::xid8)`, xid).Scan(&status)
		cancel()
		switch {
		case inTheFuture(err):
			// The server's next transaction id is not past xid: after a crash, recovery
			// set it from the WAL, and a commit record would have carried it past. xid
			// wrote nothing to the WAL before the crash, so it never committed.
			return false, nil
		case err != nil:
			last = err
		case status == nil:
			return false, fmt.Errorf("transaction %s is too old for the server to know its status", xid)
		case *status == "committed":
			return true, nil
		case *status == "aborted":
			return false, nil
		default:
			last = fmt.Errorf("transaction %s still %s", xid, *status)
		}
		if time.Now().After(deadline) || e.ctx.Err() != nil {
			return false, last
		}
		time.Sleep(wait)
	}
}
