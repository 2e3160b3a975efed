package postgres

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/goldenstore"
	"github.com/worklog/worklog/internal/pgtest"
)

var update = flag.Bool("update", false, "write the golden schema dump of this build's format (testdata/golden-format<N>.sql) and its expected state")

// goldenFormat is the schema format of the golden dump this test loads: the format this
// release keeps. A later format adds its own dump beside it; this one is never rewritten.
const goldenFormat = 1

var (
	goldenDump  = filepath.Join("testdata", "golden-format1.sql")
	goldenState = filepath.Join("testdata", "golden-format1-state.json")
	goldenNow   = goldenstore.T0.Add(2 * time.Hour)
)

// schemaPlaceholder stands for the schema's name in the golden dump.
const schemaPlaceholder = "golden_schema"

// writeGolden writes the golden dump: goldenstore.Populate through Open on a fresh
// schema, then pg_dump of that schema (plain SQL, rows as INSERTs), its name replaced by
// schemaPlaceholder; go test ./postgres -run TestGoldenSchema -update.
func writeGolden(t *testing.T) {
	if FormatVersion != goldenFormat {
		t.Fatalf("this build writes format %d: the golden dump of format %d is never rewritten; add one for format %d", FormatVersion, goldenFormat, FormatVersion)
	}
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	schema := schemaName(dsn)
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := goldenstore.Populate(ctx, q, 2<<10); err != nil {
		t.Fatal(err)
	}
	st, err := goldenstore.Dump(ctx, q, goldenNow)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	pgDump, err := exec.LookPath("pg_dump")
	if err != nil {
		m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_dump")
		if len(m) == 0 {
			t.Fatal("pg_dump not found")
		}
		pgDump = m[len(m)-1]
	}
	out, err := exec.Command(pgDump, "--schema="+schema, "--no-owner", "--no-privileges", "--no-comments",
		"--inserts", "-d", pgtest.Need(t).DSN).Output()
	if err != nil {
		t.Fatalf("pg_dump: %v", err)
	}
	var kept []string
	for _, l := range strings.Split(string(out), "\n") {
		// psql's meta-commands (\restrict) and the schema's creation (the test makes it) go.
		if strings.HasPrefix(l, `\`) || strings.HasPrefix(l, "CREATE SCHEMA ") {
			continue
		}
		kept = append(kept, strings.ReplaceAll(l, schema, schemaPlaceholder))
	}
	if err := os.WriteFile(goldenDump, []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := goldenstore.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goldenState, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenSchema loads the golden dump of schema format 1 (testdata/golden-format1.sql,
// written once by writeGolden: every record kind, a pruned range) into a fresh schema and
// opens it as a later build must forever: read-only, Verify finds nothing and the pruned
// range is there; read-write through Open, Verify again, and the state read back is
// exactly the expected one (testdata/golden-format1-state.json).
func TestGoldenSchema(t *testing.T) {
	if *update {
		writeGolden(t)
	}
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	dump, err := os.ReadFile(goldenDump)
	if err != nil {
		t.Fatal(err)
	}
	// The dump's own search_path setting is per session: a connection of its own.
	c, err := pgx.Connect(ctx, pgtest.Need(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	sql := regexp.MustCompile(`\b`+schemaPlaceholder+`\b`).ReplaceAllString(string(dump), schemaName(dsn))
	if _, err := c.Exec(ctx, sql); err != nil {
		c.Close(ctx)
		t.Fatalf("loading %s: %v", goldenDump, err)
	}
	c.Close(ctx)

	ro, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatalf("OpenReadOnly of the golden schema: %v", err)
	}
	if p, err := ro.Verify(ctx, VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("read-only Verify of the golden schema: %v %v", p, err)
	}
	if r, err := ro.PrunedRanges(ctx); err != nil || len(r) == 0 {
		t.Fatalf("the golden schema's pruned ranges: %v %v; want one", r, err)
	}
	ro.Close()

	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatalf("Open of the golden schema: %v", err)
	}
	defer q.Close()
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify after a read-write Open: %v", err)
	}
	if err := goldenstore.Check(ctx, q, goldenNow, goldenState); err != nil {
		t.Fatalf("the golden schema: %v", err)
	}
}
