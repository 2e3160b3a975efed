package postgres

import (
	"bytes"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/worklog/worklog/projection"
)

// A claim's reads in the begin's round trip (issue 24 §1, W2).
//
// A claim under the log head read, each in a round trip of its own while every writer of
// every process waited: the schedules' due ticks (submitTicks), the kind policies
// (gatedScan), the greatest priority present in the due index, and the first page of that
// priority's entries (six round trips for a runner's SettleAndClaim, four of them reads
// under the lock). The writer now reads them in the begin batch, after the lock (so they are
// exactly the stored state at the locked head, whatever other writers did before), when its
// recent groups claimed: the claim plan (claimPlan) names the due indexes (and kind
// partitions) they scanned and how many entries they took. The group's closures then answer
// those reads from what the begin read, overlaid with the group's own index writes since the
// begin (prefetched.ops: a settle before the claim in the same command moves its entries):
//
//   - the policies: the txn's policies for the group (txn.pols), as its first use would have
//     read them; the group's own changes are kept there as before;
//   - the schedules' due entries: the first schedulePage in tick order; a scan goes on from
//     the server after the page when it wants more than the page proves, and every scan
//     after the group wrote a schedule (written to the server at once) reads the server;
//   - an index scan: the first preMaxPris priorities present (priDone: every one, when fewer
//     were found) and, for each, its first n entries in (at, seq) order, with their task
//     records. A scan yields, in order, the stored entries less those the group wrote since
//     the begin, plus the group's puts of that priority and partition, up to the last stored
//     entry read (everything past it is unknown: a full page); past it, the scan goes on from
//     the server after that entry (its pending writes sent first, as any scan's). The next
//     priority below b is the greatest of the stored ones and the group's puts below b when
//     the stored list proves nothing lies between; otherwise the server is asked.
//
// Nothing is decided differently: every read returns what the same read of the server,
// after the group's pending writes, would (the conformance suite and proptest's postgres
// differential run the claims through it; claimpre_test.go pins the overlay's cases). A plan
// that guessed wrong costs rows read in the begin's round trip, no round trip.

// preMaxPris is how many priorities of a scanned index the begin reads, each with a page.
const preMaxPris = 3

// planMaxAge is how many of the writer's groups that ran under the lock without a claim
// keep the plan of the last claim: the next claim is likely while they run between claims.
const planMaxAge = 8

type preKey struct {
	ix   projection.Index
	part string
}

// claimPlan is what the writer's recent claims read (the writer's own).
type claimPlan struct {
	scans map[preKey]int // the entries a scan of the index partition gave the group
	age   int            // groups under the lock since the last one that claimed
}

// noteScan records, in the group's txn, a scan of ix's partition part that gave n entries.
func (t *txn) noteScan(ix projection.Index, part string, n int) {
	if ix != projection.IndexDue && ix != projection.IndexKindDue {
		return
	}
	if t.scans == nil {
		t.scans = map[preKey]int{}
	}
	t.scans[preKey{ix, part}] += n
}

// learn keeps the scans of the group that ran under the lock as the plan of the next begins.
func (p *claimPlan) learn(t *txn) {
	if len(t.scans) == 0 {
		if p.age++; p.age > planMaxAge {
			p.scans = nil
		}
		return
	}
	p.scans, p.age = t.scans, 0
}

// prePage is one priority's first entries as the begin read them.
type prePage struct {
	rows []indexRow
	full bool // as many rows as asked: entries may follow the last
}

// preScan is what the begin read of one index partition.
type preScan struct {
	pris    []int64 // the greatest priorities present, descending
	priDone bool    // pris is every priority present
	pages   map[int64]*prePage
}

// prefetched is what the begin read for the group's claims, and the group's index writes
// since (the final state of each entry it wrote: put, or deleted).
type prefetched struct {
	scans     map[preKey]*preScan
	sched     []projection.ScheduleEntry
	schedFull bool // as many entries as asked
	schedOK   bool // sched holds the stored schedules: read, and the group wrote none since
	ops       [projection.NumIndexes]map[idxKey]idxOp
}

// preStatements are the begin's reads for a claim: an index partition's priorities and
// pages (scan[ix][i] reads pages of prePages[i] rows; $1 the partition), the schedules'
// first due ticks.
type preStatements struct {
	scan  [projection.NumIndexes][]string
	sched string
}

// prePages are the page sizes of the begin's claim reads, each a statement of its own with
// its size and preMaxPris written into it (LIMIT 48, not LIMIT $1). With the size a
// parameter, PostgreSQL's generic plan of the statement took the LIMIT for a tenth of the
// partition (~90,000 in cost against ~1,400 for the custom plan of the same shape), so the
// plan cache never kept it: every claim planned the statement again, 0.5–1.5 ms of the
// server's time a claim, more than its execution early in a run (pg_stat_statements with
// track_planning: plans = calls). With the size written in, the generic plan costs what a
// custom one does and is kept (TestPreScanKeepsItsGenericPlan). The sizes step by ~1.5×, as
// the page asked for does (prePageFor).
var prePages = []int{16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024}

// prePageFor is the page of the claim reads for a claim plan of n tasks: the smallest of
// prePages at least 1.5n+1, and at least scanPage; its index in prePages.
func prePageFor(n int) (int, int) {
	want := min(max(n+n/2+1, scanPage), scanPageMax)
	for i, p := range prePages {
		if p >= want {
			return i, p
		}
	}
	return len(prePages) - 1, prePages[len(prePages)-1]
}

// The scan's p ends with a row whose pri is NULL (the walk found no lower priority); the
// outer WHERE keeps the page's lateral read from running for it. Without it, when the
// planner reads a partition of one priority by its primary key (at, seq) and filters on the
// priority, as it does when the statistics show one, the NULL row's read walked every entry
// of the partition to find none: 1 ms a claim with 5,000 due tasks, 5.6 ms with 10,000
// (2,188 buffers; 154 with the WHERE), and W2 claims once a group
// (TestPreScanSkipsTheEndOfTheWalk).
func newPreStatements(q func(string) string) preStatements {
	var st preStatements
	for _, ix := range []projection.Index{projection.IndexDue, projection.IndexKindDue} {
		d := pgIndexes[ix]
		part := ""
		if d.part != "" {
			part = "d." + d.part + " = $1 AND "
		}
		for _, page := range prePages {
			st.scan[ix] = append(st.scan[ix], q(fmt.Sprintf(`WITH RECURSIVE p(pri, n) AS (
			(SELECT d.priority, 1 FROM {s}.%[1]s d WHERE %[2]s true ORDER BY d.priority DESC LIMIT 1)
			UNION ALL
			SELECT (SELECT d.priority FROM {s}.%[1]s d WHERE %[2]s d.priority < p.pri ORDER BY d.priority DESC LIMIT 1), p.n + 1
			FROM p WHERE p.n < %[4]d AND p.pri IS NOT NULL)
		SELECT p.pri, x.at, x.seq, x.task_id, x.rec, x.input FROM p CROSS JOIN LATERAL (
			SELECT d.at, d.seq, d.task_id, t.rec, t.input FROM {s}.%[1]s d LEFT JOIN {s}.tasks t ON t.id = d.task_id
			WHERE %[2]s d.priority = p.pri ORDER BY d.at, d.seq LIMIT %[3]d) x
		WHERE p.pri IS NOT NULL
		ORDER BY p.pri DESC, x.at, x.seq`, d.table, part, page, preMaxPris)))
		}
	}
	st.sched = q(`SELECT session, name, next FROM {s}.schedules WHERE next IS NOT NULL ORDER BY next, session, name LIMIT $1`)
	return st
}

// queuePrefetch queues into the begin batch b the reads of the plan, and returns what they
// will fill (nil: no plan). The policies are read into *pols.
func (e *engine) queuePrefetch(b *pgx.Batch, pols *map[string]*projection.KindPolicy) *prefetched {
	if len(e.plan.scans) == 0 {
		return nil
	}
	pre := &prefetched{scans: map[preKey]*preScan{}}
	b.Queue(e.st.kp.policies).Query(func(rows pgx.Rows) error {
		ps, err := collect(rows, scanPolicy)
		m := make(map[string]*projection.KindPolicy, len(ps))
		for _, p := range ps {
			m[p.Kind] = p
		}
		*pols = m
		return err
	})
	b.Queue(e.st.pre.sched, schedulePage).Query(func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var s, n []byte
			var at int64
			if err := rows.Scan(&s, &n, &at); err != nil {
				return err
			}
			pre.sched = append(pre.sched, projection.ScheduleEntry{At: at, SessionID: string(s), Name: string(n)})
		}
		pre.schedFull, pre.schedOK = len(pre.sched) == schedulePage, true
		return rows.Err()
	})
	for k, n := range e.plan.scans {
		i, page := prePageFor(n)
		ps := &preScan{pages: map[int64]*prePage{}}
		pre.scans[k] = ps
		var args []any
		if pgIndexes[k.ix].part != "" {
			args = append(args, []byte(k.part))
		}
		b.Queue(e.st.pre.scan[k.ix][i], args...).Query(func(rows pgx.Rows) error {
			defer rows.Close()
			for rows.Next() {
				var pri, at, seq int64
				var id []byte
				s, err := taskTable.scanRow(rows, &pri, &at, &seq, &id)
				if err != nil {
					return err
				}
				p := ps.pages[pri]
				if p == nil {
					p = &prePage{}
					ps.pages[pri] = p
					ps.pris = append(ps.pris, pri)
				}
				p.rows = append(p.rows, indexRow{projection.IndexEntry{Pri: pri, At: at, Seq: uint64(seq), ID: string(id)}, s})
			}
			for _, p := range ps.pages {
				p.full = len(p.rows) == page
			}
			ps.priDone = len(ps.pris) < preMaxPris
			return rows.Err()
		})
	}
	return pre
}

// noteIndexWrite keeps the final state of an index entry the group wrote, for the overlay.
func (t *txn) noteIndexWrite(ix projection.Index, k idxKey, op idxOp) {
	if t.pre == nil {
		return
	}
	m := t.pre.ops[ix]
	if m == nil {
		m = map[idxKey]idxOp{}
		t.pre.ops[ix] = m
	}
	m[k] = op
}

// scanDue is ScanIndex of a due index (the claims'): from what the begin read when it read
// the partition, else from the server; the entries it gives are noted for the plan.
func (t *txn) scanDue(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	n := 0
	defer func() { t.noteScan(ix, part, n) }()
	count := func(e projection.IndexEntry) bool {
		n++
		return fn(e)
	}
	if t.pre != nil {
		if ps := t.pre.scans[preKey{ix, part}]; ps != nil {
			return t.scanPrefetched(ix, part, ps, from, to, count)
		}
	}
	return t.scanIndexServer(ix, part, from, to, count)
}

// scanPrefetched is ScanIndex of a partition the begin read (ps).
func (t *txn) scanPrefetched(ix projection.Index, part string, ps *preScan, from, to int64, fn func(projection.IndexEntry) bool) error {
	s := &t.st.idx[ix]
	var pre []any
	if pgIndexes[ix].part != "" {
		pre = []any{[]byte(part)}
	}
	return scanByPriority(func(below int64) ([]int64, error) {
		if p, found, ok := t.preNextPri(ix, part, ps, below); ok {
			if !found {
				return nil, nil
			}
			return []int64{p}, nil
		}
		return txnPage(t, scanInt, s.nextPri, append([]any{below}, pre...)...)
	}, func(pri int64, fn func(projection.IndexEntry) bool) error {
		args := append(pre[:len(pre):len(pre)], pri)
		page, known := ps.pages[pri], true
		if page == nil {
			// A priority the begin did not read has no stored entry when it lies above the
			// least one read, or every one was read.
			known = ps.priDone || len(ps.pris) > 0 && pri > ps.pris[len(ps.pris)-1]
			page = &prePage{}
		}
		if !known {
			return scanJoined(t, taskTable, s.scan, s.scanFrom, args, from, to, nil, fn)
		}
		after, more, err := t.overlay(ix, part, pri, page, from, to, fn)
		if err != nil || !more {
			return err
		}
		return scanJoined(t, taskTable, s.scan, s.scanFrom, args, from, to, &after, fn)
	}, fn)
}

// preNextPri is the greatest priority below below present in the partition as the group
// sees it; ok false when what the begin read cannot prove it.
func (t *txn) preNextPri(ix projection.Index, part string, ps *preScan, below int64) (p int64, found, ok bool) {
	for _, q := range ps.pris {
		if q < below {
			p, found = q, true
			break
		}
	}
	for k, op := range t.pre.ops[ix] {
		if op.put && k.part == part && op.pri < below && (!found || op.pri > p) {
			p, found = op.pri, true
		}
	}
	switch {
	case ps.priDone:
		return p, found, true
	case len(ps.pris) > 0 && found && p >= ps.pris[len(ps.pris)-1]:
		return p, true, true
	}
	return 0, false, false
}

// overlay calls fn with the entries of priority pri of the partition with At in [from, to],
// as the group sees them, up to the last stored entry the begin read when its page was full.
// more: fn wants more and entries may follow after (the scan goes on from the server).
func (t *txn) overlay(ix projection.Index, part string, pri int64, page *prePage, from, to int64, fn func(projection.IndexEntry) bool) (after projection.IndexEntry, more bool, err error) {
	ops := t.pre.ops[ix]
	var end *projection.IndexEntry // the last stored entry read, when entries may follow it
	if page.full {
		end = &page.rows[len(page.rows)-1].IndexEntry
	}
	before := func(at int64, seq uint64, e *projection.IndexEntry) bool {
		return at < e.At || at == e.At && seq <= e.Seq
	}
	type entry struct {
		projection.IndexEntry
		row *indexRow // the stored row, with its record; nil: the group's put
	}
	var es []entry
	for i := range page.rows {
		r := &page.rows[i]
		if _, written := ops[idxKey{part, r.At, r.Seq}]; !written {
			es = append(es, entry{r.IndexEntry, r})
		}
	}
	for k, op := range ops {
		if op.put && op.pri == pri && k.part == part && (end == nil || before(k.at, k.seq, end)) {
			es = append(es, entry{projection.IndexEntry{Pri: pri, At: k.at, Seq: k.seq, ID: op.id}, nil})
		}
	}
	slices.SortFunc(es, func(a, b entry) int {
		if a.At != b.At {
			return cmpInt(a.At, b.At)
		}
		return cmpInt(a.Seq, b.Seq)
	})
	m := taskTable.cached(t.c)
	for _, x := range es {
		if x.At < from {
			continue
		}
		if x.At > to {
			return after, false, nil
		}
		if x.row != nil && x.row.rec != nil {
			if _, ok := m[x.ID]; !ok { // a record the group wrote or deleted is in the cache
				r, err := taskTable.decodeRow(x.ID, x.row.storedRow)
				if err != nil {
					return after, false, err
				}
				t.undo.task(t.c, x.ID) // a group run before the lock may be taken back
				m[x.ID] = r
				noteBig(t, taskTable, r)
			}
		}
		if !fn(x.IndexEntry) {
			return after, false, nil
		}
	}
	if end == nil || end.At > to {
		return after, false, nil
	}
	after = *end
	if from != math.MinInt64 && before(after.At, after.Seq, &projection.IndexEntry{At: from - 1, Seq: math.MaxInt64}) {
		after = projection.IndexEntry{At: from - 1, Seq: math.MaxInt64}
	}
	return after, true, nil
}

func cmpInt[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// scanSchedulesPrefetched is ScanScheduleDue from what the begin read; ok false when the
// begin read none or the group wrote a schedule since.
func (t *txn) scanSchedulesPrefetched(maxAt int64, fn func(projection.ScheduleEntry) bool) (ok bool, err error) {
	if t.pre == nil || !t.pre.schedOK {
		return false, nil
	}
	for _, e := range t.pre.sched {
		if e.At > maxAt || !fn(e) {
			return true, nil
		}
	}
	if !t.pre.schedFull {
		return true, nil
	}
	if t.optimistic {
		return true, t.refuseRead()
	}
	last := t.pre.sched[len(t.pre.sched)-1]
	return true, scanScheduleDueAfter(t.ctx, t.conn, t.st, maxAt, &last, fn)
}

// Claims in one round trip: the reads of the next claim after the COMMIT.
//
// The writer's fast path (fast.go) runs a group before the lock against its cache, and
// commits it in one round trip with a check that the head is still the cache's; a claim
// needed reads, so it ran the ordinary way, in two. A commit batch of a writer that claims
// (the plan) and was alone (no other writer committed since its last group) now also reads,
// after its COMMIT and in the same round trip, what the next claim reads (the begin's
// reads above) in a read-only REPEATABLE READ transaction of its own, with the log head:
// one snapshot, of the stored state at that head. When that head is the cache's — the
// group's own, nobody committed in between — the next group runs before the lock with
// those reads (and its own overlay, as under the lock), and its head check proves them
// still true when it commits; a read past them needs the server and sends the group the
// ordinary way, as every read before the lock does. So a runner's SettleAndClaim is one
// round trip while one process writes.

// claimReads is what a commit batch read after its COMMIT for the next group's claims.
type claimReads struct {
	seq, prunes uint64
	last        []byte
	pols        map[string]*projection.KindPolicy
	pre         *prefetched
}

// aloneBeforeReads is how many groups in a row the writer must have found no other
// writer's commit before it reads for the next claim after its COMMIT: while other
// processes write, the reads would be stale and the next claim's fast batch would fail its
// head check (a round trip lost, and the head held until its ROLLBACK).
const aloneBeforeReads = 4

// queueCommitAndClaimReads queues b's COMMIT and after it the next claim's reads (nil: no
// plan, or the writer has not been alone long; then the COMMIT is the batch's last
// statement). *committed is set when the COMMIT answers it committed, whatever the reads
// after it answer.
func (e *engine) queueCommitAndClaimReads(b *pgx.Batch, committed *bool) *claimReads {
	if len(e.plan.scans) == 0 || e.alone < aloneBeforeReads {
		b.Queue("COMMIT")
		return nil
	}
	b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error {
		*committed = ct.String() == "COMMIT"
		return nil
	})
	r := &claimReads{}
	b.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
	b.Queue(e.st.headNow).QueryRow(func(row pgx.Row) error {
		var seq, prunes int64
		err := row.Scan(&seq, &prunes, &r.last)
		r.seq, r.prunes = uint64(seq), uint64(prunes)
		return err
	})
	r.pre = e.queuePrefetch(b, &r.pols)
	b.Queue("COMMIT")
	return r
}

// useClaimReads gives the optimistic group tx the reads of the last commit batch when they
// are of the cache's head c (the group's checkHead then proves them current).
func (e *engine) useClaimReads(tx *txn, r *claimReads, c *cache) {
	if r == nil || r.seq != c.seq || r.prunes != c.prunes || !bytes.Equal(r.last, c.last) {
		return
	}
	pre := *r.pre
	pre.ops = [projection.NumIndexes]map[idxKey]idxOp{}
	tx.pre, tx.pols = &pre, make(map[string]*projection.KindPolicy, len(r.pols))
	for k, p := range r.pols {
		cp := *p
		tx.pols[k] = &cp
	}
}
