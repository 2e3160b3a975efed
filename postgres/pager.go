package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/projection"
)

// Every paged read of a table is one keyset loop (keyset): a page is the rows after the
// last row of the page before, in the key's order, LIMIT n; the rows of a page are read
// whole before fn sees them (no result is open while fn runs), and a short page is the
// last. What differs between the tables is said once, in a pages rule and, for the record
// tables, a recordTable.

// pages is a page-size rule: the first page's size and the largest a page grows to. Each
// next page doubles, never below the first: an index scan of a claim of a few tasks reads a
// few rows, a long scan few round trips; a prune's one page of limit+1 stays as it is.
type pages struct{ first, max int }

// scanPage is the first index scan page's size, scanPageMax the largest.
const (
	scanPage    = 16
	scanPageMax = 1024
)

var (
	indexPages = pages{scanPage, scanPageMax}
	// tablePages reads a whole table (the log, the records) in pages of readLogPage.
	tablePages = pages{readLogPage, readLogPage}
)

func (p pages) next(n int) int { return max(n, min(2*n, p.max)) }

// keyset calls fetch for page after page, each of at most n rows after last (nil: from the
// start), and fn with each row in order, until fn returns false or an error, or a page comes
// back short.
func keyset[R any](p pages, fetch func(last *R, n int) ([]R, error), fn func(R) (bool, error)) error {
	var last *R
	for n := p.first; ; n = p.next(n) {
		rows, err := fetch(last, n)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if more, err := fn(r); err != nil || !more {
				return err
			}
		}
		if len(rows) < n {
			return nil
		}
		last = &rows[len(rows)-1]
	}
}

// collect reads every row of rows with scan.
func collect[R any](rows pgx.Rows, scan func(pgx.Rows) (R, error)) ([]R, error) {
	defer rows.Close()
	var out []R
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// queryPage runs one page's query on q and collects its rows.
func queryPage[R any](ctx context.Context, q querier, scan func(pgx.Rows) (R, error), sql string, args ...any) ([]R, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return collect(rows, scan)
}

// recordTable describes a record table (tasks, wakes) to the reads, scans and commit that
// all record tables share. A row is the id, the record (internal/recordcodec, without the
// values kept in their own columns) and those columns: a task's input; a wake's payload and
// output (their own columns, so that a record's update does not rewrite them).
type recordTable[R any] struct {
	name string // the table, in the errors naming a row
	cols int    // the columns after rec
	// decode decodes a stored record (key names it in errors); id is the record's id.
	decode func(key, rec []byte) (*R, error)
	id     func(*R) string
	// split encodes r as stored: its record without the column values, and those values
	// (never nil: the columns are NOT NULL); join puts non-empty column values back.
	split  func(*R) (rec []byte, cols [][]byte)
	join   func(r *R, cols [][]byte)
	cached func(*cache) map[string]*R
	// valueLen is the length of r's values, which bound what the cache keeps (cacheValueMax).
	valueLen func(*R) int
}

var (
	taskTable = &recordTable[projection.Task]{
		name: "tasks", cols: 1,
		decode:   recordcodec.DecodeTask,
		id:       func(r *projection.Task) string { return r.ID },
		valueLen: func(r *projection.Task) int { return len(r.Input) + len(r.Outcome.Output) },
		split: func(r *projection.Task) ([]byte, [][]byte) {
			c := *r
			c.Input = nil
			return recordcodec.AppendTask(nil, &c), [][]byte{nonNil(r.Input)}
		},
		join: func(r *projection.Task, cols [][]byte) {
			if len(cols[0]) > 0 {
				r.Input = cols[0]
			}
		},
		cached: func(c *cache) map[string]*projection.Task { return c.tasks },
	}
	wakeTable = &recordTable[projection.Wake]{
		name: "wakes", cols: 2,
		decode:   recordcodec.DecodeWake,
		id:       func(r *projection.Wake) string { return r.ID },
		valueLen: func(r *projection.Wake) int { return len(r.Payload) + len(r.Outcome.Output) },
		split: func(r *projection.Wake) ([]byte, [][]byte) {
			c := *r
			c.Payload, c.Outcome.Output = nil, nil
			return recordcodec.AppendWake(nil, &c), [][]byte{nonNil(r.Payload), nonNil(r.Outcome.Output)}
		},
		join: func(r *projection.Wake, cols [][]byte) {
			if len(cols[0]) > 0 {
				r.Payload = cols[0]
			}
			if len(cols[1]) > 0 {
				r.Outcome.Output = cols[1]
			}
		},
		cached: func(c *cache) map[string]*projection.Wake { return c.wakes },
	}
)

// storedRow is a row's record and columns as read, before decoding; rec is nil where a LEFT
// JOIN found no record.
type storedRow struct {
	rec  []byte
	cols [][]byte
}

// scanRow scans keys (the columns before the record), then the record and its columns.
func (tb *recordTable[R]) scanRow(rows pgx.Rows, keys ...any) (storedRow, error) {
	s := storedRow{cols: make([][]byte, tb.cols)}
	dest := append(keys, &s.rec)
	for i := range s.cols {
		dest = append(dest, &s.cols[i])
	}
	return s, rows.Scan(dest...)
}

// decodeRow decodes the row of id; a record that does not decode or names another id is
// ErrCorruptRow naming the row.
func (tb *recordTable[R]) decodeRow(id string, s storedRow) (*R, error) {
	r, err := tb.decode([]byte(tb.name+" "+id), s.rec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptRow, err)
	}
	if got := tb.id(r); got != id {
		return nil, fmt.Errorf("%w: %s row %q holds the record of %q", ErrCorruptRow, tb.name, id, got)
	}
	tb.join(r, s.cols)
	return r, nil
}

// read reads the record of id (sql: its rec and columns by id); nil when there is none.
func (tb *recordTable[R]) read(ctx context.Context, q querier, sql, id string) (*R, error) {
	s := storedRow{cols: make([][]byte, tb.cols)}
	dest := []any{&s.rec}
	for i := range s.cols {
		dest = append(dest, &s.cols[i])
	}
	err := q.QueryRow(ctx, sql, []byte(id)).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return tb.decodeRow(id, s)
}

// idRow is a record table's row with its id.
type idRow struct {
	id []byte
	storedRow
}

// scanAll pages through the table in id order (sql: id, rec and columns after $1, LIMIT
// $2), each page a read through r; fn gets each decoded record, or the error naming the row that does not decode.
func (tb *recordTable[R]) scanAll(ctx context.Context, r reads, sql string, fn func(*R, error) error) error {
	scan := func(rows pgx.Rows) (idRow, error) {
		var x idRow
		var err error
		x.storedRow, err = tb.scanRow(rows, &x.id)
		return x, err
	}
	return keyset(tablePages, func(last *idRow, n int) ([]idRow, error) {
		after := []byte{}
		if last != nil {
			after = last.id
		}
		return readValue(ctx, r, func(q querier) ([]idRow, error) { return queryPage(ctx, q, scan, sql, after, n) })
	}, func(x idRow) (bool, error) {
		return true, fn(tb.decodeRow(string(x.id), x.storedRow))
	})
}

// queueByIDs queues a read of the records of ids (sql: id, rec and columns of the ids in
// $1) into the cache c.
func (tb *recordTable[R]) queueByIDs(b *pgx.Batch, c *cache, sql string, ids [][]byte) {
	if len(ids) == 0 {
		return
	}
	b.Queue(sql, ids).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id []byte
			s, err := tb.scanRow(rows, &id)
			if err != nil {
				return err
			}
			r, err := tb.decodeRow(string(id), s)
			if err != nil {
				return err
			}
			tb.cached(c)[tb.id(r)] = r
		}
		return rows.Err()
	})
}

// queueWrites queues the commit's inserts of the records in added and updates of those in
// changed but not added (only rec: the columns never change), from the cache c.
func (tb *recordTable[R]) queueWrites(b *pgx.Batch, st *statements, c *cache, ins, upd string, added, changed map[string]bool) {
	m := tb.cached(c)
	if len(added) > 0 {
		var ids, recs [][]byte
		cols := make([][][]byte, tb.cols)
		for id := range added {
			rec, cs := tb.split(m[id])
			ids, recs = append(ids, []byte(id)), append(recs, rec)
			for i := range cols {
				cols[i] = append(cols[i], cs[i])
			}
		}
		args := []any{ids, recs}
		for _, c := range cols {
			args = append(args, c)
		}
		queueRows(b, st, ins, args...)
	}
	var ids, recs [][]byte
	for id := range changed {
		if !added[id] {
			rec, _ := tb.split(m[id])
			ids, recs = append(ids, []byte(id)), append(recs, rec)
		}
	}
	if len(ids) > 0 {
		b.Queue(upd, ids, recs)
	}
}

// indexRow is an index entry, with the record the scan joins (rec nil: none, or not read).
type indexRow struct {
	projection.IndexEntry
	storedRow
}

// scanIndexRow scans at, seq and id, then the record tb's table joins and its columns.
func scanIndexRow[R any](tb *recordTable[R], rows pgx.Rows) (indexRow, error) {
	var at, seq int64
	var id []byte
	s, err := tb.scanRow(rows, &at, &seq, &id)
	return indexRow{projection.IndexEntry{At: at, Seq: uint64(seq), ID: string(id)}, s}, err
}

// indexArgs are the statement and arguments of an index scan's page of entries with At in
// [from, to]: $1 to, $2 the page size, then pre (the kind scan's $3), then the last entry's
// at and seq after the first page (next). A scan from a lower bound starts as if after an
// entry (from-1, the greatest seq): (at, seq) > (from-1, max) is at >= from, so the bound
// needs no statement of its own.
func indexArgs(first, next string, pre []any, from, to int64, last *projection.IndexEntry, n int) (string, []any) {
	args := append([]any{to, n}, pre...)
	if last == nil && from != math.MinInt64 {
		last = &projection.IndexEntry{At: from - 1, Seq: math.MaxInt64}
	}
	if last == nil {
		return first, args
	}
	return next, append(args, last.At, int64(last.Seq))
}
