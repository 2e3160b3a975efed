package postgres

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Table storage parameters (docs/design.md §9 "Disk under retention"). A queue under
// retention deletes as many rows as it inserts, table by table: the log and the records by
// prunes, the due, wake and retention indexes by every transition, and it updates a few rows
// on every group (log_head, counts, the writer's commit mark). PostgreSQL reuses the space of
// dead rows once (auto)vacuum has marked it free, so a table stays flat if vacuum comes often
// enough; the server's defaults wait for 20% of a table's rows to be dead (50 rows plus
// autovacuum_vacuum_scale_factor 0.2), which for the log of a busy queue is hours of growth.
//
//   - every table of the queue: vacuum (and analyze) after 2% of its rows changed, and insert
//     vacuums after 2% new rows (the log and the records are append-mostly between prunes);
//   - the records (tasks, wakes): fillfactor 50, leaving room in each page for the updates of
//     rec that every claim and finish makes, so they stay HOT (no index entry, pruned on the
//     page without vacuum: the primary key is the only index and never changes). Half, not
//     the 90 of earlier builds: the rows of one page were submitted together and are claimed
//     together, in one group, and an update writes the whole row again (rec and the input
//     beside it, unless the input is large enough to be TOASTed), so a page needs room for a
//     new version of every row on it at once. Measured on tasks (bench/, -n 5000: W2 claims
//     and finishes 10,000 tasks): at 90, 5,698 of 20,000 updates were HOT, the table and its
//     index ended at 14 MB and 1.2 MB, and W2 wrote 3.7 kB of WAL a task; at 50, 19,988 HOT,
//     11 MB and 0.6 MB, 3.1 kB a task (-17%). The table is no larger for it: a page gets the
//     room of its dead versions back by pruning, and at 90 the non-HOT copies on other pages
//     grew it. wakes are updated the same way (claim, ack) and take the same value;
//   - the rows every group updates (log_head, counts, commit_marks): fillfactor 50 and vacuum
//     after 1,000 dead rows whatever the table's size, so they stay a page or two.
//
// Open (not OpenReadOnly) sets them on tables that lack them (an older queue, or one an
// operator reset): the check comes first, so an Open of a queue that has them takes no lock.
// An operator may set other values: Open only sets the parameters when one is missing, or
// holds a value an earlier build set by default (supersededParams), which it replaces.
var storageParams = map[string][]string{
	"events": bulkParams, "task_keys": bulkParams, "wake_keys": bulkParams, "session_tasks": bulkParams,
	"due": bulkParams, "kind_due": bulkParams, "wake_index": bulkParams, "session_wakes": bulkParams,
	"prunable": bulkParams, "pruned": bulkParams, "schedules": bulkParams,
	"submit_inbox": bulkParams, "submit_inbox_rejects": bulkParams, "kind_leases": bulkParams,
	"kind_policies": hotParams, // rewritten by every claim of a kind with a rate (its bucket)
	"tasks":         append([]string{"fillfactor=50"}, bulkParams...),
	"wakes":         append([]string{"fillfactor=50"}, bulkParams...),
	"log_head":      hotParams, "counts": hotParams, "commit_marks": hotParams,
}

// supersededParams are the values earlier builds set by default, table by table: Open
// replaces them with storageParams' as if they were missing (an operator who wants one of
// them back sets it after Open and keeps it only until the next Open: choose another value,
// 89 rather than 90, to keep it for good).
var supersededParams = map[string][]string{
	"tasks": {"fillfactor=90"},
	"wakes": {"fillfactor=90"},
}

var (
	bulkParams = []string{"autovacuum_vacuum_scale_factor=0.02", "autovacuum_vacuum_insert_scale_factor=0.02",
		"autovacuum_analyze_scale_factor=0.02"}
	hotParams = []string{"fillfactor=50", "autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000"}
)

// ensureStorage sets storageParams on each table of the schema that lacks one of its
// parameters (by name: a value an operator chose is kept).
func ensureStorage(ctx context.Context, tx pgx.Tx, schema string) error {
	rows, err := tx.Query(ctx, `SELECT c.relname::text, coalesce(c.reloptions, '{}')::text[] FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'`, schema)
	if err != nil {
		return err
	}
	have := map[string][]string{}
	if err := collectInto(rows, have); err != nil {
		return err
	}
	var ddl []string
	for _, table := range slices.Sorted(maps.Keys(storageParams)) {
		opts, ok := have[table]
		if !ok {
			continue // a table this queue does not have (yet): created later with its own step
		}
		var missing []string
		for _, p := range storageParams[table] {
			name := p[:strings.IndexByte(p, '=')+1]
			if !slices.ContainsFunc(opts, func(o string) bool {
				return strings.HasPrefix(o, name) && !slices.Contains(supersededParams[table], o)
			}) {
				missing = append(missing, p)
			}
		}
		if len(missing) > 0 {
			ddl = append(ddl, "ALTER TABLE "+pgx.Identifier{schema, table}.Sanitize()+" SET ("+strings.Join(missing, ", ")+")")
		}
	}
	if len(ddl) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, strings.Join(ddl, ";\n")); err != nil {
		return fmt.Errorf("setting the storage parameters of the tables in schema %q: %w", schema, err)
	}
	return nil
}

func collectInto(rows pgx.Rows, into map[string][]string) error {
	defer rows.Close()
	for rows.Next() {
		var name string
		var opts []string
		if err := rows.Scan(&name, &opts); err != nil {
			return err
		}
		into[name] = opts
	}
	return rows.Err()
}
