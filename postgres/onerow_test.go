package postgres

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

func TestOneRowOf(t *testing.T) {
	got := oneRowOf(`INSERT INTO "s".counts AS c SELECT * FROM unnest($1::bytea[], $2::smallint[], $3::bigint[])
			ON CONFLICT (kind, state) DO UPDATE SET n = c.n + excluded.n`)
	want := `INSERT INTO "s".counts AS c VALUES ($1::bytea, $2::smallint, $3::bigint)
			ON CONFLICT (kind, state) DO UPDATE SET n = c.n + excluded.n`
	if got != want {
		t.Errorf("oneRowOf:\n got %s\nwant %s", got, want)
	}
	for _, bad := range []string{`INSERT INTO t VALUES ($1)`, `INSERT INTO t SELECT * FROM unnest($1::bytea`, `INSERT INTO t SELECT * FROM unnest($1::bytea)`} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("oneRowOf(%q) did not panic", bad)
				}
			}()
			oneRowOf(bad)
		}()
	}
	// Every form the statements carry: one VALUES row, no array parameter left.
	st := newStatements("s")
	if len(st.oneRow) < 8 {
		t.Fatalf("%d single-row forms", len(st.oneRow))
	}
	for many, one := range st.oneRow {
		if strings.Contains(one, "unnest") || strings.Contains(one, "[]") || !strings.Contains(one, "VALUES (") {
			t.Errorf("the single-row form of %q is %q", many, one)
		}
	}
}

func TestSingleRow(t *testing.T) {
	row, ok := singleRow([]any{[]int64{7}, [][]byte{nil}, []int16{3}, []bool{true}})
	if !ok || row[0] != int64(7) || row[1].([]byte) != nil || row[2] != int16(3) || row[3] != true {
		t.Errorf("singleRow = %v, %v", row, ok)
	}
	for _, cols := range [][]any{
		{[]int64{1, 2}},
		{[]int64{1}, [][]byte{}},
		{[]string{"x"}},
	} {
		if _, ok := singleRow(cols); ok {
			t.Errorf("singleRow(%v) took it as one row", cols)
		}
	}
}

// TestOneRowInserts: a group of one submit, one keyed wake and one settle sends each insert
// in its single-row form, on the ordinary path and on the fast path; a group of several rows
// sends arrays. What they store reads back and verifies.
func TestOneRowInserts(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	var sqls []string
	record := func(b *pgx.Batch) {
		for _, qq := range b.QueuedQueries {
			sqls = append(sqls, qq.SQL)
		}
	}
	// inserts reports, per table the batches inserted into, whether any insert was in its
	// single-row form and whether any was in arrays.
	inserts := func() (one, many map[string]bool) {
		one, many = map[string]bool{}, map[string]bool{}
		for _, sql := range sqls {
			_, rest, ok := strings.Cut(sql, "INSERT INTO ") // task_keys': in a WITH (boundKeyInsert)
			if !ok {
				continue
			}
			table := strings.Fields(rest)[0]
			table = table[strings.LastIndexByte(table, '.')+1:]
			if strings.Contains(sql, "unnest(") {
				many[table] = true
			} else {
				one[table] = true
			}
		}
		sqls = nil
		return one, many
	}
	wantOne := func(path string, tables ...string) {
		t.Helper()
		one, many := inserts()
		for _, table := range tables {
			if !one[table] || many[table] {
				t.Errorf("%s: inserts into %s: single-row %v, arrays %v; want the single row alone", path, table, one[table], many[table])
			}
		}
	}

	e.ordinaryCommits = true // the ordinary path
	tracing(e).commitBatch = record
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "a", Input: json.RawMessage(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	wantOne("ordinary submit", "events", "tasks", "task_keys", "session_tasks", "counts", "due", "kind_due")
	if _, err := s.Wake(ctx, work.WakeRequest{IdempotencyKey: "w", Payload: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	wantOne("ordinary wake", "events", "wakes", "wake_keys")
	tracing(e).commitBatch = nil
	e.ordinaryCommits = false

	tracing(e).fastBatch = func(_ *pgx.Conn, b *pgx.Batch) { record(b) }
	defer func() { tracing(e).fastBatch = nil }()
	for i, key := range []string{"b", "c"} { // the first may find the cache not yet alone
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: key}); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if len(sqls) == 0 {
				t.Fatal("the second submit did not take the fast path")
			}
			wantOne("fast submit", "events", "tasks", "task_keys", "session_tasks", "counts", "due", "kind_due")
		}
		sqls = nil
	}
	tracing(e).fastBatch = nil

	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).commitBatch = record
	if _, err := s.SubmitMany(ctx, taskRequests(5, "k", true)); err != nil {
		t.Fatal(err)
	}
	_, many := inserts()
	for _, table := range []string{"events", "tasks", "task_keys", "session_tasks", "due", "kind_due"} {
		if !many[table] {
			t.Errorf("a group of five: no arrays into %s", table)
		}
	}
	tracing(e).commitBatch = nil
	e.ordinaryCommits = false

	ds, err := q.ClaimDue(ctx, 60e9, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claimed %d: %v", len(ds), err)
	}
	if _, err := q.Finish(ctx, ds[0], work.Success(json.RawMessage(`2`))); err != nil {
		t.Fatal(err)
	}
	got, err := s.TaskByKey(ctx, "a")
	if err != nil || string(got.Input) != `{"n":1}` {
		t.Errorf("task a reads back as %+v, %v", got, err)
	}
	mustVerify(t, q)
}
