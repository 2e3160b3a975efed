package postgres

import (
	"sync/atomic"

	"github.com/worklog/worklog/projection"
)

// A claim's read from its run's low-water mark (issue 24 §1, W2; pebblelog's runMark).
//
// A claim deletes the due entries it takes (due and kind_due), and PostgreSQL keeps a
// deleted entry in its indexes until VACUUM removes it, which autovacuum does at most once a
// minute on a busy table. A claim reads its run (one priority of one partition) in (at, seq)
// order, from the run's start: through the entries of every claim made since the last
// vacuum. A W2 of 20,000 tasks grew the claim's read from 198 to 330 buffers a call, and its
// probe of the greatest priority present (which lands at the run's first, oldest entry) from
// 30 to 99 (docs/performance.md).
//
// So the writer keeps, with its cache, a mark per run it claimed from: dueMark for (index,
// partition, priority) says that the stored partition, at the cache's log head, holds no
// entry of that priority below (at, seq). The begin's claim reads (claimpre.go) read each
// run's page from its mark, and the probe for the greatest priority asks first whether a
// priority above the greatest marked one is present (a scan that ends at the first entry it
// meets, live or not) and then whether the marked run has an entry from its mark on. The
// rules:
//
//   - a group's read of a run's first page raises the run's mark to the page's first entry:
//     the read is of the stored state at the head the group starts from, and reads from the
//     old mark (or the run's start), below which nothing is stored;
//   - every put of a due entry by the group lowers its run's mark to the entry when it lies
//     below (an entry released, retried or submitted due earlier than the mark);
//   - a delete changes nothing: a mark below a deleted entry is still true;
//   - the marks belong to the cache's head: a group's marks replace the cache's only when it
//     commits (adopt), the marks go with the cache whenever it is dropped, and a begin that
//     finds another writer's commit drops them (another writer's puts are not seen here);
//   - a read uses the marks only when the log head is still theirs, which the statement
//     itself checks (the begin's reads go in the batch that learns whether another writer
//     committed, so the writer cannot know it when it sends them).
//
// A mark one entry too high would hide a due task from every claim, so the package's tests
// check every mark a read uses against the stored entries in the same snapshot
// (checkRunMarks), and the proptest postgres differential compares every claim's task with
// the other backends'. The walk's later priorities (the second and third of preMaxPris) still
// start at their runs' first entries.

// markKey names one run of a due index: its partition and priority.
type markKey struct {
	ix   projection.Index
	part string
	pri  int64
}

// dueMark: the run holds no stored entry below (at, seq).
type dueMark struct {
	at  int64
	seq uint64
}

// below reports whether (at, seq) lies below the mark.
func (m dueMark) below(at int64, seq uint64) bool {
	return at < m.at || at == m.at && seq < m.seq
}

// maxRunMarks bounds the marks the cache keeps; a run beyond it is read from its start.
const maxRunMarks = 1024

// notePut lowers, in the group's view, the mark of the run of a due entry the group puts.
func (t *txn) notePut(ix projection.Index, part string, e projection.IndexEntry) {
	if ix != projection.IndexDue && ix != projection.IndexKindDue {
		return
	}
	k := markKey{ix, part, e.Pri}
	if t.duePuts == nil {
		t.duePuts = map[markKey]dueMark{}
	}
	if m, ok := t.duePuts[k]; !ok || m.below(e.At, e.Seq) {
		t.duePuts[k] = dueMark{e.At, e.Seq}
	}
}

// marksAfter returns the marks of the head the group leaves: the cache's (of the head the
// group began at), raised by the group's claim reads and lowered by its puts. The group's
// writes must all be made; the result is computed once.
func (t *txn) marksAfter() map[markKey]dueMark {
	if t.marksDone {
		return t.marks
	}
	m := make(map[markKey]dueMark, len(t.c.marks)+1)
	for k, v := range t.c.marks {
		m[k] = v
	}
	if t.pre != nil {
		for k, ps := range t.pre.scans {
			for pri, p := range ps.pages {
				mk := markKey{k.ix, k.part, pri}
				if _, ok := m[mk]; len(p.rows) == 0 || !ok && len(m) >= maxRunMarks {
					continue
				}
				m[mk] = dueMark{p.rows[0].At, p.rows[0].Seq}
			}
		}
	}
	for k, put := range t.duePuts {
		if cur, ok := m[k]; ok && cur.below(put.at, put.seq) {
			m[k] = put
		}
	}
	t.marks, t.marksDone = m, true
	return m
}

// markArgs are a partition's marks as the claim read's parameters: priorities, ats and seqs.
func markArgs(marks map[markKey]dueMark, k preKey) (pris, ats, seqs []int64) {
	for mk, m := range marks {
		if mk.ix == k.ix && mk.part == k.part {
			pris, ats, seqs = append(pris, mk.pri), append(ats, m.at), append(seqs, int64(m.seq))
		}
	}
	if pris == nil { // an empty array, not NULL
		pris, ats, seqs = []int64{}, []int64{}, []int64{}
	}
	return pris, ats, seqs
}

// headOf is a log head as the claim read's guard compares it: the marks are used only while
// the stored head is this one.
type headOf struct {
	seq, prunes uint64
	last        []byte // nil: not known, and the marks are not used
}

// guardArgs are the guard's parameters: a head that never matches when last is not known.
func (h headOf) guardArgs() []any {
	if h.last == nil {
		return []any{int64(-1), int64(-1), []byte{}}
	}
	return []any{int64(h.seq), int64(h.prunes), h.last}
}

// headAfter is the log head the group leaves when it commits (adopt's cache.last: the
// head's event is the group's last, unless a prune of the group took it).
func (t *txn) headAfter() headOf {
	h := headOf{seq: t.seq, prunes: t.prunes, last: t.last}
	if t.seq != t.startSeq {
		h.last = nil
		if n := len(t.evs); n > 0 && t.evs[n-1].seq == t.seq {
			h.last = lastOf(t.evs[n-1].body)
		}
	}
	return h
}

// checkRunMarks makes every claim read also count, in its snapshot, the marks it used that
// a stored entry lies below (runMarkViolations). Set by the package's tests.
var checkRunMarks bool

// runMarkViolations counts the marks found above a stored entry (checkRunMarks).
var runMarkViolations atomic.Int64
