package pebblelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// ErrCorruptRecord marks a projection record or index entry that does not decode.
var ErrCorruptRecord = errors.New("pebblelog: corrupt projection record")

// reader implements projection.Reader over any Pebble reader: the DB, a snapshot, or an
// indexed batch (which reads its own writes merged with the DB).
type reader struct {
	r  pebble.Reader
	bl *blobStore // the store's blobs (format 4: blob.go); nil where no event is read
}

func (s reader) get(key []byte) ([]byte, bool, error) {
	v, closer, err := s.r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	out := append([]byte(nil), v...)
	return out, true, closer.Close()
}

// Task reads a task with its input (format 2 keeps it in the log: input.go).
func (s reader) Task(id string) (*projection.Task, error) {
	t, err := s.taskRecord(id)
	if err == nil && t != nil {
		err = fillTask(s, t)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// taskRecord reads a task's record as stored: in format 2, without its input.
func (s reader) taskRecord(id string) (*projection.Task, error) {
	return decodeRecord(s, idKey(prefixTask, id), decodeTask)
}

// decodeRecord reads the record at k and decodes it straight from Pebble's value, which the
// decoder copies out of (recordReader.bin): a copy of the value first (get) was one more
// copy of a task's output, up to 64 MiB, at every read of a settled task.
func decodeRecord[R any](s reader, k []byte, decode func(k, v []byte) (*R, error)) (*R, error) {
	v, closer, err := s.r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rec, err := decode(k, v)
	if cerr := closer.Close(); err == nil && cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// Wake reads a wake with its payload or completion output (input.go).
func (s reader) Wake(id string) (*projection.Wake, error) {
	x, err := s.wakeRecord(id)
	if err == nil && x != nil {
		err = fillWake(s, x)
	}
	if err != nil {
		return nil, err
	}
	return x, nil
}

// wakeRecord reads a wake's record as stored: in format 2, without its values.
func (s reader) wakeRecord(id string) (*projection.Wake, error) {
	return decodeRecord(s, idKey(prefixWake, id), decodeWake)
}

func (s reader) TaskKey(session, key string) (string, error) {
	return s.getString(scopedKey(prefixTaskKey, session, key))
}

func (s reader) WakeKey(session, key string) (string, error) {
	return s.getString(scopedKey(prefixWakeKey, session, key))
}

// getString is get for a value read as a string ("" when absent): one copy, not two.
func (s reader) getString(key []byte) (string, error) {
	v, closer, err := s.r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	out := string(v)
	return out, closer.Close()
}

// scanDue walks a due index in claim order (head: the due index's prefix, or one kind's part
// of the per-kind index), calling fn with the entries with At in [from, to] until fn returns
// false. Keys are priority first (format 6): the entries of one priority are a run in time
// order, so the walk follows a run while its entries are due and, at the first that is not,
// seeks to the start of the next lower priority; the seek lands on the next priority present
// (and an entry before from seeks to from in its own priority). Cost: one seek per priority
// present plus the entries fn sees, so a future high-priority entry never hides a due lower
// one, and a claim reads no future entry of a priority past its first.
//
// v, when not nil, is the writer's marks of the partition (runMarks; from is then
// math.MinInt64): the walk's first key and each run's start are sought at their marks, and
// each such seek's landing raises its mark. fn must not write to the state.
func (s reader) scanDue(head []byte, from, to int64, v *dueMarkView, fn func(projection.IndexEntry) bool) (err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: head, UpperBound: prefixEnd(head)})
	if err != nil {
		return err
	}
	defer func() {
		if v != nil {
			v.w.dueSteps += it.Stats().InternalStats.PointCount
		}
		err = errors.Join(err, it.Close())
	}()
	// enter seeks to run's start (math.MaxInt64: the partition's first key).
	enter := func(run int64) bool {
		if v == nil {
			if run == math.MaxInt64 {
				return it.First()
			}
			return it.SeekGE(priorityStart(head, run))
		}
		low, live := v.target(run)
		if !live {
			return false
		}
		if low == nil {
			low = priorityStart(head, run)
		}
		ok := it.SeekGE(low)
		switch {
		case ok:
			v.landed(run, it.Key())
		case it.Error() == nil:
			v.landed(run, nil)
		}
		return ok
	}
	ok := enter(math.MaxInt64)
	for ok {
		pri, at, seq, good := parseDueTail(it.Key(), len(head))
		if !good {
			return fmt.Errorf("%w: due index key %q", ErrCorruptRecord, it.Key())
		}
		if at < from {
			ok = it.SeekGE(appendDueTail(bytes.Clone(head), pri, from, 0))
			continue
		}
		if at > to {
			if pri == math.MinInt64 {
				break
			}
			ok = enter(pri - 1)
			continue
		}
		val, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if !fn(projection.IndexEntry{Pri: pri, At: at, Seq: seq, ID: string(val)}) {
			return nil
		}
		ok = it.Next()
	}
	return it.Error()
}

// scanRange walks the index entries in [lower, upper), whose keys have head bytes before
// (at, seq), passing each one's key (valid only during the call) and entry to fn until fn
// returns false.
func (s reader) scanRange(lower, upper []byte, head int, fn func(key []byte, e projection.IndexEntry) bool) (err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		at, seq, good := parseIndexTail(it.Key(), head)
		if !good {
			return fmt.Errorf("%w: index key %q", ErrCorruptRecord, it.Key())
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if !fn(it.Key(), projection.IndexEntry{At: at, Seq: seq, ID: string(v)}) {
			return nil
		}
	}
	return it.Error()
}

// lastKey returns the greatest key with the prefix, or nil when there is none.
func (s reader) lastKey(prefix byte) (_ []byte, err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	if !it.Last() {
		return nil, it.Error()
	}
	return bytes.Clone(it.Key()), nil
}

// maxIDs reads the greatest task and wake record ids (see maxIDs).
func (s reader) maxIDs() (*maxIDs, error) {
	task, err := s.lastKey(prefixTask)
	if err != nil {
		return nil, err
	}
	wake, err := s.lastKey(prefixWake)
	if err != nil {
		return nil, err
	}
	return &maxIDs{task: newIDMark(task), wake: newIDMark(wake)}, nil
}

func (s reader) LastSeq() (uint64, error) {
	v, ok, err := s.get(keyLastSeq)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: last sequence is %d bytes", ErrCorruptRecord, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// writer implements projection.State: reads through an indexed batch, writes into it.
//
// It also keeps the task and wake records put through it, so reading one back (a command
// reads the record it just appended; the next command of the batch may read it again) costs
// a map lookup instead of a batch-merged Pebble Get and a msgpack decode. A writer lives as
// long as its batch, and every record put into the batch is put into the maps, so they hold
// exactly the batch's latest version of each record.
type writer struct {
	reader
	b       *pebble.Batch
	db      *pebble.DB // b's (Txn.ReserveSubmits makes a larger one)
	lastSeq uint64
	tasks   map[string]projection.Task
	wakes   map[string]projection.Wake
	lows    *indexLows      // nil: scans start at each index's first key
	cache   *recordCache    // records of committed batches; nil: none
	buf     []byte          // record encoding scratch (Batch.Set copies the value)
	kbuf    []byte          // key scratch (keyScratch, Txn.Append; Batch.Set copies the key)
	ebuf    []byte          // event encoding scratch (Txn.Append; Batch.Set copies the value)
	newTask projection.Task // NewTask's record

	// committed reads the DB without the batch. The batch's own records and idempotency keys
	// are in tasks, wakes and keys, so point reads look there first and then go to the DB
	// directly: an indexed batch's Get merges the batch with every layer of the DB and costs
	// several times a plain one. Index scans still read through the batch.
	committed reader
	keys      map[string]string // scoped idempotency key (scopedKey) -> id, put by this batch

	maxIDs *maxIDs // nil: unknown, every miss reads the DB

	inputs inputs // values of this batch's records, for the decide code's reads (input.go)

	// The records put in this batch, in the order first put; finish writes each once.
	taskOrder, wakeOrder []string

	// Format 3's counts (state_kinds_sessions.go), and the low-water marks of the due indexes
	// (runMarks: index.go).
	counts      map[countID]int64    // committed counts, read-only here; nil: read the stored ones
	countDelta  map[countID]int64    // this batch's changes; finish writes them
	partLows    map[partLow]runMarks // committed marks, read-only here
	newPartLows map[partLow]runMarks // this batch's marks (ownRunMarks)
	freeMarks   *[]runMarks          // arrays of marks to reuse (writerState's); nil: none
	dueSteps    uint64               // the index points this writer's due-index walks stepped over (tests)

	deleted *deletedRecords // records this batch pruned (prune.go); nil: none

	// The committed kind policies and schedule index's earliest tick (decide_cache.go), and
	// this batch's changes; policies nil: read the stored ones, sched nil: scan the batch.
	policies     map[string]*projection.KindPolicy
	policyDelta  map[string]*projection.KindPolicy
	sched        *schedFirst
	schedTouched bool

	blobs       map[stageKey]batchBlob // blobs this batch's events refer to (blob.go)
	prunedBlobs []string               // blob files of the subjects this batch pruned
}

// maxIDs answers, for task and wake ids, "no record has this id" without a Pebble Get for
// nearly every new id. projection.Apply checks that a TaskSubmitted's or WakeRecorded's id has
// no record yet; a Get that misses walks both memtables and every level's filter, a fifth of
// the writer's time per submit. Ids are UUIDv7 (time first), so a new id is nearly always
// above every id stored before the writer started, or close behind the newest ones: with many
// callers, ids are drawn before the commands queue, so they reach the writer slightly out of
// order, below the greatest id put so far. See idMark.
type maxIDs struct {
	task, wake idMark
}

// idMark knows every record id above its floor: each such id is in recent. So an id above
// the floor that recent lacks has no record, and only an id at or below the floor (a caller's
// clock far behind, seeded entropy, an id older than the recentKeep newest) needs a Get.
//
// The floor starts at the greatest id stored at Open. Every record put through the writer
// (put) above the floor joins recent; when recent holds more than recentMax ids once a batch
// committed (settle), the floor rises to the greatest id of all but the recentKeep greatest,
// and the ids at or below it leave: the ids above the new floor stay, so the rule holds. The
// floor does not rise during a batch (unless recent passes recentHard): the ids of one batch
// share its callers' millisecond (SubmitMany's 10,000 all do), so they reach the writer in
// random order, and a floor raised among them left most of the batch's later ids below it,
// each then a Get. Only the writer puts records, so an id
// above the floor that recent lacks stays absent; a record deleted by pruning (prune.go) leaves
// its id in recent, which only costs a Get that finds nothing. A put of a discarded batch leaves an id
// in recent without a record, which only costs a Get.
type idMark struct {
	floor  string              // "": no record at Open (or not known); every id is checked against recent
	recent map[string]struct{} // every record id above floor (and a few without a record)
}

// recentKeep and recentMax bound an idMark's set: between recentKeep and recentMax of the
// newest ids, a window of tens of milliseconds at the highest submit rates, far wider than
// the reordering of ids drawn by concurrent callers. Sorting recentMax ids every recentKeep
// puts costs about 0.1 µs per put; a Get costs several µs.
const (
	recentKeep = 2048
	recentMax  = 2 * recentKeep
	recentHard = 1 << 16 // the bound within a batch (put)
)

// newIDMark starts a mark at the greatest record key of its kind (nil: none).
func newIDMark(maxKey []byte) idMark {
	m := idMark{recent: make(map[string]struct{})}
	if len(maxKey) > 1 {
		m.floor = string(maxKey[1:]) // past the prefix byte: ids sort as their keys do
	}
	return m
}

// absent reports whether no record has id (false: not known, look it up).
func (m *idMark) absent(id string) bool {
	if id <= m.floor {
		return false
	}
	_, ok := m.recent[id]
	return !ok
}

// put records that id has a record (or may have: its batch may yet be discarded).
func (m *idMark) put(id string) {
	if id <= m.floor {
		return
	}
	m.recent[id] = struct{}{}
	if len(m.recent) > recentHard {
		m.prune()
	}
}

// settle bounds recent once a batch committed (publish).
func (m *idMark) settle() {
	if len(m.recent) > recentMax {
		m.prune()
	}
}

// prune raises the floor to the greatest id but recentKeep, dropping it and those below.
func (m *idMark) prune() {
	ids := make([]string, 0, len(m.recent))
	for id := range m.recent {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	cut := len(ids) - recentKeep
	m.floor = ids[cut-1]
	for _, id := range ids[:cut] {
		delete(m.recent, id)
	}
}

// indexLows holds, for each eligibility index, a key below which the index has no live entry
// in the state the writer reads (nil: not known, the index's start). Claims scan from there
// instead of from the index's first key, so they do not step over the tombstones that claims
// and settlements leave at the head of the index: a Pebble iterator visits every tombstone
// between its lower bound and the next live key, and they pile up in the memtable until a
// flush and in sstables until a compaction drops them, so a scan from the start costs time
// in proportion to the claims since then.
//
// The single writer keeps the committed lows (writeLoop) and gives each batch's writer a copy.
// A scan raises the copy to the first live key it meets (or to its upper bound when it meets
// none): everything below is absent in the batch's view. A put below the copy lowers it to
// the new key. Deletes change nothing. Only a committed batch's copy replaces the committed
// lows; a discarded batch's is dropped, so a raise never outlives the state it observed.
type indexLows struct {
	ix       [projection.NumIndexes][]byte // the indexes of one partition without priorities (index.go)
	prunable []byte                        // the retention index (prune.go)
}

// scanFrom scans the index range [start, upper), whose keys have head bytes before (at,
// seq), from *low (start when nil) and raises *low to the first live key it meets, or to
// upper when it meets none.
func (w *writer) scanFrom(start, upper []byte, head int, low *[]byte, fn func(projection.IndexEntry) bool) error {
	lower := start
	if *low != nil {
		lower = *low
	}
	if bytes.Compare(lower, upper) >= 0 {
		return nil // no live entry below upper
	}
	var first []byte
	err := w.reader.scanRange(lower, upper, head, func(key []byte, e projection.IndexEntry) bool {
		if first == nil {
			first = bytes.Clone(key)
		}
		return fn(e)
	})
	if err != nil {
		return err
	}
	if first != nil {
		*low = first
	} else {
		*low = upper
	}
	return nil
}

// lower lowers *low to a copy of key when key is below it. It copies so that the callers'
// keys, which it rarely keeps, need not be allocated on the heap at every put.
func lower(low *[]byte, key []byte) {
	if *low != nil && bytes.Compare(key, *low) < 0 {
		*low = bytes.Clone(key)
	}
}

// Task returns a copy, like every projection.Reader: callers may change it freely.
//
// The copy is made only on a hit (c := t): with "return &t" the variable t escaped, and Go
// allocated the whole record on the heap at every lookup, hit or miss (two records per submit).
func (w *writer) Task(id string) (*projection.Task, error) {
	if t, ok := w.tasks[id]; ok {
		c := t
		return &c, nil
	}
	if w.deleted != nil && w.deleted.tasks[id] {
		return nil, nil // pruned in this batch
	}
	if w.cache != nil {
		if t, ok := w.cache.task(id); ok {
			c := t
			return &c, nil
		}
	}
	if w.maxIDs != nil && w.maxIDs.task.absent(id) {
		return nil, nil
	}
	return w.committed.taskRecord(id) // the fold needs no input: see input.go
}

func (w *writer) Wake(id string) (*projection.Wake, error) {
	if x, ok := w.wakes[id]; ok {
		c := x
		return &c, nil
	}
	if w.deleted != nil && w.deleted.wakes[id] {
		return nil, nil // pruned in this batch
	}
	if w.cache != nil {
		if x, ok := w.cache.wake(id); ok {
			c := x
			return &c, nil
		}
	}
	if w.maxIDs != nil && w.maxIDs.wake.absent(id) {
		return nil, nil
	}
	return w.committed.wakeRecord(id)
}

// The writer's side of projection.State's record access: Apply gets copies, and each
// changed one is written back into the batch (and the writer's maps).

func (w *writer) EditTask(id string) (*projection.Task, error) { return w.Task(id) }
func (w *writer) EditWake(id string) (*projection.Wake, error) { return w.Wake(id) }
func (w *writer) TaskEdited(t *projection.Task) error          { return w.PutTask(t) }
func (w *writer) WakeEdited(x *projection.Wake) error          { return w.PutWake(x) }

// NewTask returns the writer's scratch record: Apply fills it and hands it to PutTask, which
// copies it into the batch's map (a submit then allocates no record of its own for it).
func (w *writer) NewTask() *projection.Task {
	w.newTask = projection.Task{}
	return &w.newTask
}
func (w *writer) NewWake() *projection.Wake { return new(projection.Wake) }

func (w *writer) LastSeq() (uint64, error) { return w.lastSeq, nil }

// SetLastSeq records the sequence in the writer; the key is written once per batch, by
// finish, not once per event.
func (w *writer) SetLastSeq(seq uint64) error {
	w.lastSeq = seq
	return nil
}

// finish writes the batch's last sequence, if it applied any event. Call it once, just
// before the batch commits: the key then always moves with the events in the same batch.
func (w *writer) finish(from uint64) error {
	// The counts first: publish merges the batch's changes into the writer's counts whatever
	// the batch holds, so they must be written with it even without an event (only tests
	// change counts without one).
	if err := w.writeCounts(); err != nil {
		return err
	}
	if w.lastSeq == from {
		return nil
	}
	if err := w.writeRecords(); err != nil {
		return err
	}
	return w.b.Set(keyLastSeq, binary.BigEndian.AppendUint64(nil, w.lastSeq), nil)
}

// PutTask keeps the record in the batch's map; finish writes it (writeRecords).
func (w *writer) PutTask(t *projection.Task) error {
	w.keepTaskInput(t)
	t = cachedTask(t)
	if w.maxIDs != nil {
		w.maxIDs.task.put(t.ID)
	}
	if w.tasks == nil {
		w.tasks = make(map[string]projection.Task)
	}
	if _, ok := w.tasks[t.ID]; !ok {
		w.taskOrder = append(w.taskOrder, t.ID)
	}
	w.tasks[t.ID] = *t
	return nil
}

func (w *writer) PutWake(x *projection.Wake) error {
	w.keepWakeValues(x)
	x = cachedWake(x)
	if w.maxIDs != nil {
		w.maxIDs.wake.put(x.ID)
	}
	if w.wakes == nil {
		w.wakes = make(map[string]projection.Wake)
	}
	if _, ok := w.wakes[x.ID]; !ok {
		w.wakeOrder = append(w.wakeOrder, x.ID)
	}
	w.wakes[x.ID] = *x
	return nil
}

func (w *writer) TaskKey(session, key string) (string, error) {
	return w.scopedGet(scopedKey(prefixTaskKey, session, key))
}

func (w *writer) WakeKey(session, key string) (string, error) {
	return w.scopedGet(scopedKey(prefixWakeKey, session, key))
}

func (w *writer) scopedGet(k []byte) (string, error) {
	if id, ok := w.keys[string(k)]; ok {
		return id, nil
	}
	v, _, err := w.committed.get(k)
	return string(v), err
}

func (w *writer) PutTaskKey(session, key, id string) error {
	return w.putScoped(scopedKey(prefixTaskKey, session, key), id)
}

func (w *writer) PutWakeKey(session, key, id string) error {
	return w.putScoped(scopedKey(prefixWakeKey, session, key), id)
}

func (w *writer) putScoped(k []byte, id string) error {
	if err := w.b.Set(k, []byte(id), nil); err != nil {
		return err
	}
	if w.keys == nil {
		w.keys = make(map[string]string)
	}
	w.keys[string(k)] = id
	return nil
}
