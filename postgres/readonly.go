package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Store is read-only access to a PostgreSQL queue, for tools such as replay: the log, a
// consistent view of the projection, and Verify. Its connections run every transaction
// read-only (default_transaction_read_only), so the server refuses any write; it starts no
// writer and no listener, and never creates or changes a table.
type Store struct {
	e *engine
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
	var seq int64
	if err := s.e.pool.QueryRow(ctx, s.e.st.lastSeq).Scan(&seq); err != nil {
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
	return s.e.ReadLog(ctx, from, fn)
}

// ReadRange is ReadLog from from to to, both included (to 0: the end).
func (s *Store) ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	if s.e.isClosed() {
		return errClosed()
	}
	return s.e.readRange(ctx, from, to, fn)
}

// RawLog calls fn with each event's stored bytes (events.Append's encoding), from..to.
func (s *Store) RawLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error {
	var fnErr error
	err := readLog(ctx, s.e.pool, s.e.st, from, to, func(seq uint64, raw []byte) error {
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
	var fnErr error
	err := keyset(tablePages, func(last *logRow, n int) ([]logRow, error) {
		if last != nil {
			from = last.seq + 1
		}
		return queryPage(ctx, s.e.pool, scanLogRow, s.e.st.sessionLog, []byte(session), int64(from), n)
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

// Sessions calls fn with every session that has events, in byte order.
func (s *Store) Sessions(ctx context.Context, fn func(session string) error) error {
	var all []string
	if err := eachRow(ctx, s.e.pool, s.e.st.sessions, func(r pgx.Rows) error {
		var b []byte
		if err := r.Scan(&b); err != nil {
			return err
		}
		all = append(all, string(b))
		return nil
	}); err != nil {
		return backendError(err)
	}
	for _, x := range all {
		if err := fn(x); err != nil {
			return err
		}
	}
	return nil
}

// ScanTasks calls fn with every task record, in id order.
func (s *Store) ScanTasks(ctx context.Context, fn func(*projection.Task) error) error {
	return scanRecords(ctx, s, taskTable, s.e.st.scanTasks, fn)
}

// ScanWakes calls fn with every wake record, in id order.
func (s *Store) ScanWakes(ctx context.Context, fn func(*projection.Wake) error) error {
	return scanRecords(ctx, s, wakeTable, s.e.st.scanWakeRecs, fn)
}

// scanRecords calls fn with every record of tb's table; fn's error is returned as it is.
func scanRecords[R any](ctx context.Context, s *Store, tb *recordTable[R], sql string, fn func(*R) error) error {
	var fnErr error
	err := tb.scanAll(ctx, s.e.pool, sql, func(r *R, err error) error {
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
// log, and a gap or an undecodable event in the log.
func (s *Store) Verify(ctx context.Context) ([]string, error) { return s.e.Verify(ctx) }

// PrunedRanges returns the ranges of sequences pruned from the log (Queue.Prune), in
// order: each is a gap of the log that is explained, not damage (as pebblelog's
// Store.PrunedRanges; the replay tool shows them).
func (s *Store) PrunedRanges(ctx context.Context) (projection.SeqRanges, error) {
	if s.e.isClosed() {
		return nil, errClosed()
	}
	r, err := prunedRanges(ctx, s.e.pool, s.e.st)
	return r, backendError(err)
}
