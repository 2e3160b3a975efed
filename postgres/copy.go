package postgres

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/projection"
)

// copyMin is the number of rows of one table from which a group's commit inserts them with
// COPY rather than in the commit batch's INSERT ... SELECT FROM unnest(...). COPY costs a
// round trip of its own, before the commit batch, under the head lock; for a large group (a
// SubmitMany) it saves the server the executor's work per row and packs the heap rows into
// multi-insert WAL records, and the client the arrays' encoding (copyBuf writes the rows
// straight into one buffer in COPY's binary format). It is above the rows a group of
// Options.MaxBatchCommands (256 by default) one-event commands writes to a table, so that
// on a distant server such a group pays no round trips it would barely win back: only
// batches take it.
const copyMin = 1024

// copyMinBytes is the bytes of one table's new rows (events' bodies, tasks' inputs) from which
// a group COPYs them whatever their number: a few large inputs in the commit batch cost the
// client their bytes many times over (pgx encodes each array parameter into a growing
// buffer, then the Bind message into another: 19x the inputs' bytes at the peak for a batch
// of 64 inputs of 1 MiB), where COPY streams them (copyReader).
const copyMinBytes = 1 << 20

// copyBuf is rows in COPY's binary format: a header, then each row's field count and each
// field's length and bytes, then a trailer (PostgreSQL, "COPY", "Binary Format").
//
// A field of copyPieceMin bytes or more is not copied into b: b so far and the field become
// pieces of their own (a copyReader sends pieces in order; a copyBuf without a reader never
// sees one this long).
type copyBuf struct {
	b      []byte
	mark   int      // b[mark:] is not yet in pieces
	pieces [][]byte // what to send before b[mark:]
	size   int      // the bytes of pieces
}

// copyPieceMin is the length from which a field is sent from its own bytes (copyBuf).
const copyPieceMin = 16 << 10

const copyHeader = "PGCOPY\n\xff\r\n\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00" // signature, flags, extension length

// copyChunk is the bytes of rows copyReader encodes at a time (a row larger than it is
// encoded whole): pgx sends COPY data in messages of 64 KiB.
const copyChunk = 64 << 10

// copyReader streams n rows in COPY's binary format, encoding them as they are read (row
// encodes the i-th), a chunk at a time: a COPY of 64 MiB of inputs holds one chunk of them,
// not a second copy of them all (it did: the whole COPY's data was one buffer, grown by
// doubling as rows were appended, 5x the rows' bytes allocated).
//
// pgx reads it on a goroutine of its own, which a failed CopyFrom may leave running: stop,
// called once CopyFrom has returned, makes every later Read fail without touching a row,
// so that nothing reads the group's state after the group has moved on.
type copyReader struct {
	mu      sync.Mutex
	stopped bool
	c       copyBuf
	next    int // c.pieces[next:] are still to be read, the first from off
	off     int
	i, n    int
	row     func(c *copyBuf, i int)
	done    bool // the trailer is in c.b
}

func newCopyReader(n int, row func(c *copyBuf, i int)) *copyReader {
	r := &copyReader{n: n, row: row}
	r.c.b = append(make([]byte, 0, copyChunk+copyChunk/4), copyHeader...) // the first fill keeps it
	return r
}

var errCopyStopped = errors.New("postgres: the COPY's rows were read after it ended")

func (r *copyReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return 0, errCopyStopped
	}
	for r.next < len(r.c.pieces) && r.off == len(r.c.pieces[r.next]) {
		r.next, r.off = r.next+1, 0
	}
	if r.next == len(r.c.pieces) {
		if r.done {
			return 0, io.EOF
		}
		r.fill()
	}
	k := copy(p, r.c.pieces[r.next][r.off:])
	r.off += k
	return k, nil
}

// fill encodes the next rows, about copyChunk bytes of them, into pieces (at least one).
func (r *copyReader) fill() {
	c := &r.c
	if cap(c.b) > 4*copyChunk { // a large row grew it: do not keep that for the rest
		c.b = make([]byte, 0, copyChunk+copyChunk/4)
	}
	if r.i > 0 {
		c.b = c.b[:0]
	}
	clear(c.pieces) // no reference to a row sent
	c.mark, c.pieces, c.size = 0, c.pieces[:0], 0
	r.next, r.off = 0, 0
	for r.i < r.n && c.size+len(c.b)-c.mark < copyChunk {
		r.row(c, r.i)
		r.i++
	}
	if r.i == r.n {
		c.end()
		r.done = true
	}
	c.pieces = append(c.pieces, c.b[c.mark:])
}

func (r *copyReader) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
}

func (c *copyBuf) row(fields int) { c.b = binary.BigEndian.AppendUint16(c.b, uint16(fields)) }

func (c *copyBuf) int64(v int64) {
	c.b = binary.BigEndian.AppendUint32(c.b, 8)
	c.b = binary.BigEndian.AppendUint64(c.b, uint64(v))
}

func (c *copyBuf) int16(v int16) {
	c.b = binary.BigEndian.AppendUint32(c.b, 2)
	c.b = binary.BigEndian.AppendUint16(c.b, uint16(v))
}

// bytea: every string column is bytea (schema.go), NOT NULL: an empty value is zero bytes.
func (c *copyBuf) bytes(v []byte) {
	c.b = binary.BigEndian.AppendUint32(c.b, uint32(len(v)))
	if len(v) >= copyPieceMin {
		c.pieces = append(c.pieces, c.b[c.mark:], v)
		c.size += len(c.b) - c.mark + len(v)
		c.mark = len(c.b)
		return
	}
	c.b = append(c.b, v...)
}

func (c *copyBuf) str(v string) {
	c.b = binary.BigEndian.AppendUint32(c.b, uint32(len(v)))
	c.b = append(c.b, v...)
}

// task is a tasks row, as taskTable.split makes it: id, the record without its input, the
// input; the record is encoded in place (no buffer of its own per task).
func (c *copyBuf) task(r *projection.Task) {
	x := *r
	x.Input = nil
	c.row(3)
	c.str(r.ID)
	at := len(c.b)
	c.b = recordcodec.AppendTask(append(c.b, 0, 0, 0, 0), &x)
	binary.BigEndian.PutUint32(c.b[at:], uint32(len(c.b)-at-4))
	c.bytes(r.Input)
}

func (c *copyBuf) end() { c.b = append(c.b, 0xff, 0xff) } // the trailer: a field count of -1

// copyStatement is the COPY of columns cols of table (qualified) from the client, binary.
func copyStatement(table string, cols ...string) string {
	return "COPY " + table + " (" + strings.Join(cols, ", ") + ") FROM STDIN (FORMAT binary)"
}

// copyStatements are the commit's COPYs, with the queue's schema in them.
type copyStatements struct {
	events, tasks, wakes, sessions, taskKeys, wakeKeys string
	idx                                                [projection.NumIndexes]string
}

func newCopyStatements(q func(string) string) copyStatements {
	s := copyStatements{
		events:   copyStatement(q("{s}.events"), "seq", "session", "type", "body", "subject"),
		tasks:    copyStatement(q("{s}.tasks"), "id", "rec", "input"),
		wakes:    copyStatement(q("{s}.wakes"), "id", "rec", "payload", "output"),
		sessions: copyStatement(q("{s}.session_tasks"), "session", "submit_seq", "task_id"),
		taskKeys: copyStatement(q("{s}.task_keys"), "session", "key", "task_id"),
		wakeKeys: copyStatement(q("{s}.wake_keys"), "session", "key", "wake_id"),
	}
	for ix, d := range pgIndexes {
		cols := []string{"at", "seq", "task_id"}
		if d.wakes {
			cols[2] = "wake_id"
		}
		if d.part != "" {
			cols = append([]string{d.part}, cols...)
		}
		if projection.Indexes[ix].Priority {
			cols = append(cols, "priority")
		}
		s.idx[ix] = copyStatement(q("{s}."+d.table), cols...)
	}
	return s
}

// copyLarge inserts the group's large sets of new rows with COPY (copyMin), on the group's
// connection, in its transaction, and takes them out of what the commit batch will send
// (queueCommit). The rows it takes are the final ones: the group's closures have all run.
//
// Only inserts no statement of the commit batch must precede: a group that pruned, or that
// deletes records, keys or session rows, sends everything in the batch as before (a key a
// prune freed may be taken again in the same group: its DELETE must come first). An index
// put that replaces a stored entry (idxOp.replaces) stays in the batch after its DELETE;
// every other put is of a key with no stored entry and no pending write but itself.
//
// A failed COPY leaves the transaction aborted (an ERROR) or the connection gone: in both,
// nothing of the group is committed, and the caller rolls back as for a failed commit batch.
func (t *txn) copyLarge() error {
	if t.mustBatch() {
		return nil
	}
	for _, p := range copyParts {
		if !p.wanted(t) {
			continue
		}
		if err := p.copy(t, t.sendCopy); err != nil {
			return err
		}
	}
	return nil
}

// sendCopy runs the COPY sql of n rows, each encoded by row as pgx reads them (copyReader).
func (t *txn) sendCopy(sql string, n int, row func(c *copyBuf, i int)) error {
	r := newCopyReader(n, row)
	_, err := t.conn.PgConn().CopyFrom(t.ctx, r, sql)
	r.stop()
	if err != nil {
		return fmt.Errorf("COPY of the group's rows: %w", err)
	}
	return nil
}

// copySend is txn.sendCopy.
type copySend func(sql string, n int, row func(c *copyBuf, i int)) error

// copyPart is one table whose new rows a group may COPY: how many it has (rows; an index's
// count includes the puts that stay in the batch), how many bytes of values (size; nil: few
// per row), and the COPY (copy, which sends with send and takes the rows it sent out of the
// commit batch). copyLarge and copyWanted both go by copyParts, so a table added here is one
// both know.
type copyPart struct {
	rows func(t *txn) int
	size func(t *txn) int
	copy func(t *txn, send copySend) error
}

// wanted: the part has copyMin rows or more, or copyMinBytes of values.
func (p copyPart) wanted(t *txn) bool {
	return p.rows(t) >= copyMin || (p.size != nil && p.size(t) >= copyMinBytes)
}

var copyParts = func() []copyPart {
	ps := []copyPart{
		{func(t *txn) int { return len(t.evs) }, func(t *txn) int { return t.evBytes }, copyEvents},
		{func(t *txn) int { return len(t.newTasks) }, newTaskInputs, func(t *txn, send copySend) error {
			return copyRecords(t, taskTable, t.st.cp.tasks, t.newTasks, t.dirtyTasks, send)
		}},
		{func(t *txn) int { return len(t.newWakes) }, nil, func(t *txn, send copySend) error {
			return copyRecords(t, wakeTable, t.st.cp.wakes, t.newWakes, t.dirtyWakes, send)
		}},
		{func(t *txn) int { return len(t.sessions) }, nil, copySessions},
		{func(t *txn) int { return len(t.newTaskKeys) }, nil, func(t *txn, send copySend) error {
			return t.boundKeyWait(func() error { return copyKeys(t.st.cp.taskKeys, &t.newTaskKeys, t.c.taskKeys, send) })
		}},
		{func(t *txn) int { return len(t.newWakeKeys) }, nil, func(t *txn, send copySend) error {
			return copyKeys(t.st.cp.wakeKeys, &t.newWakeKeys, t.c.wakeKeys, send)
		}},
	}
	for ix := range projection.NumIndexes {
		ps = append(ps, copyPart{func(t *txn) int { return len(t.idx[ix]) }, nil, func(t *txn, send copySend) error {
			return copyIndex(t, ix, send)
		}})
	}
	return ps
}()

// newTaskInputs is the bytes of the group's new tasks' inputs, counted up to copyMinBytes.
func newTaskInputs(t *txn) int {
	n := 0
	for id := range t.newTasks {
		if r := t.c.tasks[id]; r != nil {
			if n += len(r.Input); n >= copyMinBytes {
				break
			}
		}
	}
	return n
}

func copyEvents(t *txn, send copySend) error {
	evs := t.evs
	if err := send(t.st.cp.events, len(evs), func(c *copyBuf, i int) {
		e := &evs[i]
		c.row(5)
		c.int64(int64(e.seq))
		c.str(e.session)
		c.int16(int16(e.typ))
		c.bytes(e.body)
		c.str(e.subject)
	}); err != nil {
		return err
	}
	t.evsCopied = true
	return nil
}

func copySessions(t *txn, send copySend) error {
	ss, ids := t.sessions, t.sessionIDs
	if err := send(t.st.cp.sessions, len(ss), func(c *copyBuf, i int) {
		c.row(3)
		c.str(ss[i].session)
		c.int64(int64(ss[i].seq))
		c.str(ids[i])
	}); err != nil {
		return err
	}
	t.sessions, t.sessionIDs = t.sessions[:0], t.sessionIDs[:0]
	return nil
}

// copyKeys sends the new keys (task keys or wake keys; m: the ids they name) in the primary
// key's order.
func copyKeys(sql string, newKeys *[]skey, m map[skey]string, send copySend) error {
	keys := slices.Clone(*newKeys)
	slices.SortFunc(keys, func(a, b skey) int {
		return cmp.Or(strings.Compare(a.session, b.session), strings.Compare(a.key, b.key))
	})
	ids := make([]string, len(keys)) // read here, not on pgx's goroutine
	for i, sk := range keys {
		ids[i] = m[sk]
	}
	if err := send(sql, len(keys), func(c *copyBuf, i int) {
		c.row(3)
		c.str(keys[i].session)
		c.str(keys[i].key)
		c.str(ids[i])
	}); err != nil {
		return err
	}
	*newKeys = (*newKeys)[:0]
	return nil
}

// copyIndex sends index ix's puts of keys with no stored entry, when they are copyMin or more.
func copyIndex(t *txn, ix projection.Index, send copySend) error {
	m := t.idx[ix]
	parted, pri := pgIndexes[ix].part != "", projection.Indexes[ix].Priority
	fields := 3
	if parted {
		fields++
	}
	if pri {
		fields++
	}
	keys := make([]idxKey, 0, len(m))
	for k, op := range m {
		if op.put && !op.replaces {
			keys = append(keys, k)
		}
	}
	if len(keys) < copyMin {
		return nil
	}
	// In the primary key's order: each row lands next to the one before it in the index,
	// whose pages then fill up in order instead of splitting all over.
	slices.SortFunc(keys, func(a, b idxKey) int {
		return cmp.Or(strings.Compare(a.part, b.part), cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq))
	})
	ops := make([]idxOp, len(keys)) // read here, not on pgx's goroutine
	for i, k := range keys {
		ops[i] = m[k]
	}
	if err := send(t.st.cp.idx[ix], len(keys), func(c *copyBuf, i int) {
		k, op := keys[i], ops[i]
		c.row(fields)
		if parted {
			c.str(k.part)
		}
		c.int64(k.at)
		c.int64(int64(k.seq))
		c.str(op.id)
		if pri {
			c.int64(op.pri)
		}
	}); err != nil {
		return err
	}
	for _, k := range keys {
		delete(m, k)
	}
	return nil
}

// copyRecords inserts the group's new records of tb (added) with COPY when they are many,
// and takes them out of added and changed: the COPY wrote each one's last version.
func copyRecords[R any](t *txn, tb *recordTable[R], sql string, added, changed map[string]bool, send copySend) error {
	m := tb.cached(t.c)
	ids := make([]string, 0, len(added))
	for id := range added {
		ids = append(ids, id)
	}
	slices.Sort(ids)           // the primary key's order (see copyLarge's indexes)
	rs := make([]*R, len(ids)) // read here, not on pgx's goroutine
	for i, id := range ids {
		rs[i] = m[id]
	}
	if err := send(sql, len(ids), func(c *copyBuf, i int) {
		if r, ok := any(rs[i]).(*projection.Task); ok {
			c.task(r)
			return
		}
		rec, cols := tb.split(rs[i])
		c.row(2 + len(cols))
		c.str(ids[i])
		c.bytes(rec)
		for _, col := range cols {
			c.bytes(col)
		}
	}); err != nil {
		return err
	}
	for id := range added {
		delete(changed, id)
	}
	clear(added)
	return nil
}

// mustBatch: the group pruned or deletes records, keys or session rows, so its inserts must
// follow those DELETEs in the commit batch (copyLarge).
func (t *txn) mustBatch() bool {
	return t.pruned || len(t.delTasks) > 0 || len(t.delWakes) > 0 || len(t.delTaskKeys) > 0 ||
		len(t.delWakeKeys) > 0 || len(t.delSessions) > 0
}

// copyWanted says whether copyLarge would send a COPY for the group (or may: an index's count
// includes puts that stay in the batch), so that the fast path (fast.go) begins such a group
// in a round trip of its own before the COPYs instead of putting everything in one batch.
func (t *txn) copyWanted() bool {
	if t.mustBatch() {
		return false
	}
	for _, p := range copyParts {
		if p.wanted(t) {
			return true
		}
	}
	return false
}

// copyGroup runs the group's COPYs (copyLarge) ahead of its commit batch; ok is false when
// one failed, and the attempt ends with out and err. Nothing was committed: the COMMIT comes
// in the batch after. An ERROR (a constraint the rows break) aborted the transaction, which
// the ROLLBACK ends, and a group of several commands runs again one by one, as when the
// commit batch fails; any other failure leaves the connection in no known state, so it is
// closed, and the transaction dies with it.
func (e *engine) copyGroup(conn *pgxpool.Conn, tx *txn, commands int) (out groupOutcome, err error, ok bool) {
	cerr := tx.copyLarge()
	if cerr == nil {
		return committed, nil, true
	}
	e.cache = newCache()
	if rolledBack(conn.Conn(), cerr) {
		rollback(conn)
		if commands > 1 {
			return rerunAlone, nil, false
		}
		return notCommitted, backendError(tx.keyBusy(cerr)), false
	}
	conn.Conn().Close(context.Background())
	return notCommitted, backendError(cerr), false
}
