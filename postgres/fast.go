package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/projection"
)

// One round trip for a group the cache can answer (issue 24 §1, W1 from one goroutine).
//
// A group costs two round trips: the begin batch (BEGIN, the head's lock, the greatest ids)
// and the commit batch. When the writer's cache is exact (no other writer committed since
// its last group: cache.alone) the group's closures can run before the lock, against the
// cache alone; when none of them needs a read, the writes are known before the transaction
// begins, and one batch carries everything: BEGIN, the head's lock, a check that the head is
// still the cache's (checkHead raises an error otherwise, which aborts the rest of the batch,
// COMMIT included), the writes, the commit mark and COMMIT. Sequence numbers were taken from
// the cache's head, which the check proves is the head the transaction locked.
//
// The run before the lock reads nothing from the server: the txn is optimistic, a read the
// cache cannot answer is refused (errNeedsRead, needRead) but for an idempotency key, which
// is taken as absent and proven by the batch's insert of its row (keysProven, and design.md
// §9 "A new key, unread"), and its statements get a context
// that has already ended, so a statement of any other file (kind policies, schedules, the
// inbox, a prune) fails before anything is sent (pgconn checks the context first). Every
// change the run makes to the cache is saved first (cacheUndo), so a run that needed a read,
// whose closure failed, or whose batch the server refused, is taken back and the group runs
// the ordinary way (attempt) — its closures run again, which Engine.Update's contract
// allows (only the last run counts). A group that wrote nothing needs no transaction: one
// read of the head proves the cache's answers were current when it was read.
//
// Failures of the one batch, each answered as the ordinary path's commit batch is:
//   - an ERROR on an open connection (the check: another writer committed; or the server
//     refused a write): the transaction rolled back; the group runs the ordinary way, which
//     catches the cache up or re-runs its commands alone;
//   - nothing sent (pgconn.SafeToRetry), or the connection closed (a dead pooled connection,
//     a lost connection, FATAL): resolved from the commit mark as the ordinary path does;
//     committed is a success, unknown is ErrCommitUnknown, and not committed runs the group
//     the ordinary way (which begins on a live connection: onLive).
//
// The fast path is not taken with engine.ordinaryCommits: the tests that set it
// (commit_test.go, failure_test.go, frozen_test.go) inject failures into the ordinary path;
// the fast path's own are in fast_test.go.

// errNeedsRead fails a read of a group run before the lock: it needs the server.
var errNeedsRead = errors.New("postgres: the group needs a read under the log head's lock")

// refuseRead marks the optimistic group as needing a read and fails the read.
func (t *txn) refuseRead() error {
	t.needRead = true
	return errNeedsRead
}

// prior is a cache entry before an optimistic group changed it.
type prior[V any] struct {
	v  V
	ok bool
}

// cacheUndo holds the cache's entries as they were before an optimistic group first changed
// each; nil (the ordinary path) saves nothing.
type cacheUndo struct {
	tasks    map[string]prior[*projection.Task]
	wakes    map[string]prior[*projection.Wake]
	taskKeys map[skey]prior[string]
	wakeKeys map[skey]prior[string]
}

func newCacheUndo() *cacheUndo {
	return &cacheUndo{
		tasks: map[string]prior[*projection.Task]{}, wakes: map[string]prior[*projection.Wake]{},
		taskKeys: map[skey]prior[string]{}, wakeKeys: map[skey]prior[string]{},
	}
}

func save[K comparable, V any](u map[K]prior[V], m map[K]V, k K) {
	if _, done := u[k]; done {
		return
	}
	v, ok := m[k]
	u[k] = prior[V]{v, ok}
}

func restore[K comparable, V any](u map[K]prior[V], m map[K]V) {
	for k, p := range u {
		if p.ok {
			m[k] = p.v
		} else {
			delete(m, k)
		}
	}
}

func (u *cacheUndo) task(c *cache, id string) {
	if u != nil {
		save(u.tasks, c.tasks, id)
	}
}

func (u *cacheUndo) wake(c *cache, id string) {
	if u != nil {
		save(u.wakes, c.wakes, id)
	}
}

func (u *cacheUndo) key(c *cache, wake bool, k skey) {
	switch {
	case u == nil:
	case wake:
		save(u.wakeKeys, c.wakeKeys, k)
	default:
		save(u.taskKeys, c.taskKeys, k)
	}
}

// takeBack restores the cache as it was before the optimistic group tx ran. A group that
// deleted records or keys (a prune: never without a read first) is not taken back entry by
// entry: the cache starts over.
func (e *engine) takeBack(tx *txn) {
	c := tx.c
	if tx.pruned || len(tx.delTasks)+len(tx.delWakes)+len(tx.delTaskKeys)+len(tx.delWakeKeys) > 0 {
		e.cache = newCache()
		return
	}
	restore(tx.undo.tasks, c.tasks)
	restore(tx.undo.wakes, c.wakes)
	restore(tx.undo.taskKeys, c.taskKeys)
	restore(tx.undo.wakeKeys, c.wakeKeys)
	c.valid = true
}

// fastOK reports whether the next group may run before the lock.
func (e *engine) fastOK() bool {
	return e.cache.valid && e.cache.alone && e.cache.last != nil && !e.savepointEach && !e.ordinaryCommits
}

// ended is a context that has ended: the optimistic group's statements fail before they are sent.
var ended = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// attemptFast runs the group before the lock and commits it in one round trip. done is
// false when the group must run the ordinary way (nothing of it is in the database then);
// otherwise out, ran and err are attempt's.
func (e *engine) attemptFast(ctx context.Context, group []*command, reads *claimReads) (out groupOutcome, ran []*command, err error, done bool) {
	start := time.Now()
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return 0, nil, nil, false
	}
	defer conn.Release() // a closed connection is dropped by the pool
	c := e.cache
	c.valid = false // until the group commits, or is taken back
	tx := newTxn(ended, conn.Conn(), e.st, c)
	tx.optimistic, tx.undo, tx.hints, tx.rf = true, newCacheUndo(), &e.hints, &e.readFirst
	tx.seq, tx.startSeq, tx.prunes = c.seq, c.seq, c.prunes
	tx.maxTask, tx.maxWake, tx.last = c.maxTask, c.maxWake, c.last
	e.useClaimReads(tx, reads, c) // a claim's reads at the cache's head (claimpre.go)
	ran = make([]*command, 0, len(group))
	for _, cm := range group {
		ferr, ok := cm.runWithin(ended, tx)
		if !ok {
			continue
		}
		ran = append(ran, cm)
		if ferr != nil && (cm.ctx == nil || cm.ctx.Err() == nil) && errors.Is(ferr, context.Canceled) {
			tx.needRead = true // a statement of another file, failed on the ended context
		}
		if ferr != nil || tx.needRead {
			e.takeBack(tx)
			e.head.fastMissed(tx.needRead, false)
			if !tx.needRead && !errors.Is(ferr, context.Canceled) && !errors.Is(ferr, context.DeadlineExceeded) && len(group) > 1 {
				// A closure failed on its own (not for a read refused before the lock):
				// as in the ordinary path, each command runs again alone, and a lone one
				// that fails here runs the ordinary way, so that its error is decided
				// under the lock.
				return fnFailed, ran, ferr, true
			}
			return 0, nil, nil, false
		}
	}
	if !tx.keysProven() {
		// A key taken as absent that the group does not insert: nothing would prove it.
		e.takeBack(tx)
		e.head.fastMissed(true, false)
		return 0, nil, nil, false
	}
	wrote := tx.seq != tx.startSeq || tx.pruned || tx.sideWrites || len(tx.evs) > 0
	if !wrote {
		// Every answer came from the cache: current if the head is still the cache's.
		var seq, prunes int64
		var last []byte
		err := conn.QueryRow(ctx, e.st.headNow).Scan(&seq, &prunes, &last)
		if err != nil || uint64(seq) != c.seq || uint64(prunes) != c.prunes || !bytes.Equal(last, c.last) {
			e.takeBack(tx)
			c.alone, e.alone = false, 0
			e.head.fastMissed(false, true)
			return 0, nil, nil, false
		}
		e.head.fast.Add(1)
		e.adopt(tx)
		return committed, ran, nil, true
	}
	b := &pgx.Batch{}
	tx.ctx = ctx
	copied := tx.copyWanted()
	if copied {
		// A large group (a SubmitMany): its rows go by COPY (copy.go), which no batch can
		// carry. BEGIN, the lock and the check take a round trip of their own, then the
		// COPYs, then the commit batch: the ordinary path's round trips, without running
		// the closures a second time under the lock.
		if done := e.beginFastCopy(conn, tx, c); !done {
			return 0, nil, nil, false
		}
	} else {
		b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
		b.Queue(e.st.lockHead)
		b.Queue(e.st.checkHead, int64(c.seq), int64(c.prunes), c.last)
	}
	tx.queueCommit(b, e.queueNotify)
	e.mark.n++
	b.Queue(e.st.setMark, e.mark.id, e.mark.n)
	var didCommit bool
	var next *claimReads
	if !copied {
		next = e.queueCommitAndClaimReads(b, &didCommit) // the next claim's, after the COMMIT (claimpre.go)
	} else {
		b.Queue("COMMIT")
	}
	if e.trace != nil {
		e.trace.sendingCommit(conn.Conn(), b, true)
	}
	locked := time.Now()
	cerr := conn.Conn().SendBatch(ctx, b).Close()
	if cerr != nil && didCommit {
		// The claim reads after the COMMIT failed; the group committed.
		rollback(conn)
		cerr, next = nil, nil
	}
	if cerr == nil {
		e.head.record(start, locked, time.Now(), 0)
		e.head.fast.Add(1)
		e.adopt(tx)
		e.claimReads = next
		e.plan.learn(tx)
		e.alone++
		return committed, ran, nil, true
	}
	if rolledBack(conn.Conn(), cerr) {
		// The check (another writer committed) or a write the server refused: run the
		// group the ordinary way, which catches up or re-runs the commands alone.
		rollback(conn)
		e.takeBack(tx)
		e.keyStored(cerr)
		var pe *pgconn.PgError
		stale := errors.As(cerr, &pe) && pe.Code == "22012" // checkHead's division by zero
		if stale {
			e.cache.alone = false
			e.alone = 0
		}
		e.head.fastMissed(false, stale)
		return 0, nil, nil, false
	}
	conn.Conn().Close(context.Background())
	if pgconn.SafeToRetry(cerr) { // nothing of the batch was sent
		e.takeBack(tx)
		e.head.fastMissed(false, false)
		return 0, nil, nil, false
	}
	// The connection failed while the batch or its answers were on the wire: the transaction
	// may have committed. Never run the group again before its mark says it did not.
	e.cache = newCache()
	ok, rerr := e.resolve(e.mark.id, e.mark.n)
	if rerr != nil {
		return notCommitted, ran, backendError(fmt.Errorf("%w: %v (the connection failed during COMMIT: %v)", ErrCommitUnknown, rerr, cerr)), true
	}
	if ok {
		e.head.fast.Add(1)
		return committed, ran, nil, true
	}
	e.head.fastMissed(false, false)
	return 0, nil, nil, false // not committed: run the group the ordinary way, on a live connection
}

// beginFastCopy begins a large group's transaction on conn (BEGIN, the lock, the check of
// the head, one round trip) and sends its COPYs. false: nothing of the group is in the
// database (the transaction rolled back, or its connection closed before any COMMIT was
// sent), the cache is as before the group, and the group must run the ordinary way.
func (e *engine) beginFastCopy(conn *pgxpool.Conn, tx *txn, c *cache) bool {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(e.st.lockHead)
	b.Queue(e.st.checkHead, int64(c.seq), int64(c.prunes), c.last)
	err := conn.Conn().SendBatch(tx.ctx, b).Close()
	if err == nil {
		err = tx.copyLarge()
	}
	if err == nil {
		return true
	}
	var pe *pgconn.PgError
	stale := errors.As(err, &pe) && pe.Code == "22012" // checkHead's division by zero
	if rolledBack(conn.Conn(), err) {
		rollback(conn)
		e.keyStored(err)
	} else {
		conn.Conn().Close(context.Background()) // no COMMIT was sent: nothing committed
	}
	e.takeBack(tx)
	if stale {
		c.alone = false
		e.alone = 0
	}
	e.head.fastMissed(false, stale)
	return false
}

// keysProven reports whether the group inserts every key it took as absent unread
// (cachedKey): the batch's INSERT (or COPY) of a key's row fails on the primary key of
// task_keys (wake_keys) when the key is stored, committed or not, which aborts the batch,
// COMMIT included. So a group commits only where each key it took as absent was absent. Only
// the group's PutTaskKey (PutWakeKey) sets a key taken as absent in the cache, and it also
// queues the key's row; a key the group takes as absent and then does not insert (no command
// does today) sends the group the ordinary way, which reads it under the lock.
func (t *txn) keysProven() bool {
	for _, u := range t.unread {
		m := t.c.taskKeys
		if u.wake {
			m = t.c.wakeKeys
		}
		if m[u.k] == "" {
			return false
		}
	}
	return true
}

// keyStored notes a fast batch refused for a key the group took as absent and found stored
// (the primary key of task_keys or wake_keys, 23505): a repeat, which read-first answers more
// cheaply for a while (readFirst).
func (e *engine) keyStored(err error) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" {
		return
	}
	switch pe.TableName {
	case "task_keys":
		e.readFirst.repeated(false)
	case "wake_keys":
		e.readFirst.repeated(true)
	default:
		return
	}
	e.head.fastKey.Add(1)
}

// headStatements are the fast path's reads of the head: its value (a group that wrote
// nothing), and the check in the one batch, an ERROR (division by zero, 22012) unless the
// head is still the cache's — its seq, its prunes, and its event (cache.last: the same
// history). The check is a statement of its own after the lock: in READ COMMITTED its
// snapshot is taken after the lock was granted, so it reads the head's last committed
// value, which no writer can change before this transaction ends.
//
// Both also require that no decided SubmitTx waits in the inbox (submittx.go): its task is
// in no table the cache or the claim reads answer from, and a group that commits must have
// decided after taking it in (begin). now reads the head as -1 then, which no cache holds.
func headStatements(q func(string) string) (now, check string) {
	return q(fmt.Sprintf(`SELECT CASE WHEN `+inboxWaiting+` THEN -1 ELSE h.seq END, h.prunes, substring(e.body for %d)
			FROM {s}.log_head h LEFT JOIN {s}.events e ON e.seq = h.seq WHERE h.id = 1`, lastLen)),
		q(fmt.Sprintf(`SELECT 1 / (CASE WHEN h.seq = $1 AND h.prunes = $2 AND substring(e.body for %d) = $3
			AND NOT `+inboxWaiting+` THEN 1 ELSE 0 END) FROM {s}.log_head h LEFT JOIN {s}.events e ON e.seq = h.seq WHERE h.id = 1`, lastLen))
}
