package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Verify folds the events table from empty (projection.Apply into a projection.Mem) and
// compares the result with every stored table (the records streamed, the rest loaded into
// another Mem),
// in one read-only repeatable-read transaction: records field by field, keys, the due,
// per-kind due, wake and per-session wake indexes, the session lists, the counts, the retention index and the
// log head. It also checks that every event decodes and that the log has no gap but the
// ranges a prune recorded (table pruned), which hold no event and end at the log head at the
// latest: after a prune the state is the fold of the retained events, continued across each
// pruned gap (a subject is pruned whole, so no retained event needs a pruned one). Neither
// state is held in memory: the fold and the stored tables' entries go to a scratch Pebble
// store in a temporary directory, compared in key order, and the stored records are
// compared as they are read, page by page, with the fold's in id order (verify_spill.go).
func (e *engine) Verify(ctx context.Context) ([]string, error) { return e.verify(ctx, nil) }

// verify is Verify calling progress, when not nil, after each page of the log it folds.
func (e *engine) verify(ctx context.Context, progress func(seq, last uint64)) ([]string, error) {
	if e.isClosed() {
		return nil, errClosed()
	}
	tx, conn, err := e.beginRead(ctx) // on another connection if the pool's was dead
	if err != nil {
		return nil, backendError(err)
	}
	defer conn.Release()
	defer tx.Rollback(context.Background())
	p, err := verify(ctx, tx, e.st, progress)
	if err == nil {
		var rejects []string
		rejects, err = e.inboxProblems(ctx, tx)
		p = append(p, rejects...)
	}
	return p, backendError(err)
}

func verify(ctx context.Context, tx pgx.Tx, st *statements, progress func(seq, last uint64)) ([]string, error) {
	var problems []string
	var head int64
	if err := tx.QueryRow(ctx, st.lastSeq).Scan(&head); err != nil {
		return nil, err
	}
	db, err := openSpill(head)
	if err != nil {
		return nil, err
	}
	defer db.close()
	fold, stored := newSpillState(db, sideFold), newSpillState(db, sideStored)
	pruned, err := prunedRanges(ctx, tx, st)
	if isCorrupt(err) {
		return []string{err.Error()}, nil
	} else if err != nil {
		return nil, err
	}
	var d events.Decoder
	var stop error
	folded := 0
	err = readLog(ctx, onTx{tx}, st, 1, 0, func(seq uint64, body []byte) error {
		if folded++; progress != nil && folded%readLogPage == 0 {
			progress(seq, uint64(head))
		}
		ev, err := d.Decode(body, seq)
		if err != nil {
			stop = fmt.Errorf("events row %d: %v", seq, err)
			return stop
		}
		if pruned.Contains(seq) {
			stop = fmt.Errorf("events row %d: in a pruned range, yet stored", seq)
			return stop
		}
		if last, _ := fold.LastSeq(); seq > last+1 {
			fold.SetLastSeq(seq - 1) // a pruned gap (readLog checked it)
		}
		if err := projection.Apply(fold, ev); err != nil {
			stop = err
			return stop
		}
		return nil
	})
	switch {
	case err != nil && err == stop:
		return []string{err.Error()}, nil
	case err != nil && isCorrupt(err):
		return []string{err.Error()}, nil // a gap in the log
	case err != nil:
		return nil, err
	}

	if progress != nil {
		last, _ := fold.LastSeq()
		progress(last, uint64(head))
	}
	stored.SetLastSeq(uint64(head))
	if n := len(pruned); n > 0 {
		last, _ := fold.LastSeq()
		switch r := pruned[n-1]; {
		case r.To > uint64(head):
			problems = append(problems, fmt.Sprintf("pruned range [%d, %d] ends after the log head %d", r.From, r.To, head))
		case r.To > last && gapPruned(pruned, last+1, r.To):
			fold.SetLastSeq(r.To) // the log's pruned tail
		}
	}
	if err := loadIndexes(ctx, tx, st, stored, fold); err != nil {
		return nil, err
	}
	if err := loadSchedules(ctx, tx, st, stored); err != nil {
		return nil, err
	}
	if err := loadKindPolicies(ctx, tx, st, stored); err != nil {
		return nil, err
	}
	// The stored records are compared as they are read, page by page in id order, with the
	// fold's, read in id order from the scratch store. A row that does not decode is a
	// problem, listed before the differences (as the fold's records then lack nothing for it).
	var undecoded []string
	diff, err := diffSpill(stored, fold, func(fn func(*projection.Task) error) error {
		return taskTable.scanAll(ctx, onTx{tx}, st.scanTasks, storedRecord(fn, &undecoded))
	}, func(fn func(*projection.Wake) error) error {
		return wakeTable.scanAll(ctx, onTx{tx}, st.scanWakeRecs, storedRecord(fn, &undecoded))
	})
	if err != nil {
		return nil, err
	}
	// Diff says "stored vs rebuilt".
	return append(append(problems, undecoded...), diff...), nil
}

// storedRecord is a scanAll callback that hands fn each stored record, and lists a row that
// does not decode in problems.
func storedRecord[R any](fn func(*R) error, problems *[]string) func(*R, error) error {
	return func(r *R, err error) error {
		if err != nil {
			*problems = append(*problems, err.Error())
			return nil
		}
		return fn(r)
	}
}

func eachRow(ctx context.Context, q querier, sql string, fn func(pgx.Rows) error) error {
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// verifyState is what Verify loads a stored state into: a side of its scratch store.
type verifyState interface {
	projection.State
	projection.PruneIndexer
}

// verifyFold is what Verify reads of its fold while it loads the stored indexes: the entries
// a schema that predates an index implies come from the fold's wakes and running tasks.
type verifyFold interface {
	Wake(id string) (*projection.Wake, error)
	eachTask(fn func(*projection.Task) error) error
}

func loadIndexes(ctx context.Context, q querier, st *statements, m verifyState, fold verifyFold) error {
	keys := func(sql string, put func(s, k, id string) error) error {
		return eachRow(ctx, q, sql, func(r pgx.Rows) error {
			var s, k, id []byte
			if err := r.Scan(&s, &k, &id); err != nil {
				return err
			}
			return put(string(s), string(k), string(id))
		})
	}
	if err := eachRow(ctx, q, st.allSession, func(r pgx.Rows) error {
		var session, id []byte
		var seq int64
		if err := r.Scan(&session, &seq, &id); err != nil {
			return err
		}
		return m.PutSessionTask(string(session), uint64(seq), string(id))
	}); err != nil {
		return err
	}
	var cerr error
	if err := readCounts(ctx, q, st, func(k string, s events.TaskState, n int64) bool {
		cerr = m.AddCount(k, s, n)
		return cerr == nil
	}); err != nil || cerr != nil {
		return errors.Join(err, cerr)
	}
	taskKeys := st.allTaskKeys
	var decided bool // the inbox holds decided submissions, whose keys are stored before their events
	if err := q.QueryRow(ctx, st.inboxDecided, st.inboxTable).Scan(&decided); err != nil {
		return err
	}
	if decided {
		taskKeys = st.allLoggedTaskKeys
	}
	if err := keys(taskKeys, m.PutTaskKey); err != nil {
		return err
	}
	if err := keys(st.allWakeKeys, m.PutWakeKey); err != nil {
		return err
	}
	// This store keeps the retention index, even an empty one: a deletion of no entry tells
	// the Mem so (projection.Mem compares the index only between Mems that keep one).
	if err := m.DeletePrunable(projection.PruneEntry{}); err != nil {
		return err
	}
	if err := eachRow(ctx, q, st.allPrunable, func(r pgx.Rows) error {
		e, err := scanPruneRow(r)
		if err != nil {
			return err
		}
		return m.PutPrunable(e)
	}); err != nil {
		return err
	}
	return loadEntries(ctx, q, st, m, fold)
}

func isCorrupt(err error) bool { return errors.Is(err, ErrCorruptRow) }
