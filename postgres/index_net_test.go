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
	ctx := context.Background()
	const ix, kind = projection.IndexKindDue, "k"
	entry := func(id string) projection.IndexEntry { return projection.IndexEntry{At: 100, Seq: 7, ID: id, Pri: 3} }
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
		rows, err := e.pool.Query(ctx, `SELECT convert_from(task_id, 'UTF8') FROM `+pgx.Identifier{e.schema}.Sanitize()+`.kind_due WHERE kind = 'k' AND at = 100 AND seq = 7`)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	group(func(tx *txn) error { return tx.PutIndex(ix, kind, entry("a")) })
	if got := stored(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("after a put: %q, want [a]", got)
	}
	group(func(tx *txn) error {
		return errors.Join(tx.DeleteIndex(ix, kind, entry("a")), tx.PutIndex(ix, kind, entry("b")))
	})
	if got := stored(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("after a delete and a put: %q, want [b]", got)
	}
	group(func(tx *txn) error {
		return errors.Join(tx.DeleteIndex(ix, kind, entry("b")), tx.PutIndex(ix, kind, entry("c")), tx.DeleteIndex(ix, kind, entry("c")))
	})
	if got := stored(); len(got) != 0 {
		t.Fatalf("after a delete, a put and a delete: %q, want none", got)
	}
}
