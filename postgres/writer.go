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

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// command is one Update waiting for, or run by, the writer.
type command struct {
	fn   func(engineapi.Txn) error
	done chan error // buffered: the writer never waits for a caller that left

	mu        sync.Mutex
	idle      sync.Cond // signalled when running turns false
	running   bool
	abandoned bool // the caller left (its ctx ended): never run it again
}

func newCommand(fn func(engineapi.Txn) error) *command {
	c := &command{fn: fn, done: make(chan error, 1)}
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
	c := newCommand(fn)
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
	ctx := e.ctx
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
		ferr, ok := c.run(tx)
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
	if len(tx.evs) == 0 {
		// The group wrote nothing (duplicates, claims that found nothing): every answer
		// comes from committed, durable rows or the cache of committed groups, so there is
		// nothing to commit. ROLLBACK frees the head lock without the commit's WAL flush
		// (the lock and pg_current_xact_id gave the transaction an id, so a COMMIT would
		// wait for one), and its failure changes no answer: the connection is dropped.
		rollback(conn)
		e.adopt(tx)
		return committed, ran, nil
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
		e.cache.from = uint64(seq) // empty, and exact: nothing committed since seq
	}
	e.cache.valid = false // until this group commits
	tx := newTxn(ctx, conn.Conn(), e.st, e.cache)
	tx.hints = &e.hints
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

// ViewDurable answers reads of committed state outside the writer and without a
// transaction, each read one statement on a pooled connection (work's read-first path for an
// idempotent repeat; the interface is in work/engine.go). Committed is durable here: a
// transaction becomes visible only after its commit record is flushed (synchronous_commit's
// default; with it off, an acknowledged Update is not durable either), and the writer's
// groups commit before they answer. The reads are not one snapshot, which a repeat does not
// need: TaskKey and WakeKey read the key and the record it names in one statement (one round
// trip for the whole repeat), and a key, once written, names its record for good.
func (e *engine) ViewDurable(ctx context.Context, fn func(projection.Reader) error) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if e.isClosed() {
		return false, errClosed()
	}
	r := &durableReader{ctx: ctx, st: e.st, pool: e.pool, schema: e.schema, hints: &e.hints}
	if err := fn(r); err != nil {
		return false, err
	}
	return true, nil
}

// durableReader is projection.Reader over single statements on the pool. Its key reads join
// the record, which Task and Wake then hand out without another round trip.
type durableReader struct {
	ctx    context.Context
	st     *statements
	pool   *pgxpool.Pool
	schema string
	hints  *keyHints
	task   *projection.Task
	wake   *projection.Wake
}

var _ projection.Reader = (*durableReader)(nil)

// The scans are not used by a repeat; each page is its own statement.

func (r *durableReader) ScanDue(maxAt int64, fn func(projection.IndexEntry) bool) error {
	return scanIndex(r.ctx, r.pool, r.st.scanDue, r.st.scanDueFrom, nil, maxAt, 2, fn)
}

func (r *durableReader) ScanWakes(maxAt int64, fn func(projection.IndexEntry) bool) error {
	return scanIndex(r.ctx, r.pool, r.st.scanWakes, r.st.scanWakesFrom, nil, maxAt, 3, fn)
}

func (r *durableReader) ScanDueKind(kind string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return scanIndex(r.ctx, r.pool, r.st.scanKind, r.st.scanKindFrom, []any{[]byte(kind)}, maxAt, 2, fn)
}

func (r *durableReader) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(uint64, string) bool) error {
	return scanSession(r.ctx, r.pool, r.st, sessionID, afterSeq, fn)
}

func (r *durableReader) Counts(fn func(string, events.TaskState, int64) bool) error {
	return readCounts(r.ctx, r.pool, r.st, fn)
}

func (r *durableReader) LastSeq() (uint64, error) {
	var seq int64
	err := r.pool.QueryRow(r.ctx, r.st.lastSeq).Scan(&seq)
	return uint64(seq), err
}

func (r *durableReader) sql(f string) string {
	return strings.ReplaceAll(f, "{s}", pgx.Identifier{r.schema}.Sanitize())
}

func (r *durableReader) TaskKey(sessionID, key string) (string, error) {
	var seq int64
	var id, rec, input []byte
	err := r.pool.QueryRow(r.ctx, r.sql(`SELECT h.seq, k.task_id, t.rec, t.input FROM {s}.log_head h
		LEFT JOIN {s}.task_keys k ON k.session = $1 AND k.key = $2
		LEFT JOIN {s}.tasks t ON t.id = k.task_id WHERE h.id = 1`),
		[]byte(sessionID), []byte(key)).Scan(&seq, &id, &rec, &input)
	if err != nil {
		return "", err
	}
	if id == nil {
		r.hints.note(false, skey{sessionID, key}, uint64(seq))
		return "", nil
	}
	r.task = nil
	if rec != nil {
		if r.task, err = decodeTask(string(id), rec, input); err != nil {
			return "", err
		}
	}
	return string(id), nil
}

func (r *durableReader) WakeKey(sessionID, key string) (string, error) {
	var seq int64
	var id, rec, payload, output []byte
	err := r.pool.QueryRow(r.ctx, r.sql(`SELECT h.seq, k.wake_id, w.rec, w.payload, w.output FROM {s}.log_head h
		LEFT JOIN {s}.wake_keys k ON k.session = $1 AND k.key = $2
		LEFT JOIN {s}.wakes w ON w.id = k.wake_id WHERE h.id = 1`),
		[]byte(sessionID), []byte(key)).Scan(&seq, &id, &rec, &payload, &output)
	if err != nil {
		return "", err
	}
	if id == nil {
		r.hints.note(true, skey{sessionID, key}, uint64(seq))
		return "", nil
	}
	r.wake = nil
	if rec != nil {
		if r.wake, err = decodeWake(string(id), rec, payload, output); err != nil {
			return "", err
		}
	}
	return string(id), nil
}

func (r *durableReader) Task(id string) (*projection.Task, error) {
	if r.task != nil && r.task.ID == id {
		c := *r.task
		return &c, nil
	}
	return readTask(r.ctx, r.pool, r.st, id)
}

func (r *durableReader) Wake(id string) (*projection.Wake, error) {
	if r.wake != nil && r.wake.ID == id {
		c := *r.wake
		return &c, nil
	}
	return readWake(r.ctx, r.pool, r.st, id)
}

// keyHints are the idempotency keys that read-first (ViewDurable) found absent, each with the
// log head its statement read with it: the Update that follows (a new submit) would read the
// key again under the head lock, one round trip per command of the group. The writer takes a
// hint instead when its cache is exact since that head (cache.from <= seq): whatever was
// committed after the read was this writer's own, and its keys are in the cache, which is
// looked at first. So a hint is only ever used where the read it records is still true.
type keyHints struct {
	mu          sync.Mutex
	task, wakes map[skey]uint64
}

// keyHintsMax bounds the hints kept: one whose Update never comes (its caller left) stays
// until the map fills, and is then dropped with the others (a hint only saves a read).
const keyHintsMax = 1 << 14

func (h *keyHints) note(wake bool, k skey, seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := &h.task
	if wake {
		m = &h.wakes
	}
	if *m == nil || len(*m) >= keyHintsMax {
		*m = map[skey]uint64{}
	}
	(*m)[k] = seq
}

// absent takes k's hint and reports whether it says k is absent from the state the cache
// is exact for.
func (h *keyHints) absent(wake bool, k skey, from uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.task
	if wake {
		m = h.wakes
	}
	seq, ok := m[k]
	if ok {
		delete(m, k)
	}
	return ok && seq >= from
}
