package pebblelog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// Read-only helpers for tools (cmd/replay): walks over the stored projection and the raw log
// that the store's own API does not need. None of them writes.

// ScanTasks calls fn with every stored task record, in id order, until fn returns an error.
// A record that does not decode stops the walk with an ErrCorruptRecord error naming its key.
// Each task comes with its input, read from the log where the record does not hold it
// (format 2: input.go).
func (s *Store) ScanTasks(ctx context.Context, fn func(*projection.Task) error) error {
	return scanRecords(s, ctx, prefixTask, decodeTask, func(t *projection.Task) error {
		if err := fillTask(reader{s.db, s.blobs}, t); err != nil {
			return err
		}
		return fn(t)
	})
}

// ScanWakes is ScanTasks for wake records, each with its payload or completion output.
func (s *Store) ScanWakes(ctx context.Context, fn func(*projection.Wake) error) error {
	return scanRecords(s, ctx, prefixWake, decodeWake, func(x *projection.Wake) error {
		if err := fillWake(reader{s.db, s.blobs}, x); err != nil {
			return err
		}
		return fn(x)
	})
}

func scanRecords[T any](s *Store, ctx context.Context, prefix byte, decode func(k, v []byte) (*T, error), fn func(*T) error) error {
	return s.walk(ctx, []byte{prefix}, []byte{prefix + 1}, func(k []byte, it *pebble.Iterator) error {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		rec, err := decode(k, v)
		if err != nil {
			return err
		}
		return fn(rec)
	})
}

// RawLog calls fn with the wire bytes of every event with from <= seq <= to (to 0 means
// the end of the log), in order, without decoding them (an event whose values are in blobs,
// format 4, is decoded and encoded again with them: the same bytes). raw is only valid during
// the call. A key of the wrong length stops the walk with an error.
func (s *Store) RawLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error {
	return s.storedLog(ctx, from, to, func(seq uint64, v []byte) error {
		raw, err := s.blobs.wireBytes(v, seq)
		if err != nil {
			return err
		}
		return fn(seq, raw)
	})
}

// storedLog is RawLog's walk over the values as stored: an event's blob form as it is.
func (s *Store) storedLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error {
	upper := []byte{prefixEvent + 1}
	if to != 0 && to != 1<<64-1 {
		upper = eventKey(to + 1)
	}
	return s.walk(ctx, eventKey(from), upper, func(k []byte, it *pebble.Iterator) error {
		if len(k) != 9 {
			return fmt.Errorf("pebblelog: event key %q has the wrong length", k)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		return fn(binary.BigEndian.Uint64(k[1:]), v)
	})
}

// RawEvent returns a copy of the wire bytes of the event at seq, and whether there is one.
func (s *Store) RawEvent(ctx context.Context, seq uint64) (_ []byte, _ bool, err error) {
	if err := s.enterCtx(ctx); err != nil {
		return nil, false, err
	}
	defer s.leave(&err)
	v, ok, err := reader{s.db, s.blobs}.get(eventKey(seq))
	if err != nil || !ok {
		return v, ok, err
	}
	v, err = s.blobs.wireBytes(v, seq)
	return v, err == nil, err
}

// Sessions calls fn with the id of every session that has events, in byte order of the
// per-session index, until fn returns an error. It seeks past each session's entries, so it
// costs one seek per session, not one step per event.
func (s *Store) Sessions(ctx context.Context, fn func(session string) error) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave(&err)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixSession}, UpperBound: []byte{prefixSession + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; {
		if err := ctx.Err(); err != nil {
			return err
		}
		session, _, good := splitScoped(it.Key())
		if !good {
			return fmt.Errorf("%w: session index key %q", ErrCorruptRecord, it.Key())
		}
		if err := fn(session); err != nil {
			return err
		}
		end := prefixEnd(sessionPrefix(session))
		if end == nil {
			break
		}
		ok = it.SeekGE(end)
	}
	return it.Error()
}
