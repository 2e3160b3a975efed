package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/projection"
)

// The eligibility indexes (projection.Index): one table each, described by a row of
// pgIndexes, with one set of statements (indexStatements) and one ScanIndex, PutIndex and
// DeleteIndex for all of them. A table's primary key is ([part,] at, seq); the row holds the
// record's id and, in an index with priorities, the task's priority (prioritySchema's
// indexes serve the walk priority by priority).
type pgIndex struct {
	table string // the table in the queue's schema
	part  string // the partition's column ("kind", "session"), or "" for an index of one
	wakes bool   // the entries are wakes (wake_id, joined to wakes), not tasks (task_id)
	// bare: a scan reads the entries alone, joining no record (the lease index: a claim
	// counts its entries and reads none of their tasks).
	bare bool
	// small: the table holds few live rows but takes as many deletes as inserts (the lease
	// index: a row from a claim to its settle), so it is small whenever the server plans its
	// statements and large with dead rows between vacuums. Its deletions are planned with
	// sequential scans off (seqScanOff).
	small bool
}

// A table that holds a handful of live rows is planned as what it is: a page or two, which a
// sequential scan reads faster than any index. pgx prepares each statement once per
// connection and PostgreSQL keeps the generic plan it chose then, so the commit's deletion
// from kind_leases ran as a hash join over a sequential scan of the whole table for the
// connection's life. But every claim inserts a row and every settle deletes one, and the
// space of the deleted rows comes back only when autovacuum passes (at most once a minute a
// database): between passes the table grows by a row per claim, and each group's deletion
// read all of it. In bench/'s W2 (40,000 claims in about four seconds) it read 226 buffers a
// group and took 189 µs a call on average, and the cost grows with the time since the last
// vacuum. Planned with sequential scans off (SET LOCAL, inside the group's transaction, for
// that statement alone: enable_seqscan is back to its default for the statements after it),
// the plan is a nested loop over the primary key, whatever the table's size when it was
// planned: 122 buffers a group and 88 µs a call in the same workload (2026-12-05,
// pg_stat_statements over BenchmarkWorklogPGW2Runner). Over 80,000 tasks (8–10 s) the scan
// had grown to 504 buffers and 549 µs a call, against 143 and 89 with the key, and the
// server's execution time of the whole run fell from 11.0 s to 8.2 s (8,345 → 10,431 tasks/s
// in that pair; at 20,000 tasks, four interleaved pairs, no change beyond the spread). The
// plan is made under the setting (the first executions, then the generic plan kept for later
// ones); the two SETs cost two statements in the batch of a group that settles.
const (
	seqScanOff     = "SET LOCAL enable_seqscan = off"
	seqScanDefault = "SET LOCAL enable_seqscan TO DEFAULT"
)

var pgIndexes = [projection.NumIndexes]pgIndex{
	projection.IndexDue:          {table: "due"},
	projection.IndexKindDue:      {table: "kind_due", part: "kind"},
	projection.IndexWakes:        {table: "wake_index", wakes: true},
	projection.IndexSessionWakes: {table: "session_wakes", part: "session", wakes: true},
	projection.IndexKindLeases:   {table: "kind_leases", part: "kind", bare: true, small: true}, // kind_policies.go
}

// indexStatements are an index's statements, with the queue's schema in them.
type indexStatements struct {
	// scan and scanFrom read a page of one partition's entries due at $1 (at most $2): the
	// partition ($3, if any), then the priority (if any), then after the first page (or for
	// a scan from a lower bound: indexArgs) the last entry's (at, seq); nextPri finds the
	// greatest priority present below $1 (of the partition $2), for scanByPriority.
	scan, scanFrom, nextPri string
	// entries and entriesFrom are scan and scanFrom reading the entries alone, joining no
	// record: a View's scan (viewReader.ScanIndex), whose callers get the entries only. The
	// join read every entry's record (its input too) for nothing: Stats' walk of the due
	// index, polled every 10 ms by BenchmarkProcesses, took 1.9 s of the server's CPU in a
	// 3 s run of 20,000 tasks (2026-12-05).
	entries, entriesFrom string
	ins, del, all        string // the commit's writes (unnest arrays); Verify's read of every entry
	table                string // the table's qualified name, for to_regclass
}

// newIndexStatements builds ix's statements; withPri false: a due table that no Open of
// this build has given the priority column yet (withoutPriority), all of priority 0.
func newIndexStatements(q func(string) string, ix projection.Index, withPri bool) indexStatements {
	d := pgIndexes[ix]
	pri := projection.Indexes[ix].Priority
	id, rec := "task_id", "d.task_id, t.rec, t.input FROM {s}.%s d LEFT JOIN {s}.tasks t ON t.id = d.task_id"
	switch {
	case d.wakes:
		id, rec = "wake_id", "d.wake_id, w.rec, w.payload, w.output FROM {s}.%s d LEFT JOIN {s}.wakes w ON w.id = d.wake_id"
	case d.bare:
		rec = "d.task_id FROM {s}.%s d"
	}
	// key: the primary key's columns; where: the scan's conditions on the partition and the
	// priority; n: the next parameter.
	key, where, n := "at, seq", "", 3
	keyTypes := []string{"bigint", "bigint"}
	if d.part != "" {
		key = d.part + ", " + key
		where += fmt.Sprintf("d.%s = $%d AND ", d.part, n)
		n++
		keyTypes = append([]string{"bytea"}, keyTypes...)
	}
	cols, unnest := key+", "+id, append(keyTypes, "bytea")
	all := "SELECT " + key + ", " + id
	if pri {
		if withPri {
			where += fmt.Sprintf("d.priority = $%d AND ", n)
			all += ", priority"
		} else {
			where += fmt.Sprintf("$%d::bigint = 0 AND ", n)
			all += ", 0::bigint"
		}
		n++
		cols, unnest = cols+", priority", append(unnest, "bigint")
	}
	from := fmt.Sprintf(" AND (d.at, d.seq) > ($%d, $%d)", n, n+1)
	scan := "SELECT d.at, d.seq, " + fmt.Sprintf(rec, d.table) + " WHERE " + where + "d.at <= $1"
	entries := "SELECT d.at, d.seq, d." + id + " FROM {s}." + d.table + " d WHERE " + where + "d.at <= $1"
	const order = " ORDER BY d.at, d.seq LIMIT $2"
	st := indexStatements{
		scan:        q(scan + order),
		scanFrom:    q(scan + from + order),
		entries:     q(entries + order),
		entriesFrom: q(entries + from + order),
		ins:         q("INSERT INTO {s}." + d.table + " (" + cols + ") SELECT * FROM unnest(" + arrays(unnest) + ")"),
		del:         q("DELETE FROM {s}." + d.table + " WHERE (" + key + ") IN (SELECT * FROM unnest(" + arrays(keyTypes) + "))"),
		all:         q(all + " FROM {s}." + d.table + " ORDER BY " + key),
		table:       q("{s}." + d.table),
	}
	if pri {
		part := ""
		if d.part != "" {
			part = d.part + " = $2 AND "
		}
		st.nextPri = q("SELECT priority FROM {s}." + d.table + " WHERE " + part + "priority < $1 ORDER BY priority DESC LIMIT 1")
		if !withPri {
			if part != "" {
				part = " WHERE " + strings.TrimSuffix(part, " AND ")
			}
			st.nextPri = q("SELECT 0::bigint WHERE $1::bigint > 0 AND EXISTS (SELECT 1 FROM {s}." + d.table + part + ")")
		}
	}
	return st
}

// arrays is unnest's arguments: $1::t1[], $2::t2[], ...
func arrays(types []string) string {
	out := make([]string, len(types))
	for i, t := range types {
		out[i] = fmt.Sprintf("$%d::%s[]", i+1, t)
	}
	return strings.Join(out, ", ")
}

// indexStatementsOf builds every index's statements.
func indexStatementsOf(q func(string) string, withPri bool) (out [projection.NumIndexes]indexStatements) {
	for ix := range out {
		out[ix] = newIndexStatements(q, projection.Index(ix), withPri)
	}
	return out
}

// scanIndexOf is ScanIndex over any querier: scan reads one run (first, next: its page
// statements; pre: the partition and priority) of index d, from its records' table or bare
// (entries: the statements that join no record, whatever d).
func scanIndexOf(st *statements, ix projection.Index, part string, entries bool, fn func(projection.IndexEntry) bool,
	nextPri func(sql string, args ...any) ([]int64, error),
	scan func(d pgIndex, first, next string, pre []any, fn func(projection.IndexEntry) bool) error,
) error {
	s, d := &st.idx[ix], pgIndexes[ix]
	first, next := s.scan, s.scanFrom
	if entries {
		first, next = s.entries, s.entriesFrom
	}
	var pre []any
	if d.part != "" {
		pre = []any{[]byte(part)}
	}
	if !projection.Indexes[ix].Priority {
		return scan(d, first, next, pre, fn)
	}
	return scanByPriority(func(below int64) ([]int64, error) {
		return nextPri(s.nextPri, append([]any{below}, pre...)...)
	}, func(pri int64, fn func(projection.IndexEntry) bool) error {
		return scan(d, first, next, append(pre[:len(pre):len(pre)], pri), fn)
	}, fn)
}

func (t *txn) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	if from > to {
		return nil
	}
	if ix == projection.IndexDue || ix == projection.IndexKindDue {
		return t.scanDue(ix, part, from, to, fn) // claimpre.go
	}
	return t.scanIndexServer(ix, part, from, to, fn)
}

// scanIndexServer is ScanIndex from the server, the group's pending writes sent first.
func (t *txn) scanIndexServer(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	return scanIndexOf(t.st, ix, part, false, fn, func(sql string, args ...any) ([]int64, error) {
		return txnPage(t, scanInt, sql, args...)
	}, func(d pgIndex, first, next string, pre []any, fn func(projection.IndexEntry) bool) error {
		switch {
		case d.bare:
			return scanBare(func(sql string, args ...any) ([]projection.IndexEntry, error) {
				return txnPage(t, scanBareRow, sql, args...)
			}, first, next, pre, from, to, fn)
		case d.wakes:
			return scanJoined(t, wakeTable, first, next, pre, from, to, nil, fn)
		}
		return scanJoined(t, taskTable, first, next, pre, from, to, nil, fn)
	})
}

// ScanIndex of a View: the entries alone, joining no record (a View keeps none; its caller
// reads the records it wants by id). A schema made by a build before session_wakes, opened
// read-only (which creates nothing), has no such table: the scan says so. One made before
// the kind policies has no kind_leases and no policy, so nothing asks; it reads as empty.
func (v viewReader) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	if from > to {
		return nil
	}
	err := scanIndexOf(v.st, ix, part, true, fn, func(sql string, args ...any) ([]int64, error) {
		return queryPage(v.ctx, v.tx, scanInt, sql, args...)
	}, func(_ pgIndex, first, next string, pre []any, fn func(projection.IndexEntry) bool) error {
		return scanBare(func(sql string, args ...any) ([]projection.IndexEntry, error) {
			return queryPage(v.ctx, v.tx, scanBareRow, sql, args...)
		}, first, next, pre, from, to, fn)
	})
	switch {
	case ix == projection.IndexSessionWakes && isUndefinedTable(err):
		return fmt.Errorf("%w: the queue has no per-session wake index (table session_wakes) yet: a read-write Open creates it", errNoSessionWakes)
	case ix == projection.IndexKindLeases && isUndefinedTable(err):
		return nil
	}
	return err
}

// DueSummary is projection.DueSummarizer's: Stats' count of the due index up to maxAt, and
// its least At, in one statement (an index range scan on the server) instead of a walk that
// brings every entry over, a page a round trip: Stats over 20,000 due tasks took 12 ms a
// call that way (51 ms when the walk joined the records), and 2.1 ms this way
// (2026-12-05).
func (v viewReader) DueSummary(maxAt int64) (n, oldestAt int64, err error) {
	err = v.tx.QueryRow(v.ctx, v.st.dueSummary, maxAt).Scan(&n, &oldestAt)
	return n, oldestAt, err
}

// scanBare pages through an index read bare (pgIndex.bare) with page.
func scanBare(page func(sql string, args ...any) ([]projection.IndexEntry, error), first, next string, pre []any, from, to int64,
	fn func(projection.IndexEntry) bool,
) error {
	return keyset(indexPages, func(last *projection.IndexEntry, n int) ([]projection.IndexEntry, error) {
		sql, args := indexArgs(first, next, pre, from, to, last, n)
		return page(sql, args...)
	}, func(e projection.IndexEntry) (bool, error) { return fn(e), nil })
}

func scanBareRow(rows pgx.Rows) (projection.IndexEntry, error) {
	var e projection.IndexEntry
	var seq int64
	var id []byte
	err := rows.Scan(&e.At, &seq, &id)
	e.Seq, e.ID = uint64(seq), string(id)
	return e, err
}

// idxKey names one entry of an index: its partition and (at, seq).
type idxKey struct {
	part string
	at   int64
	seq  uint64
}

// PutIndex and DeleteIndex keep the group's writes in memory, netted (netDelete);
// flushIndexes sends them. A put over a pending delete replaces a stored entry: the flush
// sends both, the delete first, so that the put is a plain INSERT (an upsert, INSERT ... ON
// CONFLICT, costs the server twice a plain row: 10,000 of them were a third of a
// SubmitMany's commit).
func (t *txn) PutIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	m, k := t.idx[ix], idxKey{part, e.At, e.Seq}
	op, ok := m[k]
	m[k] = idxOp{put: true, id: e.ID, pri: e.Pri, replaces: op.replaces || ok && !op.put}
	t.noteIndexWrite(ix, k, idxOp{put: true, id: e.ID, pri: e.Pri})
	return nil
}

func (t *txn) DeleteIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	k := idxKey{part, e.At, e.Seq}
	netDelete(t.idx[ix], k)
	t.noteIndexWrite(ix, k, idxOp{})
	return nil
}

// queueIndexes queues the group's pending writes of every index into b: deletions first
// (those a put replaces included), then the puts as plain inserts.
func (t *txn) queueIndexes(b *pgx.Batch) {
	for ix, m := range t.idx {
		if len(m) == 0 {
			continue
		}
		parted, pri := pgIndexes[ix].part != "", projection.Indexes[ix].Priority
		var pp, dp, pid [][]byte
		var pa, ps, da, ds, pr []int64
		for k, op := range m {
			if !op.put || op.replaces {
				dp, da, ds = append(dp, []byte(k.part)), append(da, k.at), append(ds, int64(k.seq))
			}
			if op.put {
				pp, pa, ps, pid, pr = append(pp, []byte(k.part)), append(pa, k.at), append(ps, int64(k.seq)), append(pid, []byte(op.id)), append(pr, op.pri)
			}
		}
		st := &t.st.idx[ix]
		if len(da) > 0 {
			args := []any{da, ds}
			if parted {
				args = []any{dp, da, ds}
			}
			if pgIndexes[ix].small {
				b.Queue(seqScanOff)
				b.Queue(st.del, args...)
				b.Queue(seqScanDefault)
			} else {
				b.Queue(st.del, args...)
			}
		}
		if len(pa) > 0 {
			args := []any{pa, ps, pid}
			if parted {
				args = []any{pp, pa, ps, pid}
			}
			if pri {
				args = append(args, pr)
			}
			queueRows(b, t.st, st.ins, args...)
		}
		clear(m)
	}
}

// loadEntries reads every index into m (Verify), after its records. A schema opened
// read-only that predates an index's table has nothing to compare: m then gets the entries
// the fold implies (implied), so that Verify reports what the schema holds and nothing about
// an index it does not have yet.
func loadEntries(ctx context.Context, q querier, st *statements, m verifyState, fold verifyFold) error {
	for ix := range projection.NumIndexes {
		if implied := impliedEntries(ix); implied != nil {
			var exists bool
			if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, st.idx[ix].table).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				if err := implied(m, fold); err != nil {
					return err
				}
				continue
			}
		}
		parted, pri := pgIndexes[ix].part != "", projection.Indexes[ix].Priority
		if err := eachRow(ctx, q, st.idx[ix].all, func(r pgx.Rows) error {
			var part, id []byte
			var at, seq, p int64
			dst := []any{&at, &seq, &id}
			if parted {
				dst = append([]any{&part}, dst...)
			}
			if pri {
				dst = append(dst, &p)
			}
			if err := r.Scan(dst...); err != nil {
				return err
			}
			return m.PutIndex(ix, string(part), projection.IndexEntry{Pri: p, At: at, Seq: uint64(seq), ID: string(id)})
		}); err != nil {
			return err
		}
	}
	return nil
}

// impliedEntries is how Verify fills an index that a schema may predate (loadEntries), or nil
// for an index every schema has: the per-session wake index from the stored wake index (each
// wake's session from the fold), the lease index from the fold's running tasks (a schema
// without kind_leases has no policy).
func impliedEntries(ix projection.Index) func(m verifyState, fold verifyFold) error {
	switch ix {
	case projection.IndexSessionWakes:
		return func(m verifyState, fold verifyFold) error { return impliedSessionWakes(m, fold.Wake) }
	case projection.IndexKindLeases:
		return func(m verifyState, fold verifyFold) error {
			return fold.eachTask(func(t *projection.Task) error {
				if e, ok := t.LeaseEntry(); ok {
					return m.PutIndex(ix, t.Kind, e)
				}
				return nil
			})
		}
	}
	return nil
}
