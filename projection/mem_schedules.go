package projection

import (
	"fmt"
	"slices"

	"github.com/google/btree"
)

// The schedules of a Mem: the records by (session, name) and the index by next tick. Few and
// small, so they are kept up to date even while the other indexes are deferred.

func (m *Mem) schedRecords() map[sessionKey]*Schedule {
	if m.schedules == nil {
		m.schedules = map[sessionKey]*Schedule{}
	}
	return m.schedules
}

func (m *Mem) schedIndex() *btree.BTreeG[ScheduleEntry] {
	if m.schedDue == nil {
		m.schedDue = btree.NewG(8, ScheduleEntry.Less)
	}
	return m.schedDue
}

// Schedule returns a copy of the record (its template's input and headers are shared: the
// fold never changes them in place).
func (m *Mem) Schedule(sessionID, name string) (*Schedule, error) {
	sc := m.schedules[sessionKey{sessionID, name}]
	if sc == nil {
		return nil, nil
	}
	c := *sc
	return &c, nil
}

func (m *Mem) ScanSessionSchedules(sessionID string, fn func(*Schedule) bool) error {
	var names []string
	for k := range m.schedules {
		if k.session == sessionID {
			names = append(names, k.key)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		c := *m.schedules[sessionKey{sessionID, n}]
		if !fn(&c) {
			break
		}
	}
	return nil
}

func (m *Mem) ScanScheduleDue(maxAt int64, fn func(ScheduleEntry) bool) error {
	m.schedIndex().Ascend(func(e ScheduleEntry) bool { return e.At <= maxAt && fn(e) })
	return nil
}

func (m *Mem) PutSchedule(sc *Schedule) error {
	m.schedRecords()[sessionKey{sc.SessionID, sc.Name}] = sc
	return nil
}

func (m *Mem) PutScheduleDue(e ScheduleEntry) error {
	m.schedIndex().ReplaceOrInsert(e)
	return nil
}

func (m *Mem) DeleteScheduleDue(e ScheduleEntry) error {
	m.schedIndex().Delete(e)
	return nil
}

// diffSchedules is Diff for the schedules: the records and the index.
func (m *Mem) diffSchedules(o *Mem) []string {
	var out []string
	keys := map[sessionKey]bool{}
	for k := range m.schedules {
		keys[k] = true
	}
	for k := range o.schedules {
		keys[k] = true
	}
	sorted := slices.SortedFunc(func(yield func(sessionKey) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	}, func(a, b sessionKey) int {
		if a.session != b.session {
			if a.session < b.session {
				return -1
			}
			return 1
		}
		if a.key < b.key {
			return -1
		}
		if a.key > b.key {
			return 1
		}
		return 0
	})
	for _, k := range sorted {
		name := fmt.Sprintf("schedule %q of session %q", k.key, k.session)
		x, y := m.schedules[k], o.schedules[k]
		switch {
		case x == nil:
			out = append(out, name+": missing on the left")
		case y == nil:
			out = append(out, name+": missing on the right")
		default:
			out = append(out, DiffRecords(name, x, y)...)
		}
	}
	var a, b []ScheduleEntry
	m.schedIndex().Ascend(func(e ScheduleEntry) bool { a = append(a, e); return true })
	o.schedIndex().Ascend(func(e ScheduleEntry) bool { b = append(b, e); return true })
	if !slices.Equal(a, b) {
		out = append(out, fmt.Sprintf("schedule index: %v vs %v", a, b))
	}
	return out
}
