package postgres

import (
	"context"
	"errors"
	"sync"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
)

var _ engineapi.DurableViewer = (*engine)(nil)

// ViewDurable answers reads of committed state outside the writer and without a
// transaction, each read one statement on a live pooled connection: work's read-first path
// for an idempotent repeat (issue 24, W3). Committed is durable here: with
// synchronous_commit on (the default) a transaction becomes visible to other sessions only
// after its commit record is flushed (and, with a synchronous standby, confirmed by it), and
// the writer answers a group's callers only after its COMMIT returned. (With
// synchronous_commit off an acknowledged Update is not durable either.) The reads are not
// one snapshot, which a repeat does not need: TaskKey and WakeKey read the key and the record
// it names in one statement, one round trip for the whole repeat.
func (e *engine) ViewDurable(ctx context.Context, fn func(projection.Reader) error) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if e.isClosed() {
		return false, errClosed()
	}
	ctx, stop := e.untilClose(ctx)
	defer stop()
	if err := fn(&durableReader{ctx: ctx, e: e}); err != nil {
		return false, err
	}
	return true, nil
}

// durableReader is the projection.Reader of ViewDurable: the key reads and the record reads,
// each a statement through the pool; a key read joins the record, which Task and Wake then
// hand out without another round trip. The scans are not a repeat's and fail.
type durableReader struct {
	ctx  context.Context
	e    *engine
	task *projection.Task
	wake *projection.Wake
}

var _ projection.Reader = (*durableReader)(nil)

var errNotDurableRead = errors.New("postgres: not a read of ViewDurable")

func (r *durableReader) ScanIndex(projection.Index, string, int64, func(projection.IndexEntry) bool) error {
	return errNotDurableRead
}

func (r *durableReader) ScanSessionTasks(string, uint64, func(uint64, string) bool) error {
	return errNotDurableRead
}

func (r *durableReader) Counts(func(string, events.TaskState, int64) bool) error {
	return errNotDurableRead
}

func (r *durableReader) LastSeq() (uint64, error) { return 0, errNotDurableRead }

func (r *durableReader) Schedule(string, string) (*projection.Schedule, error) {
	return nil, errNotDurableRead
}

func (r *durableReader) ScanSessionSchedules(string, func(*projection.Schedule) bool) error {
	return errNotDurableRead
}

func (r *durableReader) ScanScheduleDue(int64, func(projection.ScheduleEntry) bool) error {
	return errNotDurableRead
}

func (r *durableReader) KindPolicy(string) (*projection.KindPolicy, error) {
	return nil, errNotDurableRead
}

func (r *durableReader) KindPolicies(func(*projection.KindPolicy) bool) error {
	return errNotDurableRead
}

func (r *durableReader) ScanKindLeases(string, int64, func(projection.IndexEntry) bool) error {
	return errNotDurableRead
}

func (r *durableReader) TaskKey(sessionID, key string) (string, error) {
	var seq int64
	var id []byte
	s := storedRow{cols: make([][]byte, taskTable.cols)}
	err := queryRow(r.ctx, r.e, r.e.st.taskKeyRec, []any{[]byte(sessionID), []byte(key)}, &seq, &id, &s.rec, &s.cols[0])
	if err != nil {
		return "", err
	}
	r.task = nil
	if id == nil {
		r.e.hints.note(false, skey{sessionID, key}, uint64(seq))
		return "", nil
	}
	if s.rec != nil {
		if r.task, err = taskTable.decodeRow(string(id), s); err != nil {
			return "", err
		}
	}
	return string(id), nil
}

func (r *durableReader) WakeKey(sessionID, key string) (string, error) {
	var seq int64
	var id []byte
	s := storedRow{cols: make([][]byte, wakeTable.cols)}
	err := queryRow(r.ctx, r.e, r.e.st.wakeKeyRec, []any{[]byte(sessionID), []byte(key)}, &seq, &id, &s.rec, &s.cols[0], &s.cols[1])
	if err != nil {
		return "", err
	}
	r.wake = nil
	if id == nil {
		r.e.hints.note(true, skey{sessionID, key}, uint64(seq))
		return "", nil
	}
	if s.rec != nil {
		if r.wake, err = wakeTable.decodeRow(string(id), s); err != nil {
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
	return readValue(r.ctx, r.e, func(q querier) (*projection.Task, error) { return taskTable.read(r.ctx, q, r.e.st.task, id) })
}

func (r *durableReader) Wake(id string) (*projection.Wake, error) {
	if r.wake != nil && r.wake.ID == id {
		c := *r.wake
		return &c, nil
	}
	return readValue(r.ctx, r.e, func(q querier) (*projection.Wake, error) { return wakeTable.read(r.ctx, q, r.e.st.wake, id) })
}

// keyHints are the idempotency keys that read-first (ViewDurable) found absent, each with the
// log head its statement read in the same snapshot. The command that follows the miss (a new
// submit) would read the key again under the head lock, one round trip per command of the
// group while every other writer waits. The writer takes a hint instead when its cache is
// exact since that head (cache.from <= the hint's head): whatever was committed after the
// read was this writer's own, and its keys are in the cache, which is looked at first. So a
// hint is only ever taken where the read it records is still true.
type keyHints struct {
	mu           sync.Mutex
	tasks, wakes map[skey]uint64
}

// keyHintsMax bounds the hints kept: one whose command never comes (its caller left) stays
// until the map fills, and is then dropped with the others (a hint only saves a read).
const keyHintsMax = 1 << 14

func (h *keyHints) note(wake bool, k skey, seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := &h.tasks
	if wake {
		m = &h.wakes
	}
	if *m == nil || len(*m) >= keyHintsMax {
		*m = map[skey]uint64{}
	}
	(*m)[k] = seq
}

// absent takes k's hint, if any, and reports whether it says k is absent from the state the
// writer's cache is exact since (from).
func (h *keyHints) absent(wake bool, k skey, from uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.tasks
	if wake {
		m = h.wakes
	}
	seq, ok := m[k]
	if ok {
		delete(m, k)
	}
	return ok && seq >= from
}

// keyRecStatements are the durable reader's key reads: the log head, the key's id and the
// record it names, in one statement (one snapshot).
func keyRecStatements(q func(string) string) (task, wake string) {
	return q(`SELECT h.seq, k.task_id, t.rec, t.input FROM {s}.log_head h
			LEFT JOIN {s}.task_keys k ON k.session = $1 AND k.key = $2
			LEFT JOIN {s}.tasks t ON t.id = k.task_id WHERE h.id = 1`),
		q(`SELECT h.seq, k.wake_id, w.rec, w.payload, w.output FROM {s}.log_head h
			LEFT JOIN {s}.wake_keys k ON k.session = $1 AND k.key = $2
			LEFT JOIN {s}.wakes w ON w.id = k.wake_id WHERE h.id = 1`)
}
