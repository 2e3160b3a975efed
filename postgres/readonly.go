package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/projection"
)

// Store is read-only access to a PostgreSQL queue, for tools such as replay: the log, a
// consistent view of the projection, and Verify. Its connections run every transaction
// read-only (default_transaction_read_only), so the server refuses any write; it starts no
// writer and no listener, and never creates or changes a table.
//
// It is the PostgreSQL side of the read-only source the replay tool reads (as pebblelog's
// Store is the Pebble side): every method takes the caller's context first and refuses one
// that is already done. The queue's processes may go on writing meanwhile; each call reads
// what was committed when it began, and View and Verify read one repeatable-read snapshot.
type Store struct {
	e *engine
}

var _ source.Source = (*Store)(nil)

// VerifyOptions are Store.Verify's options: the same type as pebblelog.VerifyOptions.
type VerifyOptions = projection.VerifyOptions

// begin refuses a call on a closed store or with a done context.
func (s *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.e.isClosed() {
		return errClosed()
	}
	return nil
}

// OpenReadOnly opens the queue in the schema Open would use for dsn (worklog, or the one its
// search_path chooses), read-only. A schema without worklog's tables is ErrNotAQueue; a newer
// format ErrFormatTooNew (both name the schema).
func OpenReadOnly(ctx context.Context, dsn string) (*Store, error) {
	e, err := open(ctx, dsn, (&Options{MaxConns: 4}).withDefaults(), true)
	if err != nil {
		return nil, err
	}
	close(e.writerDone)
	close(e.watcherDone)
	return &Store{e: e}, nil
}

// Schema is the schema the queue's tables are in.
func (s *Store) Schema() string { return s.e.schema }

// Close closes the connections.
func (s *Store) Close() error { return s.e.Close() }

// LastSeq is the sequence of the last committed event (the log head).
func (s *Store) LastSeq(ctx context.Context) (uint64, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	var seq int64
	if err := queryRow(ctx, s.e, s.e.st.lastSeq, nil, &seq); err != nil {
		return 0, backendError(err)
	}
	return uint64(seq), nil
}

// View runs fn against one consistent committed state (a repeatable-read transaction).
func (s *Store) View(ctx context.Context, fn func(projection.Reader) error) error {
	return s.e.View(ctx, fn)
}

// ReadLog calls fn with each event from seq from (0: the first) to the end, in order.
func (s *Store) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return s.ReadRange(ctx, from, 0, fn)
}

// ReadRange is ReadLog from from to to, both included (to 0: the end).
func (s *Store) ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.e.readRange(ctx, from, to, fn)
}

// FoldRange is ReadRange: each event is decoded on its own, so fn may keep it.
func (s *Store) FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return s.ReadRange(ctx, from, to, fn)
}

// RawEvent returns the stored bytes of the event at seq, and false when there is none
// (seq 0, past the log head, or pruned).
func (s *Store) RawEvent(ctx context.Context, seq uint64) ([]byte, bool, error) {
	if seq == 0 {
		return nil, false, s.begin(ctx)
	}
	last, err := s.LastSeq(ctx)
	if err != nil || seq > last {
		return nil, false, err
	}
	var raw []byte
	err = s.RawLog(ctx, seq, seq, func(_ uint64, b []byte) error { raw = b; return nil })
	if err != nil {
		return nil, false, err
	}
	return raw, raw != nil, nil
}

// Event reads the event at seq; a missing one is an error matching events.ErrCorrupt.
func (s *Store) Event(ctx context.Context, seq uint64) (events.Event, error) {
	raw, ok, err := s.RawEvent(ctx, seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w at seq %d: the event is missing", events.ErrCorrupt, seq)
	}
	return events.Decode(raw, seq)
}

// RawLog calls fn with each event's stored bytes (events.Append's encoding), from..to.
func (s *Store) RawLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	var fnErr error
	err := readLog(ctx, s.e, s.e.st, from, to, func(seq uint64, raw []byte) error {
		fnErr = fn(seq, raw)
		return fnErr
	})
	if err != nil && err == fnErr {
		return err
	}
	return backendError(err)
}

// SessionLog calls fn with the events of one session from seq from, in order (the events
// table's session index: no scan of other sessions' events).
func (s *Store) SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	var fnErr error
	err := keyset(tablePages, func(last *logRow, n int) ([]logRow, error) {
		if last != nil {
			from = last.seq + 1
		}
		return readValue(ctx, s.e, func(q querier) ([]logRow, error) {
			return queryPage(ctx, q, scanLogRow, s.e.st.sessionLog, []byte(session), int64(from), n)
		})
	}, func(x logRow) (bool, error) {
		ev, err := events.Decode(x.body, x.seq)
		if err != nil {
			return false, errors.Join(ErrCorruptRow, err)
		}
		fnErr = fn(ev)
		return true, fnErr
	})
	if err != nil && err == fnErr {
		return err
	}
	return backendError(err)
}

// SessionSeqs calls fn with the sequence of each event of one session from seq from, in
// order.
func (s *Store) SessionSeqs(ctx context.Context, session string, from uint64, fn func(seq uint64) error) error {
	return s.SessionLog(ctx, session, from, func(ev events.Event) error { return fn(ev.Head().Seq) })
}

// Sessions calls fn with every session that has events, in source.SessionOrder (that of
// Pebble's per-session index), so that every listing of sessions is the same on both
// backends.
func (s *Store) Sessions(ctx context.Context, fn func(session string) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	var all []string
	if err := s.e.run(ctx, func(q querier) error {
		all = all[:0] // a read on a dead connection runs again
		return eachRow(ctx, q, s.e.st.sessions, func(r pgx.Rows) error {
			var b []byte
			if err := r.Scan(&b); err != nil {
				return err
			}
			all = append(all, string(b))
			return nil
		})
	}); err != nil {
		return backendError(err)
	}
	slices.SortFunc(all, source.SessionOrder)
	for _, x := range all {
		if err := fn(x); err != nil {
			return err
		}
	}
	return nil
}

// ScanTasks calls fn with every task record, in id order.
func (s *Store) ScanTasks(ctx context.Context, fn func(*projection.Task) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return scanRecords(ctx, s, taskTable, s.e.st.scanTasks, fn)
}

// ScanWakes calls fn with every wake record, in id order.
func (s *Store) ScanWakes(ctx context.Context, fn func(*projection.Wake) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return scanRecords(ctx, s, wakeTable, s.e.st.scanWakeRecs, fn)
}

// scanRecords calls fn with every record of tb's table; fn's error is returned as it is.
func scanRecords[R any](ctx context.Context, s *Store, tb *recordTable[R], sql string, fn func(*R) error) error {
	var fnErr error
	err := tb.scanAll(ctx, s.e, sql, func(r *R, err error) error {
		if err != nil {
			return err
		}
		fnErr = fn(r)
		return fnErr
	})
	if err != nil && err == fnErr {
		return err
	}
	return backendError(err)
}

// Verify is Queue.Verify: every difference between the stored tables and the fold of the
// log, and a gap or an undecodable event in the log. vo.Progress, when set, is called after
// each page of the log folded.
func (s *Store) Verify(ctx context.Context, vo VerifyOptions) ([]string, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	return s.e.verify(ctx, vo.Progress)
}

// PrunedRanges returns the ranges of sequences pruned from the log (Queue.Prune), in
// order: each is a gap of the log that is explained, not damage (as pebblelog's
// Store.PrunedRanges; the replay tool shows them).
func (s *Store) PrunedRanges(ctx context.Context) (projection.SeqRanges, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	r, err := readValue(ctx, s.e, func(q querier) (projection.SeqRanges, error) { return prunedRanges(ctx, q, s.e.st) })
	return r, backendError(err)
}
