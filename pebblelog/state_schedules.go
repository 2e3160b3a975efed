package pebblelog

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// Format 8's keyspaces (keys.go): the schedules of the sessions and their index by next
// tick. The fold keeps both (projection.ScheduleWriter); a claim's decide code reads the
// index's first entry (ScanScheduleDue) and, when it is due, the record.
//
//	h<uvarint len><session><name>: the schedule record (JSON of projection.Schedule)
//	H<at 8B ordered><uvarint len><session><name>: empty (the schedule's next tick)
//
// Schedules are few and change rarely (a set, a remove, one tick), so the record is JSON and
// every record read goes through the batch; the writer keeps only the index's earliest tick
// (decide_cache.go), so a claim with no tick due reads nothing.

func scheduleKey(session, name string) []byte { return scopedKey(prefixSchedule, session, name) }

func scheduleDueKey(e projection.ScheduleEntry) []byte {
	k := make([]byte, 0, 9+binary.MaxVarintLen64+len(e.SessionID)+len(e.Name))
	k = append(k, prefixScheduleDue)
	k = binary.BigEndian.AppendUint64(k, orderedTime(e.At))
	k = binary.AppendUvarint(k, uint64(len(e.SessionID)))
	k = append(k, e.SessionID...)
	return append(k, e.Name...)
}

func parseScheduleDueKey(k []byte) (projection.ScheduleEntry, bool) {
	if len(k) < 10 || k[0] != prefixScheduleDue {
		return projection.ScheduleEntry{}, false
	}
	at := int64(binary.BigEndian.Uint64(k[1:9]) ^ (1 << 63))
	n, w := binary.Uvarint(k[9:])
	if w <= 0 || uint64(len(k)-9-w) < n {
		return projection.ScheduleEntry{}, false
	}
	rest := k[9+w:]
	return projection.ScheduleEntry{At: at, SessionID: string(rest[:n]), Name: string(rest[n:])}, true
}

func decodeSchedule(v []byte) (*projection.Schedule, error) {
	var sc projection.Schedule
	if err := json.Unmarshal(v, &sc); err != nil {
		return nil, fmt.Errorf("%w: schedule record: %v", ErrCorruptRecord, err)
	}
	return &sc, nil
}

func (s reader) Schedule(session, name string) (*projection.Schedule, error) {
	v, ok, err := s.get(scheduleKey(session, name))
	if err != nil || !ok {
		return nil, err
	}
	return decodeSchedule(v)
}

func (s reader) ScanSessionSchedules(session string, fn func(*projection.Schedule) bool) (err error) {
	lower := scheduleKey(session, "")
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		sc, err := decodeSchedule(v)
		if err != nil {
			return err
		}
		if !fn(sc) {
			return nil
		}
	}
	return nil
}

func (s reader) ScanScheduleDue(maxAt int64, fn func(projection.ScheduleEntry) bool) (err error) {
	upper := binary.BigEndian.AppendUint64([]byte{prefixScheduleDue}, orderedTime(maxAt))
	upper = binary.BigEndian.AppendUint64(upper, 1<<64-1) // past every key at maxAt
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixScheduleDue}, UpperBound: upper})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		e, good := parseScheduleDueKey(it.Key())
		if !good {
			return fmt.Errorf("%w: schedule index key %q", ErrCorruptRecord, it.Key())
		}
		if e.At > maxAt {
			return nil
		}
		if !fn(e) {
			return nil
		}
	}
	return nil
}

func (w *writer) PutSchedule(sc *projection.Schedule) error {
	v, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	return w.b.Set(scheduleKey(sc.SessionID, sc.Name), v, nil)
}

// The writer's PutScheduleDue, DeleteScheduleDue and ScanScheduleDue are in decide_cache.go
// (it keeps the committed index's earliest tick).
