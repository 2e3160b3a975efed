package projection

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/worklog/worklog/events"
)

// numStates is the number of task states, the length of a kind's counts.
const numStates = int(events.StateCanceled) + 1

// kindIndex is what Mem keeps for one kind: the number of its tasks in each state (Counts).
type kindIndex struct {
	name   string
	counts [numStates]int64
}

// sessionTask is one entry of a session's task list: tasks in submission order.
type sessionTask struct {
	seq uint64
	id  string
}

// sessionList is a session's tasks, in submission order. Apply adds tasks in sequence
// order, so the list only grows at its end.
type sessionList struct {
	session string
	tasks   []sessionTask
}

// kind returns the counts of kind k, made on first use. The last kind used is kept aside: a
// fold sees runs of events of one kind, and each move touches the same kind twice, so most
// lookups skip the map.
func (m *Mem) kind(k string) *kindIndex {
	if ki := m.lastKind; ki != nil && ki.name == k {
		return ki
	}
	ki := m.kinds[k]
	if ki == nil {
		ki = &kindIndex{name: k}
		m.kinds[k] = ki
	}
	m.lastKind = ki
	return ki
}

// ScanSessionTasks finds afterSeq in the session's list by binary search and walks on from
// there: its cost is that of the entries fn sees, plus a logarithm of the session's tasks.
func (m *Mem) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(uint64, string) bool) error {
	m.BuildIndexes()
	l := m.sessions[sessionID]
	if l == nil {
		return nil
	}
	i := sort.Search(len(l.tasks), func(i int) bool { return l.tasks[i].seq > afterSeq })
	for _, st := range l.tasks[i:] {
		if !fn(st.seq, st.id) {
			break
		}
	}
	return nil
}

// Counts calls fn for each (kind, state) with tasks, in kind order, then state order.
func (m *Mem) Counts(fn func(string, events.TaskState, int64) bool) error {
	m.BuildIndexes()
	names := make([]string, 0, len(m.kinds))
	for k := range m.kinds {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for st, n := range m.kinds[k].counts {
			if n != 0 && !fn(k, events.TaskState(st), n) {
				return nil
			}
		}
	}
	return nil
}

// The writes below do nothing while the indexes are deferred: BuildIndexes derives them.

func (m *Mem) PutSessionTask(sessionID string, submitSeq uint64, taskID string) error {
	if m.deferred {
		return nil
	}
	l := m.lastSession
	if l == nil || l.session != sessionID {
		if l = m.sessions[sessionID]; l == nil {
			l = &sessionList{session: sessionID}
			m.sessions[sessionID] = l
		}
		m.lastSession = l
	}
	st := sessionTask{seq: submitSeq, id: taskID}
	if n := len(l.tasks); n == 0 || l.tasks[n-1].seq < submitSeq {
		l.tasks = append(l.tasks, st)
		return nil
	}
	// Not after the last: never from Apply, which submits in sequence order; kept sorted
	// for any other caller.
	i, found := slices.BinarySearchFunc(l.tasks, submitSeq, func(x sessionTask, seq uint64) int {
		switch {
		case x.seq < seq:
			return -1
		case x.seq > seq:
			return 1
		}
		return 0
	})
	if found {
		l.tasks[i] = st
	} else {
		l.tasks = slices.Insert(l.tasks, i, st)
	}
	return nil
}

func (m *Mem) AddCount(kind string, state events.TaskState, delta int64) error {
	if int(state) >= numStates {
		return fmt.Errorf("projection: count of kind %q in unknown state %d", kind, state)
	}
	if !m.deferred {
		m.kind(kind).counts[state] += delta
	}
	return nil
}

// buildKindsSessions rebuilds the counts and the session lists from the records
// (BuildIndexes).
func (m *Mem) buildKindsSessions() {
	m.kinds, m.lastKind = map[string]*kindIndex{}, nil
	m.sessions, m.lastSession = map[string]*sessionList{}, nil
	for _, t := range m.tasks {
		m.kind(t.Kind).counts[t.State]++
		l := m.sessions[t.SessionID]
		if l == nil {
			l = &sessionList{session: t.SessionID}
			m.sessions[t.SessionID] = l
		}
		l.tasks = append(l.tasks, sessionTask{seq: t.SubmitSeq, id: t.ID})
	}
	for _, l := range m.sessions {
		slices.SortFunc(l.tasks, func(a, b sessionTask) int { return cmp.Compare(a.seq, b.seq) })
	}
}

// diffKindsSessions is Diff for the counts and the session lists. A kind with no task equals
// a kind the other state never saw.
func (m *Mem) diffKindsSessions(o *Mem) []string {
	var out []string
	empty := &kindIndex{}
	for _, k := range unionKeys(m.kinds, o.kinds) {
		a, b := m.kinds[k], o.kinds[k]
		if a == nil {
			a = empty
		}
		if b == nil {
			b = empty
		}
		for st := range numStates {
			if a.counts[st] != b.counts[st] {
				out = append(out, fmt.Sprintf("count of kind %q %s: %d vs %d", k, events.TaskState(st), a.counts[st], b.counts[st]))
			}
		}
	}
	for _, s := range unionKeys(m.sessions, o.sessions) {
		var a, b []sessionTask
		if l := m.sessions[s]; l != nil {
			a = l.tasks
		}
		if l := o.sessions[s]; l != nil {
			b = l.tasks
		}
		out = append(out, diffSessionList(s, a, b)...)
	}
	return out
}

func unionKeys[V any](a, b map[string]V) []string {
	ks := make([]string, 0, len(a)+len(b))
	for k := range a {
		ks = append(ks, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// diffSessionList merges two lists ordered by seq and names each entry one lacks or both
// hold differently.
func diffSessionList(session string, a, b []sessionTask) []string {
	var out []string
	name := fmt.Sprintf("task list of session %q", session)
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || i < len(a) && a[i].seq < b[j].seq:
			out = append(out, fmt.Sprintf("%s (%d, %s): missing on the right", name, a[i].seq, a[i].id))
			i++
		case i == len(a) || b[j].seq < a[i].seq:
			out = append(out, fmt.Sprintf("%s (%d, %s): missing on the left", name, b[j].seq, b[j].id))
			j++
		default:
			if a[i].id != b[j].id {
				out = append(out, fmt.Sprintf("%s seq %d: %s vs %s", name, a[i].seq, a[i].id, b[j].id))
			}
			i, j = i+1, j+1
		}
	}
	return out
}
