package projection

import (
	"fmt"

	"github.com/google/btree"
)

// The per-session available-wake index: the available-wake index's entries again, under
// each wake's session, so that a claim of the wakes of chosen sessions (work's
// ClaimSessionWakes) reads only those sessions' entries. Apply moves an entry in both
// indexes at once (moveWakeIndex).

// ScanSessionWakes is ScanWakes over the session's own index: its cost does not depend on
// the wakes of other sessions.
func (m *Mem) ScanSessionWakes(sessionID string, maxAt int64, fn func(IndexEntry) bool) error {
	m.BuildIndexes()
	t := m.sessionWakes[sessionID]
	if t == nil {
		return nil
	}
	t.Ascend(func(e IndexEntry) bool { return e.At <= maxAt && fn(e) })
	return nil
}

// The writes do nothing while the indexes are deferred: BuildIndexes derives them. A
// session's tree is dropped once empty, so the map holds only sessions with available wakes.

func (m *Mem) PutSessionWake(sessionID string, e IndexEntry) error {
	if m.deferred {
		return nil
	}
	t := m.sessionWakes[sessionID]
	if t == nil {
		t = newIndex()
		m.sessionWakes[sessionID] = t
	}
	t.ReplaceOrInsert(e)
	return nil
}

func (m *Mem) DeleteSessionWake(sessionID string, e IndexEntry) error {
	if m.deferred {
		return nil
	}
	if t := m.sessionWakes[sessionID]; t != nil {
		t.Delete(e)
		if t.Len() == 0 {
			delete(m.sessionWakes, sessionID)
		}
	}
	return nil
}

// buildSessionWakes rebuilds the index from avail, the available-wake index's entries in
// any order (BuildIndexes).
func (m *Mem) buildSessionWakes(avail []IndexEntry) {
	by := map[string][]IndexEntry{}
	for _, e := range avail {
		s := m.wakes[e.ID].SessionID
		by[s] = append(by[s], e)
	}
	m.sessionWakes = make(map[string]*btree.BTreeG[IndexEntry], len(by))
	for s, es := range by {
		m.sessionWakes[s] = sortedTree(es)
	}
}

// diffSessionWakes is Diff for the per-session available-wake index; a session with no entry
// equals a session the other state never saw.
func (m *Mem) diffSessionWakes(o *Mem) []string {
	var out []string
	empty := newIndex()
	for _, s := range unionKeys(m.sessionWakes, o.sessionWakes) {
		a, b := m.sessionWakes[s], o.sessionWakes[s]
		if a == nil {
			a = empty
		}
		if b == nil {
			b = empty
		}
		out = append(out, diffIndex(fmt.Sprintf("wake index of session %q", s), a, b)...)
	}
	return out
}
