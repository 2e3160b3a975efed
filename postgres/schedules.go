package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/projection"
)

// The periodic schedules: one row per (session, name), the record as JSON (schedules are
// few and change rarely: a set, a remove, one tick), and its next tick in a column of its
// own, NULL when the schedule has none (removed, or a rule that names no later time). The
// schedule index (projection.ScheduleReader.ScanScheduleDue) is the partial index on that
// column, so a claim with nothing due reads one index entry. The fold writes the record and
// the column together (PutSchedule, from the record's Entry); the index's own writes
// (PutScheduleDue, DeleteScheduleDue) have nothing left to do.
//
// The group keeps the schedules it read or wrote (txn.scheds): each is read from the server
// at most once per group, under the head lock. Its writes are sent with the group's other
// pending writes (flushSchedules, from flushIndexes: before a scan of the table, and in the
// commit batch), not one statement per write: a claim that submits 1,000 ticks of a
// CatchupAll schedule writes its row once (it was a round trip per tick, issue 23). A failed
// closure rolls the whole group back, and the next attempt begins with a new txn.
//
// The table came after format 1 without changing it, like session_wakes: a read-write Open
// creates it when it is missing (ensureSchedules). A read-only view of a schema without it
// reads no schedules, which is what such a schema holds (no older build writes one).
const schedulesDDL = `CREATE TABLE IF NOT EXISTS {s}.schedules (session bytea, name bytea, rec bytea NOT NULL,
	next bigint, PRIMARY KEY (session, name));
CREATE INDEX IF NOT EXISTS schedules_next ON {s}.schedules (next, session, name) WHERE next IS NOT NULL`

type scheduleStatements struct {
	get, getIn, bySession, due, dueAfter, put, putMany, all string
	table                                                   string
}

func newScheduleStatements(q func(string) string) scheduleStatements {
	return scheduleStatements{
		get: q(`SELECT rec FROM {s}.schedules WHERE session = $1 AND name = $2`),
		getIn: q(`SELECT session, name, rec FROM {s}.schedules
			WHERE (session, name) IN (SELECT * FROM unnest($1::bytea[], $2::bytea[]))`),
		bySession: q(`SELECT rec FROM {s}.schedules WHERE session = $1 ORDER BY name`),
		due:       q(`SELECT session, name, next FROM {s}.schedules WHERE next IS NOT NULL AND next <= $1 ORDER BY next, session, name LIMIT $2`),
		dueAfter: q(`SELECT session, name, next FROM {s}.schedules WHERE next IS NOT NULL AND next <= $1
			AND (next, session, name) > ($3, $4, $5) ORDER BY next, session, name LIMIT $2`),
		put: q(`INSERT INTO {s}.schedules VALUES ($1, $2, $3, $4)
			ON CONFLICT (session, name) DO UPDATE SET rec = excluded.rec, next = excluded.next`),
		putMany: q(`INSERT INTO {s}.schedules SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bigint[])
			ON CONFLICT (session, name) DO UPDATE SET rec = excluded.rec, next = excluded.next`),
		all:   q(`SELECT rec FROM {s}.schedules ORDER BY session, name`),
		table: q(`{s}.schedules`),
	}
}

// ensureSchedules creates the table when the schema has none.
func ensureSchedules(ctx context.Context, tx pgx.Tx, schema string) error {
	if _, err := tx.Exec(ctx, strings.ReplaceAll(schedulesDDL, "{s}", pgx.Identifier{schema}.Sanitize())); err != nil {
		return fmt.Errorf("creating table schedules in schema %q: %w", schema, err)
	}
	return nil
}

func decodeScheduleRow(v []byte) (*projection.Schedule, error) {
	var sc projection.Schedule
	if err := json.Unmarshal(v, &sc); err != nil {
		return nil, fmt.Errorf("%w: schedule: %v", ErrCorruptRow, err)
	}
	return &sc, nil
}

func readSchedule(ctx context.Context, q querier, st *statements, session, name string) (*projection.Schedule, error) {
	var rec []byte
	err := q.QueryRow(ctx, st.sc.get, []byte(session), []byte(name)).Scan(&rec)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeScheduleRow(rec)
}

func scanSessionSchedules(ctx context.Context, q querier, st *statements, session string, fn func(*projection.Schedule) bool) error {
	rows, err := q.Query(ctx, st.sc.bySession, []byte(session))
	if err != nil {
		return err
	}
	var out []*projection.Schedule
	for rows.Next() {
		var rec []byte
		if err := rows.Scan(&rec); err != nil {
			rows.Close()
			return err
		}
		sc, err := decodeScheduleRow(rec)
		if err != nil {
			rows.Close()
			return err
		}
		out = append(out, sc)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, sc := range out {
		if !fn(sc) {
			break
		}
	}
	return nil
}

// schedulePage is how many due entries a scan reads at a time: a claim reads the first
// entry and moves that schedule on, so one small page is what it needs.
const schedulePage = 16

// scanScheduleDue pages through the due entries in (next, session, name) order.
func scanScheduleDue(ctx context.Context, q querier, st *statements, maxAt int64, fn func(projection.ScheduleEntry) bool) error {
	return scanScheduleDueAfter(ctx, q, st, maxAt, nil, fn)
}

// scanScheduleDueAfter is scanScheduleDue after the entry last (nil: from the first).
func scanScheduleDueAfter(ctx context.Context, q querier, st *statements, maxAt int64, last *projection.ScheduleEntry, fn func(projection.ScheduleEntry) bool) error {
	for {
		var rows pgx.Rows
		var err error
		if last == nil {
			rows, err = q.Query(ctx, st.sc.due, maxAt, schedulePage)
		} else {
			rows, err = q.Query(ctx, st.sc.dueAfter, maxAt, schedulePage, last.At, []byte(last.SessionID), []byte(last.Name))
		}
		if err != nil {
			return err
		}
		var page []projection.ScheduleEntry
		for rows.Next() {
			var s, n []byte
			var at int64
			if err := rows.Scan(&s, &n, &at); err != nil {
				rows.Close()
				return err
			}
			page = append(page, projection.ScheduleEntry{At: at, SessionID: string(s), Name: string(n)})
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range page {
			if !fn(e) {
				return nil
			}
		}
		if len(page) < schedulePage {
			return nil
		}
		last = &page[len(page)-1]
	}
}

// Schedule reads through the group's schedules (scheds): a schedule is read from the
// server at most once per group (under the head lock, so it stays exact), and the group's
// own writes are read back without a round trip. It returns a copy.
func (t *txn) Schedule(session, name string) (*projection.Schedule, error) {
	k := skey{session, name}
	if sc, ok := t.scheds[k]; ok {
		return copySchedule(sc), nil
	}
	sc, err := readSchedule(t.ctx, t.conn, t.st, session, name)
	if err != nil {
		return nil, err
	}
	t.keepSchedule(k, sc)
	return copySchedule(sc), nil
}

func copySchedule(sc *projection.Schedule) *projection.Schedule {
	if sc == nil {
		return nil
	}
	c := *sc
	return &c
}

func (t *txn) keepSchedule(k skey, sc *projection.Schedule) {
	if t.scheds == nil {
		t.scheds = map[skey]*projection.Schedule{}
	}
	t.scheds[k] = sc
}

// readSchedules reads the schedules of keys the group has not read yet, in one statement:
// absent ones are kept as absent.
func (t *txn) readSchedules(keys []skey) error {
	var ss, ns [][]byte
	for _, k := range keys {
		if _, ok := t.scheds[k]; !ok {
			ss, ns = append(ss, []byte(k.session)), append(ns, []byte(k.key))
			t.keepSchedule(k, nil)
		}
	}
	if len(ss) == 0 {
		return nil
	}
	rows, err := t.conn.Query(t.ctx, t.st.sc.getIn, ss, ns)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var s, n, rec []byte
		if err := rows.Scan(&s, &n, &rec); err != nil {
			return err
		}
		sc, err := decodeScheduleRow(rec)
		if err != nil {
			return err
		}
		t.keepSchedule(skey{string(s), string(n)}, sc)
	}
	return rows.Err()
}

func (t *txn) ScanSessionSchedules(session string, fn func(*projection.Schedule) bool) error {
	if err := t.sendSchedules(); err != nil {
		return err
	}
	return scanSessionSchedules(t.ctx, t.conn, t.st, session, fn)
}

func (t *txn) ScanScheduleDue(maxAt int64, fn func(projection.ScheduleEntry) bool) error {
	if ok, err := t.scanSchedulesPrefetched(maxAt, fn); ok { // claimpre.go
		return err
	}
	if err := t.sendSchedules(); err != nil { // a scan of the table follows: the pending writes first
		return err
	}
	return scanScheduleDue(t.ctx, t.conn, t.st, maxAt, fn)
}

// PutSchedule keeps the record for the group's next flush (flushSchedules); the state takes
// ownership.
func (t *txn) PutSchedule(sc *projection.Schedule) error {
	rec, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	k := skey{sc.SessionID, sc.Name}
	t.keepSchedule(k, sc)
	if t.schedDirty == nil {
		t.schedDirty = map[skey][]byte{}
	}
	t.schedDirty[k] = rec
	t.sideWrites = true
	if t.pre != nil {
		t.pre.schedOK = false // the begin's read of the schedules is no longer theirs
	}
	return nil
}

// flushSchedules queues the group's pending schedule writes into b (flushIndexes): the
// records and their next ticks (NULL: not in the index), in one statement.
func (t *txn) flushSchedules(b *pgx.Batch) {
	if len(t.schedDirty) == 0 {
		return
	}
	var ss, ns, recs [][]byte
	var next []*int64
	for k, rec := range t.schedDirty {
		var at *int64
		if e, ok := t.scheds[k].Entry(); ok {
			at = &e.At
		}
		ss, ns, recs, next = append(ss, []byte(k.session)), append(ns, []byte(k.key)), append(recs, rec), append(next, at)
	}
	b.Queue(t.st.sc.putMany, ss, ns, recs, next)
	clear(t.schedDirty)
}

// sendSchedules sends the pending schedule writes now: a scan of the table follows.
func (t *txn) sendSchedules() error {
	if len(t.schedDirty) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	t.flushSchedules(b)
	return t.conn.SendBatch(t.ctx, b).Close()
}

// PrefetchTaskKeys reads the session's task keys that the cache does not hold in one
// statement (engineapi.KeyPrefetcher: the ticks a claim submits), under the head lock: the
// absent ones are cached as absent, so TaskKey answers every one without a read.
func (t *txn) PrefetchTaskKeys(sessionID string, keys []string) error {
	var ss, ks [][]byte
	for _, k := range keys {
		if _, ok := t.c.taskKeys[skey{sessionID, k}]; !ok {
			ss, ks = append(ss, []byte(sessionID)), append(ks, []byte(k))
		}
	}
	if len(ks) == 0 {
		return nil
	}
	if t.optimistic {
		return t.refuseRead()
	}
	found := make(map[string]string, 1)
	rows, err := t.conn.Query(t.ctx, t.st.taskKeysIn, ss, ks)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var s, k, id []byte
		if err := rows.Scan(&s, &k, &id); err != nil {
			return err
		}
		found[string(k)] = string(id)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	t.reads += len(ks)
	for _, k := range ks {
		t.c.taskKeys[skey{sessionID, string(k)}] = found[string(k)] // "": absent
	}
	return nil
}

// PrefetchNewTaskKeys is engineapi.NewKeyPrefetcher's (a SubmitMany's keys). Under the
// lock, it reads the keys the cache does not hold (nor a hint of read-first proves absent)
// in one statement, with the record of each task a key names, which the repeat then reads
// (read-first's statement, ViewDurable's: readfirst.go). TaskKey and EditTask read each in a
// round trip of their own, the log head held all along: 10,000 for a batch of new keys. Before
// the lock it reads nothing: TaskKey takes a key the cache does not hold as absent, unread,
// and the batch's insert proves it (fast.go).
func (t *txn) PrefetchNewTaskKeys(sessionID string, keys []string) error {
	if t.optimistic {
		return nil
	}
	var ss, ks [][]byte
	want := make(map[string]bool, len(keys))
	for _, key := range keys {
		k := skey{sessionID, key}
		if _, ok := t.c.taskKeys[k]; ok || want[key] || t.hints != nil && t.hints.absent(false, k, t.c.from) {
			continue
		}
		want[key] = true
		ss, ks = append(ss, []byte(sessionID)), append(ks, []byte(key))
	}
	if len(ks) < 2 { // one: TaskKey's own read costs as much
		return nil
	}
	if t.trace != nil {
		t.trace.readRecord()
	}
	t.reads += len(ks)
	rows, err := t.conn.Query(t.ctx, t.st.taskKeysRec, ss, ks)
	if err != nil {
		return err
	}
	answers, err := collectKeyAnswers(rows, taskTable.cols, len(ks)) // readfirst.go
	if err != nil {
		return err
	}
	tasks := taskTable.cached(t.c)
	for i, a := range answers {
		id := string(a.id)
		t.c.taskKeys[skey{sessionID, string(ks[i])}] = id // "": absent
		if a.id == nil || a.rec.rec == nil {
			continue // no key; or a key without its record, which EditTask reads (and finds none)
		}
		if _, ok := tasks[id]; ok {
			continue
		}
		r, err := taskTable.decodeRow(id, a.rec)
		if err != nil {
			return err
		}
		tasks[id] = r
		noteBig(t, taskTable, r)
	}
	return nil
}

// PutScheduleDue and DeleteScheduleDue: the index is the next column, which PutSchedule
// writes with the record.
func (t *txn) PutScheduleDue(projection.ScheduleEntry) error    { return nil }
func (t *txn) DeleteScheduleDue(projection.ScheduleEntry) error { return nil }

// hasSchedules says whether the view's schema has the table (a read-only view of a schema
// made before it has none, and a failed query would end the view's transaction).
func (v viewReader) hasSchedules() (bool, error) {
	var ok bool
	err := v.tx.QueryRow(v.ctx, `SELECT to_regclass($1) IS NOT NULL`, v.st.sc.table).Scan(&ok)
	return ok, err
}

func (v viewReader) Schedule(session, name string) (*projection.Schedule, error) {
	if ok, err := v.hasSchedules(); !ok || err != nil {
		return nil, err
	}
	return readSchedule(v.ctx, v.tx, v.st, session, name)
}

func (v viewReader) ScanSessionSchedules(session string, fn func(*projection.Schedule) bool) error {
	if ok, err := v.hasSchedules(); !ok || err != nil {
		return err
	}
	return scanSessionSchedules(v.ctx, v.tx, v.st, session, fn)
}

func (v viewReader) ScanScheduleDue(maxAt int64, fn func(projection.ScheduleEntry) bool) error {
	if ok, err := v.hasSchedules(); !ok || err != nil {
		return err
	}
	return scanScheduleDue(v.ctx, v.tx, v.st, maxAt, fn)
}

// loadSchedules reads the schedules into m (Verify): the records, and the index entries
// their next column makes.
func loadSchedules(ctx context.Context, q querier, st *statements, m projection.State) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, st.sc.table).Scan(&exists); err != nil || !exists {
		return err
	}
	return eachRow(ctx, q, st.sc.all, func(r pgx.Rows) error {
		var rec []byte
		if err := r.Scan(&rec); err != nil {
			return err
		}
		sc, err := decodeScheduleRow(rec)
		if err != nil {
			return err
		}
		if e, ok := sc.Entry(); ok {
			if err := m.PutScheduleDue(e); err != nil {
				return err
			}
		}
		return m.PutSchedule(sc)
	})
}
