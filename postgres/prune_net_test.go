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

// TestPrunableReplaceAndDeleteInOneGroup: the retention index's writes of one key within one
// group net to what the last one says, as the due indexes' do
// (TestIndexReplaceAndDeleteInOneGroup). A delete then a put replaces the stored entry; a
// delete, a put and a delete again leave none. Before, the last delete cancelled the put as
// if the key had had no entry, and the stored entry stayed: a subject pruned later by an
// entry that should have been gone.
func TestPrunableReplaceAndDeleteInOneGroup(t *testing.T) {
	e, _ := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	entry := func(id string) projection.PruneEntry { return projection.PruneEntry{At: 100, Seq: 7, ID: id} }
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
		rows, err := e.pool.Query(ctx, `SELECT convert_from(id, 'UTF8') FROM `+pgx.Identifier{e.schema}.Sanitize()+`.prunable WHERE at = 100 AND seq = 7`)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	group(func(tx *txn) error { return tx.PutPrunable(entry("a")) })
	if got := stored(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("after a put: %q, want [a]", got)
	}
	group(func(tx *txn) error { return errors.Join(tx.DeletePrunable(entry("a")), tx.PutPrunable(entry("b"))) })
	if got := stored(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("after a delete and a put: %q, want [b]", got)
	}
	group(func(tx *txn) error {
		return errors.Join(tx.DeletePrunable(entry("b")), tx.PutPrunable(entry("c")), tx.DeletePrunable(entry("c")))
	})
	if got := stored(); len(got) != 0 {
		t.Fatalf("after a delete, a put and a delete: %q, want none", got)
	}
}
