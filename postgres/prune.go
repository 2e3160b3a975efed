package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
)

// Retention on PostgreSQL (docs/design.md, "Retention" and §9).
//
// The fold keeps the retention index (table prunable) through txn's PruneIndexer side. A
// prune group is one command of the writer, so it runs in a transaction that holds the log
// head's lock like every write: through projection.PruneSubject it removes the subjects'
// records, keys, session list rows, counts and index entries (written at the commit with
// the group's other writes); it deletes their events through the events table's subject
// index, and records the removed sequences in the pruned table, coalesced, so that Verify
// and ReadLog tell a pruned gap from a lost one. The transaction commits all of a group or
// none of it. It also counts up log_head.prunes: a prune changes records without moving the
// log head, and every process's writer keeps its record cache only while both are as it
// left them.

var (
	_ engineapi.Pruner        = (*engine)(nil)
	_ projection.PruneState   = (*txn)(nil)
	_ projection.PruneIndexer = (*txn)(nil)
)

// PruneGroup removes up to limit subjects prunable before before, as one command of the
// writer: it may share its transaction with other commands, and is re-run alone (reporting
// afresh) when the group fails.
func (e *engine) PruneGroup(ctx context.Context, before int64, limit int) (engineapi.PruneGroupResult, error) {
	var r engineapi.PruneGroupResult
	err := e.Update(ctx, func(tx engineapi.Txn) error {
		t, ok := tx.(*txn)
		if !ok { // never: e.Update hands its closures its own transaction
			return fmt.Errorf("postgres: PruneGroup ran in a %T, not the engine's transaction", tx)
		}
		var err error
		r, err = t.prune(before, limit)
		return err
	})
	if err != nil {
		return engineapi.PruneGroupResult{}, err
	}
	return r, nil
}

func (t *txn) prune(before int64, limit int) (engineapi.PruneGroupResult, error) {
	var res engineapi.PruneGroupResult
	var entries []projection.PruneEntry
	// One page of limit+1 entries: the group's, and whether there are more.
	if err := t.scanPrunable(pages{limit + 1, scanPageMax}, before, func(e projection.PruneEntry) bool {
		if len(entries) == limit {
			res.More = true
			return false
		}
		entries = append(entries, e)
		return true
	}); err != nil || len(entries) == 0 {
		return res, err
	}
	if err := t.prefetch(entries); err != nil {
		return engineapi.PruneGroupResult{}, err
	}
	subjects := make(map[string]bool, 2*len(entries))
	for _, e := range entries {
		p, err := projection.PruneSubject(t, e, before)
		if err != nil {
			return engineapi.PruneGroupResult{}, err
		}
		if p.TaskID != "" {
			res.Tasks++
			subjects[p.TaskID] = true
		}
		if p.WakeID != "" {
			res.Wakes++
			subjects[p.WakeID] = true
		}
	}
	// The subjects' events: those an earlier command of this group appended are still in
	// memory, the others are stored.
	var seqs []uint64
	kept := t.evs[:0]
	for _, ev := range t.evs {
		if subjects[ev.subject] {
			seqs = append(seqs, ev.seq)
		} else {
			kept = append(kept, ev)
		}
	}
	t.evs = kept
	ids := make([][]byte, 0, len(subjects))
	for id := range subjects {
		ids = append(ids, []byte(id))
	}
	b := &pgx.Batch{}
	t.flushIndexes(b) // the pending writes go first, in the same round trip
	b.Queue(t.st.delEvents, ids).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var seq int64
			if err := rows.Scan(&seq); err != nil {
				return err
			}
			seqs = append(seqs, uint64(seq))
		}
		return rows.Err()
	})
	if err := t.conn.SendBatch(t.ctx, b).Close(); err != nil {
		return engineapi.PruneGroupResult{}, err
	}
	if len(seqs) == 0 {
		return engineapi.PruneGroupResult{}, fmt.Errorf("%w: the events of %d pruned subjects are missing", ErrCorruptRow, len(subjects))
	}
	slices.Sort(seqs)
	if err := t.addPruned(projection.RunsOf(seqs)); err != nil {
		return engineapi.PruneGroupResult{}, err
	}
	t.pruned = true
	t.prunes++
	res.Events = uint64(len(seqs))
	return res, nil
}

// prefetch reads the records PruneSubject will read for entries that the cache does not
// hold, in two round trips instead of one or more per subject (under the head lock, which
// every other writer waits for): the tasks and requested wakes, then the completion wakes
// and the idempotency keys. Under the lock they are exact, so the cache keeps them; what is
// missing stays unread, for PruneSubject to find missing.
func (t *txn) prefetch(entries []projection.PruneEntry) error {
	var taskIDs, wakeIDs [][]byte
	for _, e := range entries {
		if _, ok := t.c.wakes[e.ID]; e.Wake && !ok {
			wakeIDs = append(wakeIDs, []byte(e.ID))
		} else if _, ok := t.c.tasks[e.ID]; !e.Wake && !ok {
			taskIDs = append(taskIDs, []byte(e.ID))
		}
	}
	b := &pgx.Batch{}
	t.queueRecords(b, taskIDs, wakeIDs)
	if b.Len() > 0 {
		if err := t.conn.SendBatch(t.ctx, b).Close(); err != nil {
			return err
		}
	}
	wakeIDs = wakeIDs[:0]
	var ts, tk, ws, wk [][]byte
	for _, e := range entries {
		if e.Wake {
			if w := t.c.wakes[e.ID]; w != nil && w.IdempotencyKey != "" {
				if _, ok := t.c.wakeKeys[skey{w.SessionID, w.IdempotencyKey}]; !ok {
					ws, wk = append(ws, []byte(w.SessionID)), append(wk, []byte(w.IdempotencyKey))
				}
			}
			continue
		}
		r := t.c.tasks[e.ID]
		if r == nil {
			continue
		}
		if _, ok := t.c.wakes[r.CompletionWakeID]; r.CompletionWakeID != "" && !ok {
			wakeIDs = append(wakeIDs, []byte(r.CompletionWakeID))
		}
		if _, ok := t.c.taskKeys[skey{r.SessionID, r.IdempotencyKey}]; r.IdempotencyKey != "" && !ok {
			ts, tk = append(ts, []byte(r.SessionID)), append(tk, []byte(r.IdempotencyKey))
		}
	}
	b = &pgx.Batch{}
	t.queueRecords(b, nil, wakeIDs)
	keys := func(sql string, ss, ks [][]byte, m map[skey]string) {
		if len(ss) == 0 {
			return
		}
		b.Queue(sql, ss, ks).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var s, k, id []byte
				if err := rows.Scan(&s, &k, &id); err != nil {
					return err
				}
				m[skey{string(s), string(k)}] = string(id)
			}
			return rows.Err()
		})
	}
	keys(t.st.taskKeysIn, ts, tk, t.c.taskKeys)
	keys(t.st.wakeKeysIn, ws, wk, t.c.wakeKeys)
	if b.Len() == 0 {
		return nil
	}
	return t.conn.SendBatch(t.ctx, b).Close()
}

// queueRecords queues reads of the tasks and wakes by id into the cache.
func (t *txn) queueRecords(b *pgx.Batch, taskIDs, wakeIDs [][]byte) {
	taskTable.queueByIDs(b, t.c, t.st.tasksByID, taskIDs)
	wakeTable.queueByIDs(b, t.c, t.st.wakesByID, wakeIDs)
}

// addPruned records the runs (sorted, coalesced, not pruned before) in the pruned table,
// coalesced with the stored ranges they touch: those are taken out and put back merged.
func (t *txn) addPruned(runs []projection.SeqRange) error {
	before, after := make([]int64, len(runs)), make([]int64, len(runs))
	for i, r := range runs {
		before[i], after[i] = int64(r.From)-1, int64(r.To)+1
	}
	var rs projection.SeqRanges
	for _, r := range runs {
		rs.Add(r.From, r.To)
	}
	rows, err := t.conn.Query(t.ctx, t.st.takeAdjacent, before, after)
	if err != nil {
		return err
	}
	var touching []projection.SeqRange
	for rows.Next() {
		var from, to int64
		if err := rows.Scan(&from, &to); err != nil {
			rows.Close()
			return err
		}
		touching = append(touching, projection.SeqRange{From: uint64(from), To: uint64(to)})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range touching {
		if rs.Contains(r.From) || rs.Contains(r.To) {
			return fmt.Errorf("%w: pruned row [%d, %d] overlaps the sequences pruned now", ErrCorruptRow, r.From, r.To)
		}
		rs.Add(r.From, r.To)
	}
	froms, tos := make([]int64, len(rs)), make([]int64, len(rs))
	for i, r := range rs {
		froms[i], tos[i] = int64(r.From), int64(r.To)
	}
	_, err = t.conn.Exec(t.ctx, t.st.insPruned, froms, tos)
	return err
}

// --- txn's side of projection.PruneState ---

// PutPrunable notes a put over a pending delete as replacing a stored entry (idxOp.replaces),
// as PutIndex does, so that a delete after it deletes the stored entry rather than netting
// the put out (TestPrunableReplaceAndDeleteInOneGroup). The flush's upsert replaces it.
func (t *txn) PutPrunable(e projection.PruneEntry) error {
	k := dueKey{e.At, e.Seq}
	op, ok := t.prunable[k]
	t.prunable[k] = idxOp{put: true, id: e.ID, wake: e.Wake, replaces: op.replaces || ok && !op.put}
	return nil
}

func (t *txn) DeletePrunable(e projection.PruneEntry) error {
	netDelete(t.prunable, dueKey{e.At, e.Seq})
	return nil
}

// ScanPrunable pages through the retention index after sending the group's pending writes,
// passing over held entries (projection.PruneHeld).
func (t *txn) ScanPrunable(before int64, fn func(projection.PruneEntry) bool) error {
	return t.scanPrunable(indexPages, before, fn)
}

// scanPrunable pages through the retention index (p: the page sizes) after sending the
// group's pending writes. Each page's records are read for PruneHeld before fn sees its
// entries, in at most three round trips a page (prefetch, then the schedules of its ticks'
// tasks), not one per entry; PruneSubject then finds them in the cache.
func (t *txn) scanPrunable(p pages, before int64, fn func(projection.PruneEntry) bool) error {
	return keyset(p, func(last *projection.PruneEntry, n int) ([]projection.PruneEntry, error) {
		var page []projection.PruneEntry
		var err error
		if last == nil {
			page, err = txnPage(t, scanPruneRow, t.st.scanPrunable, before, n)
		} else {
			page, err = txnPage(t, scanPruneRow, t.st.scanPrunableFrom, before, n, last.At, int64(last.Seq))
		}
		if err == nil {
			err = t.prefetchHeld(page)
		}
		return page, err
	}, func(e projection.PruneEntry) (bool, error) {
		held, err := projection.PruneHeld(t, e)
		if err != nil {
			return false, err
		}
		return held || fn(e), nil
	})
}

// prefetchHeld reads what PruneHeld reads for a page of entries: the records (prefetch),
// then the schedules of the ticks' tasks among them.
func (t *txn) prefetchHeld(page []projection.PruneEntry) error {
	if err := t.prefetch(page); err != nil {
		return err
	}
	var keys []skey
	for _, e := range page {
		if r := t.c.tasks[e.ID]; !e.Wake && r != nil {
			if name, ok := projection.TickOf(r); ok {
				keys = append(keys, skey{r.SessionID, name})
			}
		}
	}
	return t.readSchedules(keys)
}

func scanPruneRow(rows pgx.Rows) (projection.PruneEntry, error) {
	var at, seq int64
	var id []byte
	var wake bool
	err := rows.Scan(&at, &seq, &id, &wake)
	return projection.PruneEntry{At: at, Seq: uint64(seq), ID: string(id), Wake: wake}, err
}

// DeleteTask forgets the record: a task put by this group is not written at all; a stored
// one is deleted at the commit. The cache records it as absent.
func (t *txn) DeleteTask(id string) error {
	forgetRecord(t.c.tasks, t.newTasks, t.dirtyTasks, &t.delTasks, id)
	return nil
}

func (t *txn) DeleteWake(id string) error {
	forgetRecord(t.c.wakes, t.newWakes, t.dirtyWakes, &t.delWakes, id)
	return nil
}

func forgetRecord[R any](cached map[string]*R, added, changed map[string]bool, deleted *map[string]bool, id string) {
	cached[id] = nil
	delete(changed, id)
	if added[id] {
		delete(added, id)
		return
	}
	if *deleted == nil {
		*deleted = map[string]bool{}
	}
	(*deleted)[id] = true
}

// DeleteTaskKey forgets the key: one put by this group is not written; a stored one is
// deleted at the commit.
func (t *txn) DeleteTaskKey(sessionID, key string) error {
	forgetKey(t.c.taskKeys, &t.newTaskKeys, &t.delTaskKeys, skey{sessionID, key})
	return nil
}

func (t *txn) DeleteWakeKey(sessionID, key string) error {
	forgetKey(t.c.wakeKeys, &t.newWakeKeys, &t.delWakeKeys, skey{sessionID, key})
	return nil
}

func forgetKey(cached map[skey]string, added, deleted *[]skey, k skey) {
	cached[k] = ""
	if i := slices.Index(*added, k); i >= 0 {
		*added = slices.Delete(*added, i, i+1)
		return
	}
	*deleted = append(*deleted, k)
}

// DeleteSessionTask drops a list entry still waiting to be written, or deletes the stored
// one (with the index writes: before a scan of the list, and before the commit's inserts).
func (t *txn) DeleteSessionTask(sessionID string, submitSeq uint64) error {
	k := sessKey{sessionID, submitSeq}
	if i := slices.Index(t.sessions, k); i >= 0 {
		t.sessions = slices.Delete(t.sessions, i, i+1)
		t.sessionIDs = slices.Delete(t.sessionIDs, i, i+1)
		return nil
	}
	t.delSessions = append(t.delSessions, k)
	return nil
}

// flushPrune queues the retention index's writes and the session list's deletions (part of
// flushIndexes: deletions before the inserts that follow).
func (t *txn) flushPrune(b *pgx.Batch) {
	if len(t.delSessions) > 0 {
		ss, qs := make([][]byte, len(t.delSessions)), make([]int64, len(t.delSessions))
		for i, k := range t.delSessions {
			ss[i], qs[i] = []byte(k.session), int64(k.seq)
		}
		b.Queue(t.st.delSession, ss, qs)
		t.delSessions = t.delSessions[:0]
	}
	if len(t.prunable) == 0 {
		return
	}
	var pa, ps, da, ds []int64
	var pid [][]byte
	var pw []bool
	for k, op := range t.prunable {
		if op.put {
			pa, ps, pid, pw = append(pa, k.at), append(ps, int64(k.seq)), append(pid, []byte(op.id)), append(pw, op.wake)
		} else {
			da, ds = append(da, k.at), append(ds, int64(k.seq))
		}
	}
	if len(da) > 0 {
		b.Queue(t.st.delPrunable, da, ds)
	}
	if len(pa) > 0 {
		queueRows(b, t.st, t.st.insPrunable, pa, ps, pid, pw)
	}
	clear(t.prunable)
}

// queueDeletes queues the deletions of records and keys, ahead of the commit's inserts (a
// key freed by a prune may be taken again in the same group).
func (t *txn) queueDeletes(b *pgx.Batch) {
	ids := func(m map[string]bool) [][]byte {
		out := make([][]byte, 0, len(m))
		for id := range m {
			out = append(out, []byte(id))
		}
		return out
	}
	if len(t.delTasks) > 0 {
		b.Queue(t.st.delTasks, ids(t.delTasks))
	}
	if len(t.delWakes) > 0 {
		b.Queue(t.st.delWakes, ids(t.delWakes))
	}
	keys := func(sql string, ks []skey) {
		if len(ks) == 0 {
			return
		}
		ss, kk := make([][]byte, len(ks)), make([][]byte, len(ks))
		for i, k := range ks {
			ss[i], kk[i] = []byte(k.session), []byte(k.key)
		}
		b.Queue(sql, ss, kk)
	}
	keys(t.st.delTaskKeys, t.delTaskKeys)
	keys(t.st.delWakeKeys, t.delWakeKeys)
}

// prunedRanges reads the pruned table.
func prunedRanges(ctx context.Context, q querier, st *statements) (projection.SeqRanges, error) {
	rows, err := q.Query(ctx, st.prunedRanges)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out projection.SeqRanges
	for rows.Next() {
		var from, to int64
		if err := rows.Scan(&from, &to); err != nil {
			return nil, err
		}
		if n := len(out); from < 1 || to < from || (n > 0 && uint64(from) <= out[n-1].To+1) {
			return nil, fmt.Errorf("%w: pruned row [%d, %d] is empty, or overlaps or touches the one before", ErrCorruptRow, from, to)
		}
		out = append(out, projection.SeqRange{From: uint64(from), To: uint64(to)})
	}
	return out, rows.Err()
}

// gapPruned reports whether every sequence of [from, to] was pruned (the ranges are
// coalesced: one range holds them all).
func gapPruned(rs projection.SeqRanges, from, to uint64) bool {
	i, _ := slices.BinarySearchFunc(rs, from, func(r projection.SeqRange, s uint64) int {
		switch {
		case r.To < s:
			return -1
		case r.From > s:
			return 1
		}
		return 0
	})
	return i < len(rs) && rs[i].From <= from && rs[i].To >= to
}
