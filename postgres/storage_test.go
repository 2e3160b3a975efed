package postgres

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
)

// reloptions reads every table's storage parameters in schema.
func reloptions(t *testing.T, c *pgx.Conn, schema string) map[string][]string {
	t.Helper()
	rows, err := c.Query(context.Background(), `SELECT c.relname::text, coalesce(c.reloptions, '{}')::text[] FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'`, schema)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	if err := collectInto(rows, got); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestStorageParameters: a new queue's tables carry storageParams (autovacuum after 2% of a
// table changed, fillfactor for the updated rows); Open sets those missing on an existing
// queue (an older one, or one an operator reset) and keeps a value an operator chose.
func TestStorageParameters(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	e, q := openEngine(t, dsn, nil)
	schema := e.schema
	c := connect(t, dsn)
	check := func(when string, want map[string][]string) {
		t.Helper()
		got := reloptions(t, c, schema)
		for table, params := range want {
			for _, p := range params {
				if !slices.Contains(got[table], p) {
					t.Errorf("%s: table %s has %v, want %s", when, table, got[table], p)
				}
			}
		}
	}
	check("a new queue", storageParams)
	// Every table a new queue has (those added after format 1 too), worklog_meta aside: a
	// table a later step adds without a row here fails.
	for table := range reloptions(t, c, schema) {
		if _, ok := storageParams[table]; !ok && table != "worklog_meta" {
			t.Errorf("table %s has no row in storageParams", table)
		}
	}
	for table := range storageParams {
		if _, ok := reloptions(t, c, schema)[table]; !ok {
			t.Errorf("storageParams names %s, which a new queue does not have", table)
		}
	}
	q.Close()

	sid := pgx.Identifier{schema}.Sanitize()
	if _, err := c.Exec(ctx, `ALTER TABLE `+sid+`.events RESET (autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor);
		ALTER TABLE `+sid+`.events SET (autovacuum_vacuum_scale_factor = 0.1);
		ALTER TABLE `+sid+`.tasks RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor);
		ALTER TABLE `+sid+`.log_head RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
		ALTER TABLE `+sid+`.wakes SET (fillfactor = 90);
		ALTER TABLE `+sid+`.kind_policies SET (fillfactor = 90)`); err != nil {
		t.Fatal(err)
	}
	_, q = openEngine(t, dsn, nil)
	defer q.Close()
	want := map[string][]string{}
	for table, params := range storageParams {
		want[table] = params
	}
	want["events"] = []string{"autovacuum_vacuum_scale_factor=0.1", "autovacuum_vacuum_insert_scale_factor=0.02", "autovacuum_analyze_scale_factor=0.02"}
	// wakes had an earlier build's default (supersededParams): replaced. kind_policies had
	// the same value, an operator's choice there: kept.
	want["kind_policies"] = []string{"fillfactor=90", "autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000"}
	check("reopened after a reset", want)
	if got := reloptions(t, c, schema)["wakes"]; slices.Contains(got, "fillfactor=90") {
		t.Errorf("wakes: %v: an earlier build's default fillfactor=90 was kept", got)
	}
	if got := reloptions(t, c, schema)["events"]; slices.ContainsFunc(got, func(o string) bool {
		return strings.HasSuffix(o, "scale_factor=0.02") && strings.HasPrefix(o, "autovacuum_vacuum_scale")
	}) {
		t.Errorf("events: %v: the operator's autovacuum_vacuum_scale_factor was overwritten", got)
	}
}
