package postgres

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/worklog/worklog/projection"
)

// TestEveryIndexHasATable guards the PostgreSQL rows of "Adding an index"
// (docs/architecture.md): pgIndexes is an array keyed by projection.Index, so a forgotten
// row compiles with no table. Each index needs a table of its own that some DDL of the
// package creates (schemaDDL, or a table added after format 1 by ensureAdditions).
func TestEveryIndexHasATable(t *testing.T) {
	var ddl strings.Builder
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ddl.Write(b)
	}
	src := ddl.String()
	seen := map[string]projection.Index{}
	for ix := range projection.NumIndexes {
		row := pgIndexes[ix]
		if row.table == "" {
			t.Fatalf("index %d (%s) has no row in pgIndexes", ix, projection.Indexes[ix].Name)
		}
		if other, dup := seen[row.table]; dup {
			t.Fatalf("indexes %d and %d share the table %s", other, ix, row.table)
		}
		seen[row.table] = ix
		if (row.part != "") != (projection.Indexes[ix].Part != "") {
			t.Errorf("table %s: partition column %q for an index partitioned by %q", row.table, row.part, projection.Indexes[ix].Part)
		}
		if !strings.Contains(src, "CREATE TABLE {s}."+row.table+" (") && !strings.Contains(src, "CREATE TABLE IF NOT EXISTS {s}."+row.table+" (") {
			t.Errorf("no DDL of the package creates table %s (the %s)", row.table, projection.Indexes[ix].Name)
		}
	}
}
