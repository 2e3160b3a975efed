package postgres

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
)

type skey struct{ session, key string }

type countKey struct {
	kind  string
	state events.TaskState
}

// cache is what the writer knows of the stored state as of log sequence seq: records and
// keys it read or wrote, absent ones included (nil, ""). While the log head still reads seq
// when the writer locks it, no other process has written since, and every entry is exact;
// otherwise the writer starts from an empty cache. It belongs to the writer goroutine.
type cache struct {
	seq      uint64
	prunes   uint64 // log_head.prunes: a prune changes records without moving the log head
	valid    bool
	tasks    map[string]*projection.Task
	wakes    map[string]*projection.Wake
	taskKeys map[skey]string
	wakeKeys map[skey]string
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
// out (Apply never puts an entry that exists, so a put then a delete leaves nothing; a delete
// then a put is an upsert).
type idxOp struct {
	put  bool
	id   string
	wake bool // the retention index's entries only
}

type dueKey struct {
	at  int64
	seq uint64
}

type kindKey struct {
	kind string
	dueKey
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
	ctx  context.Context
	conn *pgx.Conn
	st   *statements
	c    *cache

	seq              uint64 // the last sequence, the group's appends included
	startSeq         uint64 // the log head when the group began
	prunes           uint64 // log_head.prunes, counted up by a prune of this group
	pruned           bool   // a prune ran in this group: the commit writes prunes
	maxTask, maxWake string // the greatest stored ids: a new id above them has no record

	newTasks, dirtyTasks map[string]bool
	newWakes, dirtyWakes map[string]bool
	newTaskKeys          []skey
	newWakeKeys          []skey
	due, wakeIdx         map[dueKey]idxOp
	kindDue              map[kindKey]idxOp
	sessions             []sessKey
	sessionIDs           []string
	counts               map[countKey]int64
	evs                  []pendingEvent

	// Retention (prune.go): deletions of stored rows, and the retention index's writes.
	delTasks, delWakes       map[string]bool
	delTaskKeys, delWakeKeys []skey
	delSessions              []sessKey
	prunable                 map[dueKey]idxOp
}

var _ projection.State = (*txn)(nil)

func newTxn(ctx context.Context, conn *pgx.Conn, st *statements, c *cache) *txn {
	return &txn{
		ctx: ctx, conn: conn, st: st, c: c,
		newTasks: map[string]bool{}, dirtyTasks: map[string]bool{},
		newWakes: map[string]bool{}, dirtyWakes: map[string]bool{},
		due: map[dueKey]idxOp{}, wakeIdx: map[dueKey]idxOp{}, kindDue: map[kindKey]idxOp{},
		counts: map[countKey]int64{}, prunable: map[dueKey]idxOp{},
	}
}

// Append gives ev the next sequence number, folds it into the state and keeps its encoding
// for the commit. A rejected event changes nothing.
func (t *txn) Append(ev events.Event) error {
	h := ev.Head()
	h.Seq = t.seq + 1
	body, err := events.Append(nil, ev)
	if err != nil {
		return err
	}
	if err := projection.Apply(t, ev); err != nil {
		return err
	}
	taskID, wakeID := ev.Subject() // one of them is set
	t.evs = append(t.evs, pendingEvent{seq: h.Seq, session: h.SessionID, typ: ev.Type(), body: body, subject: taskID + wakeID})
	return nil
}

// --- reads ---

func (t *txn) Task(id string) (*projection.Task, error) {
	r, err := t.EditTask(id)
	if r == nil || err != nil {
		return nil, err
	}
	c := *r
	return &c, nil
}

func (t *txn) Wake(id string) (*projection.Wake, error) {
	r, err := t.EditWake(id)
	if r == nil || err != nil {
		return nil, err
	}
	c := *r
	return &c, nil
}

// EditTask returns a copy of the record: TaskEdited stores the copy back.
func (t *txn) EditTask(id string) (*projection.Task, error) {
	r, ok := t.c.tasks[id]
	if !ok {
		if id > t.maxTask {
			return nil, nil // an id above every stored one has no record (ids are UUIDv7)
		}
		var err error
		if r, err = readTask(t.ctx, t.conn, t.st, id); err != nil {
			return nil, err
		}
		t.c.tasks[id] = r
	}
	if r == nil {
		return nil, nil
	}
	c := *r
	return &c, nil
}

func (t *txn) EditWake(id string) (*projection.Wake, error) {
	r, ok := t.c.wakes[id]
	if !ok {
		if id > t.maxWake {
			return nil, nil
		}
		var err error
		if r, err = readWake(t.ctx, t.conn, t.st, id); err != nil {
			return nil, err
		}
		t.c.wakes[id] = r
	}
	if r == nil {
		return nil, nil
	}
	c := *r
	return &c, nil
}

func (t *txn) TaskKey(sessionID, key string) (string, error) {
	k := skey{sessionID, key}
	if id, ok := t.c.taskKeys[k]; ok {
		return id, nil
	}
	id, err := readKey(t.ctx, t.conn, t.st.taskKey, sessionID, key)
	if err == nil {
		t.c.taskKeys[k] = id
	}
	return id, err
}

func (t *txn) WakeKey(sessionID, key string) (string, error) {
	k := skey{sessionID, key}
	if id, ok := t.c.wakeKeys[k]; ok {
		return id, nil
	}
	id, err := readKey(t.ctx, t.conn, t.st.wakeKey, sessionID, key)
	if err == nil {
		t.c.wakeKeys[k] = id
	}
	return id, err
}

func (t *txn) LastSeq() (uint64, error) { return t.seq, nil }

// flushIndexes queues the pending index writes into b, so that a scan sent after them in
// the same batch sees the group's own changes.
func (t *txn) flushIndexes(b *pgx.Batch) {
	t.flushPrune(b)
	if len(t.due) > 0 {
		queueDue(b, t.st.insDue, t.st.delDue, t.due)
		clear(t.due)
	}
	if len(t.wakeIdx) > 0 {
		queueDue(b, t.st.insWakeIdx, t.st.delWakeIdx, t.wakeIdx)
		clear(t.wakeIdx)
	}
	if len(t.kindDue) > 0 {
		var pk, dk [][]byte
		var pa, da []int64
		var ps, ds []int64
		var pid [][]byte
		for k, op := range t.kindDue {
			if op.put {
				pk, pa, ps, pid = append(pk, []byte(k.kind)), append(pa, k.at), append(ps, int64(k.seq)), append(pid, []byte(op.id))
			} else {
				dk, da, ds = append(dk, []byte(k.kind)), append(da, k.at), append(ds, int64(k.seq))
			}
		}
		if len(dk) > 0 {
			b.Queue(t.st.delKind, dk, da, ds)
		}
		if len(pk) > 0 {
			b.Queue(t.st.insKind, pk, pa, ps, pid)
		}
		clear(t.kindDue)
	}
	if len(t.sessions) > 0 {
		ss, qs := make([][]byte, len(t.sessions)), make([]int64, len(t.sessions))
		ids := make([][]byte, len(t.sessions))
		for i, s := range t.sessions {
			ss[i], qs[i], ids[i] = []byte(s.session), int64(s.seq), []byte(t.sessionIDs[i])
		}
		b.Queue(t.st.insSession, ss, qs, ids)
		t.sessions, t.sessionIDs = t.sessions[:0], t.sessionIDs[:0]
	}
}

func queueDue(b *pgx.Batch, ins, del string, m map[dueKey]idxOp) {
	var pa, ps, da, ds []int64
	var pid [][]byte
	for k, op := range m {
		if op.put {
			pa, ps, pid = append(pa, k.at), append(ps, int64(k.seq)), append(pid, []byte(op.id))
		} else {
			da, ds = append(da, k.at), append(ds, int64(k.seq))
		}
	}
	if len(da) > 0 {
		b.Queue(del, da, ds)
	}
	if len(pa) > 0 {
		b.Queue(ins, pa, ps, pid)
	}
}

// scanPage is the first scan page's size; each next page doubles, up to scanPageMax: a
// claim of a few tasks reads a few rows, a long scan few round trips.
const (
	scanPage    = 16
	scanPageMax = 1024
)

// scanTasks runs a paged scan of the due or kind-due index (first and from: the statements
// for the first page and the next ones; kind: $5 of the kind scan, or nil), keeping the
// joined records in the cache, and calls fn with each entry.
func (t *txn) scanTasks(first, from string, kind []byte, maxAt int64, fn func(projection.IndexEntry) bool) error {
	var last projection.IndexEntry
	page := scanPage
	for started := false; ; started = true {
		b := &pgx.Batch{}
		t.flushIndexes(b)
		// due: $1 maxAt, $2 page, then $3 at, $4 seq; kind-due: $3 the kind, then $4, $5.
		sql, args := first, []any{maxAt, page}
		if kind != nil {
			args = append(args, kind)
		}
		if started {
			sql, args = from, append(args, last.At, int64(last.Seq))
		}
		var entries []projection.IndexEntry
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var at, seq int64
				var id, rec, input []byte
				if err := rows.Scan(&at, &seq, &id, &rec, &input); err != nil {
					return err
				}
				e := projection.IndexEntry{At: at, Seq: uint64(seq), ID: string(id)}
				entries = append(entries, e)
				if _, ok := t.c.tasks[e.ID]; !ok && rec != nil {
					r, err := decodeTask(e.ID, rec, input)
					if err != nil {
						return err
					}
					t.c.tasks[e.ID] = r
				}
			}
			return rows.Err()
		})
		if err := t.conn.SendBatch(t.ctx, b).Close(); err != nil {
			return err
		}
		for _, e := range entries {
			if !fn(e) {
				return nil
			}
		}
		if len(entries) < page {
			return nil
		}
		last = entries[len(entries)-1]
		page = min(page*2, scanPageMax)
	}
}

func (t *txn) ScanDue(maxAt int64, fn func(projection.IndexEntry) bool) error {
	return t.scanTasks(t.st.scanDue, t.st.scanDueFrom, nil, maxAt, fn)
}

func (t *txn) ScanDueKind(kind string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return t.scanTasks(t.st.scanKind, t.st.scanKindFrom, []byte(kind), maxAt, fn)
}

func (t *txn) ScanWakes(maxAt int64, fn func(projection.IndexEntry) bool) error {
	var last projection.IndexEntry
	page := scanPage
	for started := false; ; started = true {
		b := &pgx.Batch{}
		t.flushIndexes(b)
		sql, args := t.st.scanWakes, []any{maxAt, page}
		if started {
			sql, args = t.st.scanWakesFrom, append(args, last.At, int64(last.Seq))
		}
		var entries []projection.IndexEntry
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var at, seq int64
				var id, rec, payload, output []byte
				if err := rows.Scan(&at, &seq, &id, &rec, &payload, &output); err != nil {
					return err
				}
				e := projection.IndexEntry{At: at, Seq: uint64(seq), ID: string(id)}
				entries = append(entries, e)
				if _, ok := t.c.wakes[e.ID]; !ok && rec != nil {
					r, err := decodeWake(e.ID, rec, payload, output)
					if err != nil {
						return err
					}
					t.c.wakes[e.ID] = r
				}
			}
			return rows.Err()
		})
		if err := t.conn.SendBatch(t.ctx, b).Close(); err != nil {
			return err
		}
		for _, e := range entries {
			if !fn(e) {
				return nil
			}
		}
		if len(entries) < page {
			return nil
		}
		last = entries[len(entries)-1]
		page = min(page*2, scanPageMax)
	}
}

func (t *txn) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(uint64, string) bool) error {
	b := &pgx.Batch{}
	t.flushIndexes(b)
	if err := t.conn.SendBatch(t.ctx, b).Close(); err != nil {
		return err
	}
	return scanSession(t.ctx, t.conn, t.st, sessionID, afterSeq, fn)
}

// Counts reads the stored counts and adds the group's pending changes.
func (t *txn) Counts(fn func(string, events.TaskState, int64) bool) error {
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
	t.c.tasks[r.ID] = r
	t.dirtyTasks[r.ID] = true
	return nil
}

func (t *txn) WakeEdited(r *projection.Wake) error {
	t.c.wakes[r.ID] = r
	t.dirtyWakes[r.ID] = true
	return nil
}

func (t *txn) NewTask() *projection.Task { return new(projection.Task) }
func (t *txn) NewWake() *projection.Wake { return new(projection.Wake) }

func (t *txn) PutTask(r *projection.Task) error {
	t.c.tasks[r.ID] = r
	t.newTasks[r.ID] = true
	t.maxTask = max(t.maxTask, r.ID)
	return nil
}

func (t *txn) PutWake(r *projection.Wake) error {
	t.c.wakes[r.ID] = r
	t.newWakes[r.ID] = true
	t.maxWake = max(t.maxWake, r.ID)
	return nil
}

func (t *txn) PutTaskKey(sessionID, key, taskID string) error {
	k := skey{sessionID, key}
	t.c.taskKeys[k] = taskID
	t.newTaskKeys = append(t.newTaskKeys, k)
	return nil
}

func (t *txn) PutWakeKey(sessionID, key, wakeID string) error {
	k := skey{sessionID, key}
	t.c.wakeKeys[k] = wakeID
	t.newWakeKeys = append(t.newWakeKeys, k)
	return nil
}

func netPut[K comparable](m map[K]idxOp, k K, id string) {
	if op, ok := m[k]; ok && !op.put {
		m[k] = idxOp{put: true, id: id} // deleted then put: an upsert
		return
	}
	m[k] = idxOp{put: true, id: id}
}

func netDelete[K comparable](m map[K]idxOp, k K) {
	if op, ok := m[k]; ok && op.put {
		delete(m, k) // put in this group on a key that had no entry: nothing to write
		return
	}
	m[k] = idxOp{}
}

func (t *txn) PutDue(e projection.IndexEntry) error {
	netPut(t.due, dueKey{e.At, e.Seq}, e.ID)
	return nil
}

func (t *txn) DeleteDue(e projection.IndexEntry) error {
	netDelete(t.due, dueKey{e.At, e.Seq})
	return nil
}

func (t *txn) PutWakeIndex(e projection.IndexEntry) error {
	netPut(t.wakeIdx, dueKey{e.At, e.Seq}, e.ID)
	return nil
}

func (t *txn) DeleteWakeIndex(e projection.IndexEntry) error {
	netDelete(t.wakeIdx, dueKey{e.At, e.Seq})
	return nil
}

func (t *txn) PutKindDue(kind string, e projection.IndexEntry) error {
	netPut(t.kindDue, kindKey{kind, dueKey{e.At, e.Seq}}, e.ID)
	return nil
}

func (t *txn) DeleteKindDue(kind string, e projection.IndexEntry) error {
	netDelete(t.kindDue, kindKey{kind, dueKey{e.At, e.Seq}})
	return nil
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
// into b, ahead of the COMMIT the caller adds.
func (t *txn) queueCommit(b *pgx.Batch, channel string) {
	t.flushIndexes(b)
	if n := len(t.evs); n > 0 {
		seqs, sess, types, bodies := make([]int64, n), make([][]byte, n), make([]int16, n), make([][]byte, n)
		subjects := make([][]byte, n)
		for i, e := range t.evs {
			seqs[i], sess[i], types[i], bodies[i] = int64(e.seq), []byte(e.session), int16(e.typ), e.body
			subjects[i] = []byte(e.subject)
		}
		b.Queue(t.st.insEvents, seqs, sess, types, bodies, subjects)
	}
	if t.seq != t.startSeq { // a prune of the same group may have taken every event appended
		b.Queue(t.st.setHead, int64(t.seq))
		b.Queue(t.st.notify, channel)
	}
	if t.pruned {
		b.Queue(t.st.setPrunes, int64(t.prunes))
	}
	t.queueDeletes(b)
	if len(t.newTasks) > 0 {
		var ids, recs, inputs [][]byte
		for id := range t.newTasks {
			r := t.c.tasks[id]
			ids, recs, inputs = append(ids, []byte(id)), append(recs, taskRec(r)), append(inputs, nonNil(r.Input))
		}
		b.Queue(t.st.insTasks, ids, recs, inputs)
	}
	if len(t.dirtyTasks) > 0 {
		var ids, recs [][]byte
		for id := range t.dirtyTasks {
			if !t.newTasks[id] {
				ids, recs = append(ids, []byte(id)), append(recs, taskRec(t.c.tasks[id]))
			}
		}
		if len(ids) > 0 {
			b.Queue(t.st.updTasks, ids, recs)
		}
	}
	if len(t.newWakes) > 0 {
		var ids, recs, payloads, outputs [][]byte
		for id := range t.newWakes {
			r := t.c.wakes[id]
			ids, recs = append(ids, []byte(id)), append(recs, wakeRec(r))
			payloads, outputs = append(payloads, nonNil(r.Payload)), append(outputs, nonNil(r.Outcome.Output))
		}
		b.Queue(t.st.insWakes, ids, recs, payloads, outputs)
	}
	if len(t.dirtyWakes) > 0 {
		var ids, recs [][]byte
		for id := range t.dirtyWakes {
			if !t.newWakes[id] {
				ids, recs = append(ids, []byte(id)), append(recs, wakeRec(t.c.wakes[id]))
			}
		}
		if len(ids) > 0 {
			b.Queue(t.st.updWakes, ids, recs)
		}
	}
	queueKeys(b, t.st.insTaskKeys, t.newTaskKeys, t.c.taskKeys)
	queueKeys(b, t.st.insWakeKeys, t.newWakeKeys, t.c.wakeKeys)
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
			b.Queue(t.st.addCnt, kinds, states, ns)
		}
	}
}

func queueKeys(b *pgx.Batch, sql string, keys []skey, m map[skey]string) {
	if len(keys) == 0 {
		return
	}
	ss, ks, ids := make([][]byte, len(keys)), make([][]byte, len(keys)), make([][]byte, len(keys))
	for i, k := range keys {
		ss[i], ks[i], ids[i] = []byte(k.session), []byte(k.key), []byte(m[k])
	}
	b.Queue(sql, ss, ks, ids)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// taskRec is the stored record: the codec's bytes with the input left out (its own column).
func taskRec(r *projection.Task) []byte {
	c := *r
	c.Input = nil
	return pebblelog.AppendTaskRecord(nil, &c)
}

// wakeRec leaves out the payload and the completion output (their own columns).
func wakeRec(r *projection.Wake) []byte {
	c := *r
	c.Payload, c.Outcome.Output = nil, nil
	return pebblelog.AppendWakeRecord(nil, &c)
}

func decodeTask(id string, rec, input []byte) (*projection.Task, error) {
	r, err := pebblelog.DecodeTaskRecord([]byte("tasks "+id), rec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptRow, err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("%w: tasks row %q holds the record of %q", ErrCorruptRow, id, r.ID)
	}
	if len(input) > 0 {
		r.Input = input
	}
	return r, nil
}

func decodeWake(id string, rec, payload, output []byte) (*projection.Wake, error) {
	r, err := pebblelog.DecodeWakeRecord([]byte("wakes "+id), rec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptRow, err)
	}
	if r.ID != id {
		return nil, fmt.Errorf("%w: wakes row %q holds the record of %q", ErrCorruptRow, id, r.ID)
	}
	if len(payload) > 0 {
		r.Payload = payload
	}
	if len(output) > 0 {
		r.Outcome.Output = output
	}
	return r, nil
}
