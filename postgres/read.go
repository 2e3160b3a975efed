package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// querier is what the reads need: a connection (the writer's) or a transaction (a view's).
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readTask(ctx context.Context, q querier, st *statements, id string) (*projection.Task, error) {
	var rec, input []byte
	err := q.QueryRow(ctx, st.task, []byte(id)).Scan(&rec, &input)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeTask(id, rec, input)
}

func readWake(ctx context.Context, q querier, st *statements, id string) (*projection.Wake, error) {
	var rec, payload, output []byte
	err := q.QueryRow(ctx, st.wake, []byte(id)).Scan(&rec, &payload, &output)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeWake(id, rec, payload, output)
}

func readKey(ctx context.Context, q querier, sql, session, key string) (string, error) {
	var id []byte
	err := q.QueryRow(ctx, sql, []byte(session), []byte(key)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return string(id), err
}

func scanSession(ctx context.Context, q querier, st *statements, session string, after uint64, fn func(uint64, string) bool) error {
	page := scanPage
	for {
		type entry struct {
			seq uint64
			id  string
		}
		var es []entry
		rows, err := q.Query(ctx, st.scanSession, []byte(session), int64(after), page)
		if err != nil {
			return err
		}
		for rows.Next() {
			var seq int64
			var id []byte
			if err := rows.Scan(&seq, &id); err != nil {
				rows.Close()
				return err
			}
			es = append(es, entry{uint64(seq), string(id)})
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, e := range es {
			if !fn(e.seq, e.id) {
				return nil
			}
		}
		if len(es) < page {
			return nil
		}
		after = es[len(es)-1].seq
		page = min(page*2, scanPageMax)
	}
}

func readCounts(ctx context.Context, q querier, st *statements, fn func(string, events.TaskState, int64) bool) error {
	rows, err := q.Query(ctx, st.counts)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var kind []byte
		var state int16
		var n int64
		if err := rows.Scan(&kind, &state, &n); err != nil {
			return err
		}
		if !fn(string(kind), events.TaskState(state), n) {
			return nil
		}
	}
	return rows.Err()
}

// scanIndex pages through an index (entries only), for views.
func scanIndex(ctx context.Context, q querier, first, from string, pre []any, maxAt int64, withRecs int, fn func(projection.IndexEntry) bool) error {
	var last projection.IndexEntry
	page := scanPage
	for started := false; ; started = true {
		sql, args := first, append([]any{maxAt, page}, pre...)
		if started {
			sql, args = from, append(args, last.At, int64(last.Seq))
		}
		rows, err := q.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		var entries []projection.IndexEntry
		for rows.Next() {
			var at, seq int64
			var id []byte
			dest := []any{&at, &seq, &id}
			for range withRecs {
				dest = append(dest, new([]byte))
			}
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return err
			}
			entries = append(entries, projection.IndexEntry{At: at, Seq: uint64(seq), ID: string(id)})
		}
		if err := rows.Err(); err != nil {
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

// viewReader is projection.Reader over a read-only, repeatable-read transaction: every read
// of one View sees the same committed state.
type viewReader struct {
	ctx context.Context
	tx  pgx.Tx
	st  *statements
}

var _ projection.Reader = viewReader{}

func (v viewReader) Task(id string) (*projection.Task, error) { return readTask(v.ctx, v.tx, v.st, id) }
func (v viewReader) Wake(id string) (*projection.Wake, error) { return readWake(v.ctx, v.tx, v.st, id) }

func (v viewReader) TaskKey(sessionID, key string) (string, error) {
	return readKey(v.ctx, v.tx, v.st.taskKey, sessionID, key)
}

func (v viewReader) WakeKey(sessionID, key string) (string, error) {
	return readKey(v.ctx, v.tx, v.st.wakeKey, sessionID, key)
}

func (v viewReader) ScanDue(maxAt int64, fn func(projection.IndexEntry) bool) error {
	return scanIndex(v.ctx, v.tx, v.st.scanDue, v.st.scanDueFrom, nil, maxAt, 2, fn)
}

func (v viewReader) ScanWakes(maxAt int64, fn func(projection.IndexEntry) bool) error {
	return scanIndex(v.ctx, v.tx, v.st.scanWakes, v.st.scanWakesFrom, nil, maxAt, 3, fn)
}

func (v viewReader) ScanDueKind(kind string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return scanIndex(v.ctx, v.tx, v.st.scanKind, v.st.scanKindFrom, []any{[]byte(kind)}, maxAt, 2, fn)
}

func (v viewReader) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(uint64, string) bool) error {
	return scanSession(v.ctx, v.tx, v.st, sessionID, afterSeq, fn)
}

func (v viewReader) Counts(fn func(string, events.TaskState, int64) bool) error {
	return readCounts(v.ctx, v.tx, v.st, fn)
}

func (v viewReader) LastSeq() (uint64, error) {
	var seq int64
	err := v.tx.QueryRow(v.ctx, v.st.lastSeq).Scan(&seq)
	return uint64(seq), err
}

// readLogPage is how many events ReadLog reads per round trip. It holds no connection or
// transaction while fn runs, so fn may call the queue.
const readLogPage = 512

// readLog calls fn with each event from..to (to 0: the end), decoded, in order. The log is
// gap-free but for the ranges a prune recorded (table pruned): any other missing sequence is
// ErrCorruptRow naming it. The pruned ranges are read at the first gap, and read again once
// at a gap they do not explain (q may be a pool, and a prune may have committed since).
func readLog(ctx context.Context, q querier, st *statements, from, to uint64, fn func(seq uint64, body []byte) error) error {
	if from == 0 {
		from = 1
	}
	if to == 0 {
		to = 1<<63 - 1
	}
	var pruned projection.SeqRanges
	loaded := false
	explained := func(from, to uint64) (bool, error) {
		for range 2 {
			if loaded && gapPruned(pruned, from, to) {
				return true, nil
			}
			var err error
			if pruned, err = prunedRanges(ctx, q, st); err != nil {
				return false, err
			}
			loaded = true
		}
		return gapPruned(pruned, from, to), nil
	}
	for from <= to {
		rows, err := q.Query(ctx, st.readLog, int64(from), int64(to), readLogPage)
		if err != nil {
			return err
		}
		type row struct {
			seq  int64
			body []byte
		}
		var page []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.seq, &r.body); err != nil {
				rows.Close()
				return err
			}
			page = append(page, r)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, r := range page {
			if err := ctx.Err(); err != nil {
				return err
			}
			if uint64(r.seq) != from {
				ok, err := explained(from, uint64(r.seq)-1)
				if err != nil {
					return err
				}
				if !ok {
					// Name the first sequence no pruned range explains.
					for i := range pruned {
						if pruned[i].From <= from && from <= pruned[i].To {
							from = pruned[i].To + 1
						}
					}
					return fmt.Errorf("%w: events: sequence %d missing (next stored: %d)", ErrCorruptRow, from, r.seq)
				}
				from = uint64(r.seq)
			}
			if err := fn(from, r.body); err != nil {
				return err
			}
			from++
		}
		if len(page) < readLogPage {
			return nil
		}
	}
	return nil
}
