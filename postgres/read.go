package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// querier is what the reads need: a connection (the writer's) or a transaction (a view's).
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readKey(ctx context.Context, q querier, sql, session, key string) (string, error) {
	var id []byte
	err := q.QueryRow(ctx, sql, []byte(session), []byte(key)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return string(id), err
}

// sessionRow is an entry of a session's task list.
type sessionRow struct {
	seq uint64
	id  string
}

func scanSession(ctx context.Context, q querier, st *statements, session string, after uint64, fn func(uint64, string) bool) error {
	scan := func(rows pgx.Rows) (sessionRow, error) {
		var seq int64
		var id []byte
		err := rows.Scan(&seq, &id)
		return sessionRow{uint64(seq), string(id)}, err
	}
	return keyset(indexPages, func(last *sessionRow, n int) ([]sessionRow, error) {
		if last != nil {
			after = last.seq
		}
		return queryPage(ctx, q, scan, st.scanSession, []byte(session), int64(after), n)
	}, func(e sessionRow) (bool, error) { return fn(e.seq, e.id), nil })
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

// viewReader is projection.Reader over a read-only, repeatable-read transaction: every read
// of one View sees the same committed state.
type viewReader struct {
	ctx context.Context
	tx  querier // the connection, inside its transaction
	st  *statements
}

var _ projection.Reader = viewReader{}

func (v viewReader) Task(id string) (*projection.Task, error) {
	return taskTable.read(v.ctx, v.tx, v.st.task, id)
}

func (v viewReader) Wake(id string) (*projection.Wake, error) {
	return wakeTable.read(v.ctx, v.tx, v.st.wake, id)
}

func (v viewReader) TaskKey(sessionID, key string) (string, error) {
	return readKey(v.ctx, v.tx, v.st.taskKey, sessionID, key)
}

func (v viewReader) WakeKey(sessionID, key string) (string, error) {
	return readKey(v.ctx, v.tx, v.st.wakeKey, sessionID, key)
}

// scanByPriority is a due index's scan in claim order: the runs of each priority present,
// from the highest (next finds the greatest priority below its argument: an index-served
// query), each read by scan in (at, seq) order up to maxAt, with Pri set on its entries.
// Cost: two queries per priority present (the next priority, its run) plus the entries fn
// sees, so a future high-priority task never hides due lower ones and no future entry is read.
func scanByPriority(next func(below int64) ([]int64, error), scan func(pri int64, fn func(projection.IndexEntry) bool) error,
	fn func(projection.IndexEntry) bool,
) error {
	below := int64(math.MaxInt64)
	for {
		p, err := next(below)
		if err != nil || len(p) == 0 {
			return err
		}
		stopped := false
		err = scan(p[0], func(e projection.IndexEntry) bool {
			e.Pri = p[0]
			stopped = !fn(e)
			return !stopped
		})
		if err != nil || stopped || p[0] == math.MinInt64 {
			return err
		}
		below = p[0]
	}
}

// scanInt reads a row of one bigint.
func scanInt(rows pgx.Rows) (int64, error) {
	var v int64
	err := rows.Scan(&v)
	return v, err
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
// at a gap they do not explain (r may be the pool, and a prune may have committed since).
func readLog(ctx context.Context, r reads, st *statements, from, to uint64, fn func(seq uint64, body []byte) error) error {
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
			if pruned, err = readValue(ctx, r, func(q querier) (projection.SeqRanges, error) {
				return prunedRanges(ctx, q, st)
			}); err != nil {
				return false, err
			}
			loaded = true
		}
		return gapPruned(pruned, from, to), nil
	}
	return keyset(tablePages, func(_ *logRow, n int) ([]logRow, error) {
		if from > to {
			return nil, nil
		}
		return readValue(ctx, r, func(q querier) ([]logRow, error) {
			return queryPage(ctx, q, scanLogRow, st.readLog, int64(from), int64(to), n)
		})
	}, func(r logRow) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if r.seq != from {
			ok, err := explained(from, r.seq-1)
			if err != nil {
				return false, err
			}
			if !ok {
				// Name the first sequence no pruned range explains.
				for i := range pruned {
					if pruned[i].From <= from && from <= pruned[i].To {
						from = pruned[i].To + 1
					}
				}
				return false, fmt.Errorf("%w: events: sequence %d missing (next stored: %d)", ErrCorruptRow, from, r.seq)
			}
			from = r.seq
		}
		if err := fn(from, r.body); err != nil {
			return false, err
		}
		from++
		return true, nil
	})
}

// logRow is an event as stored.
type logRow struct {
	seq  uint64
	body []byte
}

func scanLogRow(rows pgx.Rows) (logRow, error) {
	var seq int64
	var body []byte
	err := rows.Scan(&seq, &body)
	return logRow{uint64(seq), body}, err
}
