package postgres

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

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
	r := &durableReader{ctx: ctx, e: e}
	defer r.end()
	if err := fn(r); err != nil {
		return false, err
	}
	return true, nil
}

// ReadFirst reports whether a keyed Submit (RequestWake: wake) reads its key first
// (readFirst).
func (e *engine) ReadFirst(wake bool) bool { return e.readFirst.first(wake) }

// readFirst decides, per keyed Submit or RequestWake, whether read-first's lookup goes before
// the command (issue 24, W1 from one goroutine). Reading first answers a repeat with one
// statement and no write (W3), but costs a new key a round trip more than the writer's fast
// path, which takes a key the cache does not hold as absent and lets its commit prove it
// (fast.go: the insert of the key row fails on its primary key when the key is stored). A
// repeat met that way costs the failed batch and the ordinary path (about four round trips).
// So a key is read first while the writer's next group cannot take the fast path or its last
// group needed a read (fast: set by the writer after each group; a key read under the lock
// in a claim's group would hold the log head a round trip longer), and for the next
// readFirstAfterRepeat keyed requests of its kind after a repeat was seen: found by a
// read-first, by a fast batch refused on a key's row, or in the writer's cache (one round
// trip either way, but read-first's does not wait for the writer's groups in flight). So
// all-new keys (W1) are one round trip, all repeats (W3) stay a read, and a repeat among new
// keys costs more than a read only once per readFirstAfterRepeat requests.
type readFirst struct {
	fast atomic.Bool     // the writer's next group may run before the lock and its last needed no read
	left [2]atomic.Int64 // keyed requests still to read first: tasks' [0], wakes' [1]
}

const readFirstAfterRepeat = 64

func kindIndex(wake bool) int {
	if wake {
		return 1
	}
	return 0
}

func (p *readFirst) first(wake bool) bool {
	left := &p.left[kindIndex(wake)]
	for {
		n := left.Load()
		if n <= 0 {
			return !p.fast.Load()
		}
		if left.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// repeated notes a repeat seen: the next keyed requests of its kind read first.
func (p *readFirst) repeated(wake bool) { p.left[kindIndex(wake)].Store(readFirstAfterRepeat) }

// durableReader is the projection.Reader of ViewDurable: the key reads and the record reads,
// each a statement through the pool; a key read joins the record, which Task and Wake then
// hand out without another round trip. The scans are not a repeat's and fail.
type durableReader struct {
	ctx  context.Context // the caller's: a key read waits on it (its round ends on Close)
	e    *engine
	task *projection.Task
	wake *projection.Wake

	// stmt is ctx ended by Close too, for a read that is a statement of its own (Task, Wake
	// of a record the key read did not join); made at the first, ended by end. A repeat,
	// whose record comes with its key, never makes it (the allocations of a context and
	// its watch of Close, per duplicate).
	stmt context.Context
	stop context.CancelFunc
}

func (r *durableReader) stmtCtx() context.Context {
	if r.stmt == nil {
		r.stmt, r.stop = r.e.untilClose(r.ctx)
	}
	return r.stmt
}

func (r *durableReader) end() {
	if r.stop != nil {
		r.stop()
	}
}

var _ projection.Reader = (*durableReader)(nil)

var errNotDurableRead = errors.New("postgres: not a read of ViewDurable")

func (r *durableReader) ScanIndex(projection.Index, string, int64, int64, func(projection.IndexEntry) bool) error {
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
	a, err := r.e.keyReads[0].read(r.ctx, r.e, false, skey{sessionID, key})
	if err != nil {
		return "", err
	}
	r.task = nil
	if a.id == nil {
		r.e.hints.note(false, skey{sessionID, key}, uint64(a.seq))
		return "", nil
	}
	if a.rec.rec == nil {
		// A SubmitTx's key whose task is not yet in the log (submittx.go): the command,
		// under the writer, takes it in and answers. No hint: the key is not absent.
		return "", nil
	}
	r.e.readFirst.repeated(false)
	if r.task, err = taskTable.decodeRow(string(a.id), a.rec); err != nil {
		return "", err
	}
	return string(a.id), nil
}

func (r *durableReader) WakeKey(sessionID, key string) (string, error) {
	a, err := r.e.keyReads[1].read(r.ctx, r.e, true, skey{sessionID, key})
	if err != nil {
		return "", err
	}
	r.wake = nil
	if a.id == nil {
		r.e.hints.note(true, skey{sessionID, key}, uint64(a.seq))
		return "", nil
	}
	r.e.readFirst.repeated(true)
	if a.rec.rec != nil {
		if r.wake, err = wakeTable.decodeRow(string(a.id), a.rec); err != nil {
			return "", err
		}
	}
	return string(a.id), nil
}

func (r *durableReader) Task(id string) (*projection.Task, error) {
	if r.task != nil && r.task.ID == id {
		c := *r.task
		return &c, nil
	}
	ctx := r.stmtCtx()
	return readValue(ctx, r.e, func(q querier) (*projection.Task, error) { return taskTable.read(ctx, q, r.e.st.task, id) })
}

func (r *durableReader) Wake(id string) (*projection.Wake, error) {
	if r.wake != nil && r.wake.ID == id {
		c := *r.wake
		return &c, nil
	}
	ctx := r.stmtCtx()
	return readValue(ctx, r.e, func(q querier) (*projection.Wake, error) { return wakeTable.read(ctx, q, r.e.st.wake, id) })
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
// record it names, in one statement (one snapshot); for one key ($1 its session, $2 the key),
// and for many (keyReads: $1 and $2 arrays, a row for each pair in their order, its number
// first).
func keyRecStatements(q func(string) string) (task, wake, tasks, wakes string) {
	one := func(cols, keys, id, recs, as string) string {
		return q(`SELECT h.seq, k.` + id + `, ` + cols + ` FROM {s}.log_head h
			LEFT JOIN {s}.` + keys + ` k ON k.session = $1 AND k.key = $2
			LEFT JOIN {s}.` + recs + ` ` + as + ` ON ` + as + `.id = k.` + id + ` WHERE h.id = 1`)
	}
	many := func(cols, keys, id, recs, as string) string {
		return q(`SELECT u.n, h.seq, k.` + id + `, ` + cols + `
			FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS u(session, key, n)
			CROSS JOIN {s}.log_head h
			LEFT JOIN {s}.` + keys + ` k ON k.session = u.session AND k.key = u.key
			LEFT JOIN {s}.` + recs + ` ` + as + ` ON ` + as + `.id = k.` + id + ` WHERE h.id = 1 ORDER BY u.n`)
	}
	return one("t.rec, t.input", "task_keys", "task_id", "tasks", "t"),
		one("w.rec, w.payload, w.output", "wake_keys", "wake_id", "wakes", "w"),
		many("t.rec, t.input", "task_keys", "task_id", "tasks", "t"),
		many("w.rec, w.payload, w.output", "wake_keys", "wake_id", "wakes", "w")
}

// keyReads coalesces read-first's key reads (issue 24, W3 from 16 goroutines): a read that
// comes while another is on the wire waits for it to end and goes with every other read that
// came meanwhile, in one statement (a round), instead of taking a pooled connection and a
// round trip of its own. So N concurrent duplicates cost about two statements, not N. A round
// runs on its own goroutine (started when a read finds none running, ended when none is left
// to send), on a live pooled connection, outside any transaction, like the lone read it
// replaces: each statement reads committed, durable rows (ViewDurable), in one snapshot taken
// after every read of its round was asked for.
//
// A caller waits for its answer or for its context: one that leaves stops waiting at once,
// and a round whose callers have all left is cancelled (a server that stopped answering holds
// no one beyond their own contexts, as each caller's own read did).
//
// A read that finds no round running and none pending (one goroutine's duplicates, W3 from 1
// goroutine) sends its statement itself, on its own goroutine and context, as a round of one:
// the reads that come meanwhile wait for it as for any round, and the next round, started
// when it ends, takes them. Handing a lone read to a round's goroutine and its answer back
// cost two goroutine switches, a goroutine and a context per duplicate.
type keyReads struct {
	mu      sync.Mutex
	pending []*keyRead
	running int // rounds on the wire (lone reads among them): at most keyRoundsMax
}

// keyRoundsMax is how many rounds of one kind may be on the wire at once. With one, the
// reads' throughput was one round per round trip, whatever the machine had to spare: W3 from
// 16 goroutines left 40% of its two cores idle (2026-12-04, BenchmarkDuplicateSubmit); a
// second round, sent while the first is answered, fills them. A var for the tests that count
// rounds.
var keyRoundsMax = 2

// keyReadsMax bounds the reads of one round.
const keyReadsMax = 1024

// keyRead is one caller's read and, once done is closed, its answer.
type keyRead struct {
	k     skey
	done  chan struct{}
	round *keyRound // set when a round takes the read
	keyAnswer
}

// keyAnswer is a key read's answer: the log head of its snapshot, the id the key names (nil:
// none) and that record's row (rec nil: none).
type keyAnswer struct {
	seq int64
	id  []byte
	rec storedRow
	err error
}

type keyRound struct {
	ctx     context.Context
	cancel  context.CancelFunc
	waiting atomic.Int32 // its callers still waiting
}

// read asks for k's key (wake: a wake key) and waits for the answer.
func (kr *keyReads) read(ctx context.Context, e *engine, wake bool, k skey) (keyAnswer, error) {
	kr.mu.Lock()
	if kr.running < keyRoundsMax && len(kr.pending) == 0 {
		kr.running++
		kr.mu.Unlock()
		return kr.readAlone(ctx, e, wake, k)
	}
	// keyRoundsMax rounds are on the wire, or fewer with reads already waiting for one of
	// them: the next round takes this read. It starts now if there is room for it on the
	// wire, else when a round on the wire ends (rounds, readAlone).
	r := &keyRead{k: k, done: make(chan struct{})}
	kr.pending = append(kr.pending, r)
	if kr.running < keyRoundsMax {
		kr.running++
		go kr.rounds(e, wake)
	}
	kr.mu.Unlock()
	select {
	case <-r.done:
		return r.keyAnswer, r.err
	case <-ctx.Done():
	}
	kr.mu.Lock()
	if i := slices.Index(kr.pending, r); i >= 0 {
		kr.pending = slices.Delete(kr.pending, i, i+1)
		kr.mu.Unlock()
		return keyAnswer{}, ctx.Err()
	}
	round := r.round
	kr.mu.Unlock()
	if round.waiting.Add(-1) == 0 {
		round.cancel()
	}
	select {
	case <-r.done: // answered meanwhile
		return r.keyAnswer, r.err
	default:
		return keyAnswer{}, ctx.Err()
	}
}

// readAlone sends k's read as a round of one on the caller's goroutine (counted in
// kr.running by the caller): its statement ends with ctx, or at Close. It then starts a round
// for the reads that came meanwhile, if any, in its place on the wire.
func (kr *keyReads) readAlone(ctx context.Context, e *engine, wake bool, k skey) (keyAnswer, error) {
	sctx, stop := e.untilClose(ctx)
	answers, err := e.readKeys(sctx, wake, []*keyRead{{k: k}})
	stop()
	kr.mu.Lock()
	more := len(kr.pending) > 0
	if !more {
		kr.running--
	}
	kr.mu.Unlock()
	if more {
		go kr.rounds(e, wake)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return keyAnswer{}, cerr // as a caller that left a round
		}
		return keyAnswer{}, err
	}
	return answers[0], nil
}

// rounds sends rounds until no read is pending.
//
// Before it takes a round's reads it yields (runtime.Gosched): the callers the last round
// answered, and the goroutine that started this one, are runnable but have not yet asked
// again. Yielding lets them run first, up to their next read, so the round takes them all
// instead of one or two, and the next round finds only the stragglers. The other round on the
// wire keeps the server busy meanwhile. BenchmarkDuplicateSubmit/callers=16 (pgtest's server,
// three interleaved rounds, 2026-12-05): 0.29 reads a repeat → 0.16, 39–46k repeats/s →
// 53–56k. A lone read (one caller's repeats) never comes here, so it pays nothing.
func (kr *keyReads) rounds(e *engine, wake bool) {
	for {
		runtime.Gosched()
		kr.mu.Lock()
		n := min(len(kr.pending), keyReadsMax)
		if n == 0 {
			kr.running--
			kr.mu.Unlock()
			return
		}
		batch := slices.Clone(kr.pending[:n])
		kr.pending = slices.Delete(kr.pending, 0, n)
		ctx, cancel := context.WithCancel(e.ctx) // e.ctx ends at Close
		round := &keyRound{ctx: ctx, cancel: cancel}
		round.waiting.Store(int32(n))
		for _, r := range batch {
			r.round = round
		}
		kr.mu.Unlock()
		answers, err := e.readKeys(ctx, wake, batch)
		cancel()
		for i, r := range batch {
			if err != nil {
				r.err = err
			} else {
				r.keyAnswer = answers[i]
			}
			close(r.done)
		}
	}
}

// readKeys reads the keys of one round in one statement: the lone key's statement for one.
func (e *engine) readKeys(ctx context.Context, wake bool, batch []*keyRead) ([]keyAnswer, error) {
	if e.trace != nil {
		e.trace.readKeys(ctx, len(batch))
	}
	cols, one, many := taskTable.cols, e.st.taskKeyRec, e.st.taskKeysRec
	if wake {
		cols, one, many = wakeTable.cols, e.st.wakeKeyRec, e.st.wakeKeysRec
	}
	if len(batch) == 1 {
		var a keyAnswer
		k := batch[0].k
		err := queryRow(ctx, e, one, []any{[]byte(k.session), []byte(k.key)}, keyAnswerDest(&a, cols)...)
		return []keyAnswer{a}, err
	}
	ss, ks := make([][]byte, len(batch)), make([][]byte, len(batch))
	for i, r := range batch {
		ss[i], ks[i] = []byte(r.k.session), []byte(r.k.key)
	}
	var out []keyAnswer
	err := e.run(ctx, func(q querier) error {
		rows, err := q.Query(ctx, many, ss, ks)
		if err != nil {
			return err
		}
		out, err = collectKeyAnswers(rows, cols, len(batch)) // the read may run again on another connection
		return err
	})
	return out, err
}

// keyAnswerDest is the scan destinations of a key read's row into a (the record table's
// cols columns after its rec), after pre.
func keyAnswerDest(a *keyAnswer, cols int, pre ...any) []any {
	a.rec.cols = make([][]byte, cols)
	dest := append(pre, &a.seq, &a.id, &a.rec.rec)
	for i := range a.rec.cols {
		dest = append(dest, &a.rec.cols[i])
	}
	return dest
}

// collectKeyAnswers reads the rows of a statement of many key reads (keyRecStatements'
// tasks or wakes), checking that they answer the want reads each once, in order.
func collectKeyAnswers(rows pgx.Rows, cols, want int) ([]keyAnswer, error) {
	defer rows.Close()
	out := make([]keyAnswer, 0, want)
	for rows.Next() {
		var n int64
		var a keyAnswer
		if err := rows.Scan(keyAnswerDest(&a, cols, &n)...); err != nil {
			return nil, err
		}
		if n != int64(len(out)+1) {
			return nil, fmt.Errorf("postgres: key read %d of %d answered as %d", len(out)+1, want, n)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != want {
		return nil, fmt.Errorf("postgres: %d key reads answered of %d", len(out), want)
	}
	return out, nil
}
