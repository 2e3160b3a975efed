package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
)

// TestIndexReplaceAndDeleteInOneGroup: index writes of one key within one group net to
// what the last one says, now that a put is a plain INSERT. A delete then a put replaces the
// stored entry (the flush deletes it first); a delete, a put and a delete again leave none
// (before, the last delete cancelled the put and the stored entry stayed).
func TestIndexReplaceAndDeleteInOneGroup(t *testing.T) {
	e, _ := openEngine(t, pgtest.Schema(t), nil)
	const ix, kind = projection.IndexKindDue, "k"
	entry := func(id string) projection.IndexEntry { return projection.IndexEntry{At: 100, Seq: 7, ID: id, Pri: 3} }
	checkNetting(t, e,
		func(tx *txn, id string) error { return tx.PutIndex(ix, kind, entry(id)) },
		func(tx *txn, id string) error { return tx.DeleteIndex(ix, kind, entry(id)) },
		`SELECT convert_from(task_id, 'UTF8') FROM `+pgx.Identifier{e.schema}.Sanitize()+`.kind_due WHERE kind = 'k' AND at = 100 AND seq = 7`)
}

// TestPrunableReplaceAndDeleteInOneGroup: the retention index's writes of one key within one
// group net the same way. Before, the last delete cancelled the put as if the key had had no
// entry, and the stored entry stayed: a subject pruned later by an entry that should have
// been gone.
func TestPrunableReplaceAndDeleteInOneGroup(t *testing.T) {
	e, _ := openEngine(t, pgtest.Schema(t), nil)
	entry := func(id string) projection.PruneEntry { return projection.PruneEntry{At: 100, Seq: 7, ID: id} }
	checkNetting(t, e,
		func(tx *txn, id string) error { return tx.PutPrunable(entry(id)) },
		func(tx *txn, id string) error { return tx.DeletePrunable(entry(id)) },
		`SELECT convert_from(id, 'UTF8') FROM `+pgx.Identifier{e.schema}.Sanitize()+`.prunable WHERE at = 100 AND seq = 7`)
}

// checkNetting runs three groups on one key of an index, each committed though it appends no
// event: a put of "a"; a delete of "a" and a put of "b"; a delete of "b", a put of "c" and a
// delete of "c". After each, query (the ids stored under the key) must read [a], [b], none.
func checkNetting(t *testing.T, e *engine, put, del func(tx *txn, id string) error, query string) {
	t.Helper()
	ctx := context.Background()
	group := func(ops func(tx *txn) error) {
		t.Helper()
		if err := e.Update(ctx, func(etx engineapi.Txn) error {
			tx := etx.(*txn)
			tx.sideWrites = true // commit though no event was appended
			return ops(tx)
		}); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() []string {
		t.Helper()
		rows, err := e.pool.Query(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	group(func(tx *txn) error { return put(tx, "a") })
	if got := stored(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("after a put: %q, want [a]", got)
	}
	group(func(tx *txn) error { return errors.Join(del(tx, "a"), put(tx, "b")) })
	if got := stored(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("after a delete and a put: %q, want [b]", got)
	}
	group(func(tx *txn) error { return errors.Join(del(tx, "b"), put(tx, "c"), del(tx, "c")) })
	if got := stored(); len(got) != 0 {
		t.Fatalf("after a delete, a put and a delete: %q, want none", got)
	}
}
