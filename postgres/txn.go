package postgres

import (
	"context"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

type skey struct{ session, key string }

// keyOf is a task's key, or a wake's.
type keyOf struct {
	wake bool
	k    skey
}

type countKey struct {
	kind  string
	state events.TaskState
}

// cache is what the writer knows of the stored state as of log sequence seq: records and
// keys it read or wrote, absent ones included (nil, ""). While the log head still reads seq
// when the writer locks it, no other process has written since, and every entry is exact;
// otherwise the writer catches it up with the events appended since (catchup.go: the
// entries they name are dropped, the keys they wrote added), or, when it cannot (a prune,
// too many events), starts from an empty cache. It belongs to the writer goroutine.
type cache struct {
	seq      uint64
	prunes   uint64 // log_head.prunes: a prune changes records without moving the log head
	valid    bool
	from     uint64 // exact since: every key committed after log sequence from is here (this writer's, or caught up)
	tasks    map[string]*projection.Task
	wakes    map[string]*projection.Wake
	taskKeys map[skey]string
	wakeKeys map[skey]string

	// last: the first bytes of the event at seq (nil: none, or not known), which identify the
	// history the cache is of. A failover to a standby that lost commits can leave a log
	// whose head is at or past seq with other events at and below it: the cache is kept or
	// caught up only while the event at seq is still this one (catchup.go, fast.go).
	last []byte
	// alone: the last begin found no other writer's commit since the cache's head (fast.go).
	alone bool
	// maxTask, maxWake: every stored id not in the cache is at most these (adopt): the bound
	// of txn.maxTask for a group run before the lock (fast.go).
	maxTask, maxWake string
}

// cacheMax bounds the entries kept from one group to the next; cacheValueMax the value bytes
// a record may hold and still be kept (a large input is read again rather than held).
const (
	cacheMax      = 1 << 15
	cacheValueMax = 4 << 10
)

func newCache() *cache {
	return &cache{
		tasks: map[string]*projection.Task{}, wakes: map[string]*projection.Wake{},
		taskKeys: map[skey]string{}, wakeKeys: map[skey]string{},
	}
}

func (c *cache) size() int { return len(c.tasks) + len(c.wakes) + len(c.taskKeys) + len(c.wakeKeys) }

// idxOp is a pending write of one index entry. Put and delete of one key in one group net
// out (Apply never puts an entry that exists, so a put then a delete leaves nothing); a delete
// then a put replaces the stored entry (replaces: the flush deletes it before the put), and a
// delete after that is a delete again.
type idxOp struct {
	put      bool
	replaces bool // put over a pending delete (the eligibility indexes; the retention index, which upserts, too)
	id       string
	wake     bool  // the retention index's entries only
	pri      int64 // the due indexes' entries only: the task's priority
}

type dueKey struct {
	at  int64
	seq uint64
}

type sessKey struct {
	session string
	seq     uint64
}

type pendingEvent struct {
	seq     uint64
	session string
	typ     events.Type
	body    []byte
	subject string // the task or wake the event is about (events.Event.Subject)
}

// txn is one group's transaction: projection.State over the tables, with every write kept
// in memory until the commit (records once each, in their last version; index entries
// netted; counts summed) and sent with it in one round trip. Reads look at the group's
// writes and the cache first; an index scan first sends the pending index writes, in the
// same round trip as the scan.
type txn struct {
	ctx   context.Context
	conn  *pgx.Conn
	st    *statements
	c     *cache
	hints *keyHints // the keys read-first found absent (readfirst.go); nil: none
	trace tracer    // engine.trace
	reads int       // records and keys read from the server (headStats)
	// big: the records put into the cache by this group (read or written) whose values
	// exceed cacheValueMax, which adopt takes out of the cache at the group's end. Noted as
	// they enter, so that adopt looks at them alone, not at every cached record: a walk of
	// the whole cache (up to cacheMax entries) at each group was most of a lone Submit's
	// client CPU.
	big []bigRecord

	// optimistic: the group runs before the lock, against the cache alone (fast.go): a read
	// the cache cannot answer fails with errNeedsRead and sets needRead, and every change to
	// the cache is saved in undo first, so that the run can be taken back.
	optimistic bool
	needRead   bool
	undo       *cacheUndo
	// unread: the keys the optimistic group took as absent without a read (cachedKey); the
	// group's insert of each proves it (fast.go: keysProven).
	unread []keyOf
	rf     *readFirst // told of the repeats the optimistic group's cache answers (readfirst.go)

	// pre: what the begin read for the group's claims (claimpre.go), nil when it read none;
	// scans: the due index partitions the group scanned, and the entries each gave (the plan).
	pre   *prefetched
	scans map[preKey]int

	seq        uint64 // the last sequence, the group's appends included
	last       []byte // the first bytes of the event at startSeq, read by the begin (cache.last)
	startSeq   uint64 // the log head when the group began
	prunes     uint64 // log_head.prunes, counted up by a prune of this group
	pruned     bool   // a prune ran in this group: the commit writes prunes
	sideWrites bool   // a statement of the group wrote rows no event accounts for (inbox, schedules)
	// maxTask, maxWake: the greatest ids stored when the group began (read under the head
	// lock, so no other writer adds one while the group runs). An id above them has no
	// stored record, and one put by the group is in the cache: so such an id needs no read.
	// They do not grow with the group's own puts, whose ids (UUIDv7, random within a
	// millisecond) would then put the next new id of the same millisecond below them half
	// the time and cost it a read under the head lock: one per task of a SubmitMany.
	maxTask, maxWake string

	newTasks, dirtyTasks map[string]bool
	newWakes, dirtyWakes map[string]bool
	newTaskKeys          []skey
	reserved             map[skey]string // keys whose rows SubmitTx stored, for their tasks taken in (submittx.go)
	tookIn               bool            // the group took decided submissions in: signal local waiters at its commit
	inboxWaiting         bool            // begin found a decided submission waiting (submittx.go)
	newWakeKeys          []skey
	idx                  [projection.NumIndexes]map[idxKey]idxOp // index.go
	pols                 map[string]*projection.KindPolicy
	polDirty             map[string]bool
	sessions             []sessKey
	sessionIDs           []string
	counts               map[countKey]int64
	evs                  []pendingEvent
	evsCopied            bool   // copyLarge inserted evs: the commit batch does not
	bodies               []byte // the last buffer of evs' encodings, one after another (Append)
	evBytes              int    // the bytes of evs' encodings

	// Retention (prune.go): deletions of stored rows, and the retention index's writes.
	delTasks, delWakes       map[string]bool
	delTaskKeys, delWakeKeys []skey
	delSessions              []sessKey
	prunable                 map[dueKey]idxOp

	scheds     map[skey]*projection.Schedule // schedules read or written by the group (schedules.go)
	schedDirty map[skey][]byte               // of them, those written and not yet sent (their JSON)
}

var _ projection.State = (*txn)(nil)

func newTxn(ctx context.Context, conn *pgx.Conn, st *statements, c *cache) *txn {
	t := &txn{
		ctx: ctx, conn: conn, st: st, c: c,
		newTasks: map[string]bool{}, dirtyTasks: map[string]bool{},
		newWakes: map[string]bool{}, dirtyWakes: map[string]bool{},
		counts: map[countKey]int64{}, prunable: map[dueKey]idxOp{},
	}
	for ix := range t.idx {
		t.idx[ix] = map[idxKey]idxOp{}
	}
	return t
}

// Append gives ev the next sequence number, folds it into the state and keeps its encoding
// for the commit. A rejected event changes nothing.
func (t *txn) Append(ev events.Event) error {
	h := ev.Head()
	h.Seq = t.seq + 1
	// The encodings share buffers (bodies, the last one), each body a full slice of one:
	// small events fill a buffer together instead of growing one of their own each. A full
	// buffer is never grown (append would copy it, and the bodies before, slices of the old
	// array, would keep that alive too: 5x a batch's bytes): the event goes to a new one.
	if err := t.roomFor(ev); err != nil {
		return err
	}
	from := len(t.bodies)
	buf, err := events.Append(t.bodies, ev)
	if err != nil {
		return err
	}
	t.bodies = buf
	t.evBytes += len(buf) - from
	body := buf[from:len(buf):len(buf)]
	if err := projection.Apply(t, ev); err != nil {
		return err
	}
	taskID, wakeID := ev.Subject() // one of them is set
	t.evs = append(t.evs, pendingEvent{seq: h.Seq, session: h.SessionID, typ: ev.Type(), body: body, subject: taskID + wakeID})
	return nil
}

// bodyChunk bounds the buffers small events share (txn.roomFor); bodySlack is what an
// event may take beyond its values before roomFor sizes it exactly.
const (
	bodyChunk = 1 << 20
	bodySlack = 2 << 10
)

// roomFor makes sure ev's encoding fits in what is left of t.bodies, starting a new buffer
// when it may not: of twice the last one's size (4 KiB to bodyChunk), or ev's exact size if
// larger. The old buffer is left to the bodies that are slices of it.
func (t *txn) roomFor(ev events.Event) error {
	left := cap(t.bodies) - len(t.bodies)
	if events.ValueLen(ev)+bodySlack <= left {
		return nil
	}
	n, err := events.EncodedLen(ev)
	if err != nil || n <= left {
		return err
	}
	t.bodies = make([]byte, 0, max(n, min(max(2*cap(t.bodies), 4<<10), bodyChunk)))
	return nil
}

// --- reads ---

func (t *txn) Task(id string) (*projection.Task, error) { return t.EditTask(id) }
func (t *txn) Wake(id string) (*projection.Wake, error) { return t.EditWake(id) }

// EditTask returns a copy of the record: TaskEdited stores the copy back.
func (t *txn) EditTask(id string) (*projection.Task, error) {
	return editRecord(t, taskTable, t.st.task, t.maxTask, id)
}

func (t *txn) EditWake(id string) (*projection.Wake, error) {
	return editRecord(t, wakeTable, t.st.wake, t.maxWake, id)
}

// editRecord returns a copy of the record of id, from the cache or read (sql) into it; an
// id above maxID, every stored one, has no record (ids are UUIDv7).
func editRecord[R any](t *txn, tb *recordTable[R], sql, maxID, id string) (*R, error) {
	m := tb.cached(t.c)
	r, ok := m[id]
	if !ok {
		if id > maxID {
			return nil, nil
		}
		if t.optimistic {
			return nil, t.refuseRead()
		}
		if t.trace != nil {
			t.trace.readRecord()
		}
		t.reads++
		var err error
		if r, err = tb.read(t.ctx, t.conn, sql, id); err != nil {
			return nil, err
		}
		m[id] = r
		noteBig(t, tb, r)
	}
	if r == nil {
		return nil, nil
	}
	c := *r
	return &c, nil
}

func (t *txn) TaskKey(sessionID, key string) (string, error) {
	return t.cachedKey(false, t.c.taskKeys, t.st.taskKey, sessionID, key)
}

func (t *txn) WakeKey(sessionID, key string) (string, error) {
	return t.cachedKey(true, t.c.wakeKeys, t.st.wakeKey, sessionID, key)
}

// cachedKey reads a key from the cache, else from a hint of read-first that is still true
// (keyHints), else from the table. A group run before the lock takes the key as absent
// instead, unread: its commit must prove it (fast.go).
func (t *txn) cachedKey(wake bool, m map[skey]string, sql, sessionID, key string) (string, error) {
	k := skey{sessionID, key}
	if id, ok := m[k]; ok {
		if id != "" && t.optimistic {
			t.repeated(wake, k)
		}
		return id, nil
	}
	if t.hints != nil && t.hints.absent(wake, k, t.c.from) {
		t.undo.key(t.c, wake, k)
		m[k] = ""
		return "", nil
	}
	if t.optimistic {
		t.undo.key(t.c, wake, k)
		m[k] = ""
		t.unread = append(t.unread, keyOf{wake, k})
		return "", nil
	}
	t.reads++
	id, err := readKey(t.ctx, t.conn, sql, sessionID, key)
	if err == nil {
		m[k] = id
	}
	return id, err
}

// repeated tells readFirst of a repeat the optimistic group's cache answered: a key stored
// before the group, not one an earlier command of the group put (a SubmitMany's key repeated
// in the batch).
func (t *txn) repeated(wake bool, k skey) {
	u := t.undo.taskKeys
	if wake {
		u = t.undo.wakeKeys
	}
	if _, mine := u[k]; !mine && t.rf != nil {
		t.rf.repeated(wake)
	}
}

func (t *txn) LastSeq() (uint64, error) { return t.seq, nil }

// flushIndexes queues the pending index writes into b, so that a scan sent after them in
// the same batch sees the group's own changes.
func (t *txn) flushIndexes(b *pgx.Batch) {
	t.flushPrune(b)
	t.queueIndexes(b)
	t.flushKindPolicies(b)
	t.flushSchedules(b)
	if len(t.sessions) > 0 {
		ss, qs := make([][]byte, len(t.sessions)), make([]int64, len(t.sessions))
		ids := make([][]byte, len(t.sessions))
		for i, s := range t.sessions {
			ss[i], qs[i], ids[i] = []byte(s.session), int64(s.seq), []byte(t.sessionIDs[i])
		}
		queueRows(b, t.st, t.st.insSession, ss, qs, ids)
		t.sessions, t.sessionIDs = t.sessions[:0], t.sessionIDs[:0]
	}
}

// txnPage runs one page's query in the round trip that first sends the group's pending
// index writes, so that the page sees the group's own changes.
func txnPage[R any](t *txn, scan func(pgx.Rows) (R, error), sql string, args ...any) ([]R, error) {
	if t.optimistic {
		return nil, t.refuseRead()
	}
	b := &pgx.Batch{}
	t.flushIndexes(b)
	var out []R
	b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		var err error
		out, err = collect(rows, scan)
		return err
	})
	return out, t.conn.SendBatch(t.ctx, b).Close()
}

// scanJoined runs a paged scan of an index whose rows join tb's records (first and next: the
// statements for the first page and the next ones; pre: the kind scan's kind), keeping the
// records read in the cache, and calls fn with each entry; after: start after this entry.
func scanJoined[R any](t *txn, tb *recordTable[R], first, next string, pre []any, from, to int64, after *projection.IndexEntry,
	fn func(projection.IndexEntry) bool,
) error {
	m := tb.cached(t.c)
	scan := func(rows pgx.Rows) (projection.IndexEntry, error) {
		x, err := scanIndexRow(tb, rows)
		if err != nil {
			return x.IndexEntry, err
		}
		if _, ok := m[x.ID]; !ok && x.rec != nil {
			r, err := tb.decodeRow(x.ID, x.storedRow)
			if err != nil {
				return x.IndexEntry, err
			}
			m[x.ID] = r
			noteBig(t, tb, r)
		}
		return x.IndexEntry, nil
	}
	return keyset(indexPages, func(last *projection.IndexEntry, n int) ([]projection.IndexEntry, error) {
		if last == nil {
			last = after // after an entry the begin read (claimpre.go), or nil
		}
		sql, args := indexArgs(first, next, pre, from, to, last, n)
		return txnPage(t, scan, sql, args...)
	}, func(e projection.IndexEntry) (bool, error) { return fn(e), nil })
}

func (t *txn) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(uint64, string) bool) error {
	if t.optimistic {
		return t.refuseRead()
	}
	b := &pgx.Batch{}
	t.flushIndexes(b)
	if err := t.conn.SendBatch(t.ctx, b).Close(); err != nil {
		return err
	}
	return scanSession(t.ctx, t.conn, t.st, sessionID, afterSeq, fn)
}

// Counts reads the stored counts and adds the group's pending changes.
func (t *txn) Counts(fn func(string, events.TaskState, int64) bool) error {
	if t.optimistic {
		return t.refuseRead()
	}
	m := map[countKey]int64{}
	if err := readCounts(t.ctx, t.conn, t.st, func(k string, s events.TaskState, n int64) bool {
		m[countKey{k, s}] = n
		return true
	}); err != nil {
		return err
	}
	for k, d := range t.counts {
		m[k] += d
	}
	return callCounts(m, fn)
}

func callCounts(m map[countKey]int64, fn func(string, events.TaskState, int64) bool) error {
	keys := make([]countKey, 0, len(m))
	for k, n := range m {
		if n != 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].kind != keys[j].kind {
			return keys[i].kind < keys[j].kind
		}
		return keys[i].state < keys[j].state
	})
	for _, k := range keys {
		if !fn(k.kind, k.state, m[k]) {
			return nil
		}
	}
	return nil
}

// --- writes ---

func (t *txn) TaskEdited(r *projection.Task) error {
	t.undo.task(t.c, r.ID)
	t.c.tasks[r.ID] = r
	noteBig(t, taskTable, r)
	t.dirtyTasks[r.ID] = true
	return nil
}

func (t *txn) WakeEdited(r *projection.Wake) error {
	t.undo.wake(t.c, r.ID)
	t.c.wakes[r.ID] = r
	noteBig(t, wakeTable, r)
	t.dirtyWakes[r.ID] = true
	return nil
}

func (t *txn) NewTask() *projection.Task { return new(projection.Task) }
func (t *txn) NewWake() *projection.Wake { return new(projection.Wake) }

func (t *txn) PutTask(r *projection.Task) error {
	t.undo.task(t.c, r.ID)
	t.c.tasks[r.ID] = r
	noteBig(t, taskTable, r)
	t.newTasks[r.ID] = true
	return nil
}

func (t *txn) PutWake(r *projection.Wake) error {
	t.undo.wake(t.c, r.ID)
	t.c.wakes[r.ID] = r
	noteBig(t, wakeTable, r)
	t.newWakes[r.ID] = true
	return nil
}

func (t *txn) PutTaskKey(sessionID, key, taskID string) error {
	k := skey{sessionID, key}
	t.undo.key(t.c, false, k)
	t.c.taskKeys[k] = taskID
	if id, ok := t.reserved[k]; ok && id == taskID {
		delete(t.reserved, k) // SubmitTx's row is this one (submittx.go, appendDecided)
		return nil
	}
	t.newTaskKeys = append(t.newTaskKeys, k)
	return nil
}

func (t *txn) PutWakeKey(sessionID, key, wakeID string) error {
	k := skey{sessionID, key}
	t.undo.key(t.c, true, k)
	t.c.wakeKeys[k] = wakeID
	t.newWakeKeys = append(t.newWakeKeys, k)
	return nil
}

func netDelete[K comparable](m map[K]idxOp, k K) {
	if op, ok := m[k]; ok && op.put && !op.replaces {
		delete(m, k) // put in this group on a key that had no entry: nothing to write
		return
	}
	m[k] = idxOp{}
}

func (t *txn) PutSessionTask(sessionID string, submitSeq uint64, taskID string) error {
	t.sessions = append(t.sessions, sessKey{sessionID, submitSeq})
	t.sessionIDs = append(t.sessionIDs, taskID)
	return nil
}

func (t *txn) AddCount(kind string, state events.TaskState, delta int64) error {
	t.counts[countKey{kind, state}] += delta
	return nil
}

func (t *txn) SetLastSeq(seq uint64) error {
	t.seq = seq
	return nil
}

// queueCommit queues every pending write of the group, the log head and the notification
// (notify: engine.queueNotify) into b, ahead of the COMMIT the caller adds.
func (t *txn) queueCommit(b *pgx.Batch, notify func(*pgx.Batch)) {
	t.flushIndexes(b)
	if n := len(t.evs); n > 0 && !t.evsCopied {
		seqs, sess, types, bodies := make([]int64, n), make([][]byte, n), make([]int16, n), make([][]byte, n)
		subjects := make([][]byte, n)
		for i, e := range t.evs {
			seqs[i], sess[i], types[i], bodies[i] = int64(e.seq), []byte(e.session), int16(e.typ), e.body
			subjects[i] = []byte(e.subject)
		}
		queueRows(b, t.st, t.st.insEvents, seqs, sess, types, bodies, subjects)
	}
	if t.seq != t.startSeq { // a prune of the same group may have taken every event appended
		b.Queue(t.st.setHead, int64(t.seq))
		notify(b)
	}
	if t.pruned {
		b.Queue(t.st.setPrunes, int64(t.prunes))
	}
	t.queueDeletes(b)
	taskTable.queueWrites(b, t.st, t.c, t.st.insTasks, t.st.updTasks, t.newTasks, t.dirtyTasks)
	wakeTable.queueWrites(b, t.st, t.c, t.st.insWakes, t.st.updWakes, t.newWakes, t.dirtyWakes)
	queueKeys(b, t.st, t.st.insTaskKeysBounded, t.newTaskKeys, t.c.taskKeys) // submittx.go: keyWaitUnderHead
	queueKeys(b, t.st, t.st.insWakeKeys, t.newWakeKeys, t.c.wakeKeys)
	if len(t.counts) > 0 {
		var kinds [][]byte
		var states []int16
		var ns []int64
		for k, d := range t.counts {
			if d != 0 {
				kinds, states, ns = append(kinds, []byte(k.kind)), append(states, int16(k.state)), append(ns, d)
			}
		}
		if len(kinds) > 0 {
			queueRows(b, t.st, t.st.addCnt, kinds, states, ns)
		}
	}
}

func queueKeys(b *pgx.Batch, st *statements, sql string, keys []skey, m map[skey]string) {
	if len(keys) == 0 {
		return
	}
	ss, ks, ids := make([][]byte, len(keys)), make([][]byte, len(keys)), make([][]byte, len(keys))
	for i, k := range keys {
		ss[i], ks[i], ids[i] = []byte(k.session), []byte(k.key), []byte(m[k])
	}
	queueRows(b, st, sql, ss, ks, ids)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// bigRecord names a record noted by noteBig.
type bigRecord struct {
	wake bool
	id   string
}

// noteBig notes r (of tb, just put into the cache) when its values exceed cacheValueMax.
func noteBig[R any](t *txn, tb *recordTable[R], r *R) {
	if r != nil && tb.valueLen(r) > cacheValueMax {
		t.big = append(t.big, bigRecord{wake: tb == any(wakeTable), id: tb.id(r)})
	}
}
