package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// Verify reports damage to any stored table: a gap in the log, an event that does not
// decode, a record, an index entry, a session list entry or a count that the fold of the
// log does not give, and a log head that is not the last event.
func TestVerifyFindsDamage(t *testing.T) {
	cases := []struct {
		name, sql, want string
	}{
		{"gap in the log", "DELETE FROM events WHERE seq = 2", "sequence 2 missing"},
		{"event that does not decode", "UPDATE events SET body = '\\x00'::bytea WHERE seq = 3", "events row 3"},
		{"task record", "UPDATE tasks SET rec = (SELECT rec FROM tasks ORDER BY id DESC LIMIT 1) " +
			"WHERE id = (SELECT id FROM tasks ORDER BY id LIMIT 1)", "tasks row"},
		{"due index", "DELETE FROM due WHERE seq = 1", "due index"},
		{"per-kind due index", "DELETE FROM kind_due WHERE seq = 1", "due index of kind"},
		{"session list", "DELETE FROM session_tasks WHERE submit_seq = 2", "session"},
		{"count", "UPDATE counts SET n = n + 1", "count of kind"},
		{"log head", "UPDATE log_head SET seq = seq + 1", "last_seq"},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dsn := pgtest.Schema(t)
			q, err := Open(ctx, dsn, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			now := time.Unix(1000, 0)
			for _, k := range []string{"a", "b", "a"} {
				if _, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: k}, now); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := q.ClaimDueAt(ctx, now, time.Minute, 1); err != nil {
				t.Fatal(err)
			}
			if err := q.Verify(ctx); err != nil {
				t.Fatalf("before the damage: %v", err)
			}
			execSQL(t, "SET search_path = "+schemaName(dsn)+"; "+c.sql+"; RESET search_path")
			err = q.Verify(ctx)
			var ve *work.VerifyError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Verify after damaging the %s = %v, want a problem naming %q", c.name, err, c.want)
			}
		})
	}
}

// Verify of a pruned database: the fold of the retained events, continued across the pruned
// gaps (a pruned tail included), equals the stored tables; a gap no pruned range explains, a
// stored event inside a pruned range, a range after the log head, touching ranges and a
// wrong retention index are each reported.
func TestVerifyOfAPrunedDatabase(t *testing.T) {
	cases := []struct {
		name, sql, want string
	}{
		{"unexplained gap", "DELETE FROM events WHERE seq = 4", "sequence 4 missing"},
		{"pruned range after the log head", "INSERT INTO pruned VALUES (100, 200)", "ends after the log head"},
		{"stored event in a pruned range", "INSERT INTO pruned VALUES (9, 9)", "in a pruned range"},
		{"touching pruned ranges", "INSERT INTO pruned VALUES (4, 4)", "touches"},
		{"retention index", "DELETE FROM prunable", "retention index"},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dsn := pgtest.Schema(t)
			q, err := Open(ctx, dsn, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			s := q.Session("s")
			done := func(at int64) { // submit, claim, finish: three events
				t.Helper()
				if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k"}, time.Unix(at, 0)); err != nil {
					t.Fatal(err)
				}
				ds, err := q.ClaimDueAt(ctx, time.Unix(at, 0), time.Minute, 1)
				if err != nil || len(ds) != 1 {
					t.Fatalf("claim: %d, %v", len(ds), err)
				}
				if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), time.Unix(at+1, 0)); err != nil {
					t.Fatal(err)
				}
			}
			done(1000) // 1-3
			if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k", RunAt: time.Unix(1e9, 0)}, time.Unix(1000, 0)); err != nil {
				t.Fatal(err) // 4: kept
			}
			done(1001) // 5-7: the log's tail
			if res, err := q.Prune(ctx, time.Unix(1500, 0)); err != nil || res.Events != 6 {
				t.Fatalf("Prune: %+v, %v", res, err)
			}
			if err := q.Verify(ctx); err != nil {
				t.Fatalf("after a prune of the log's tail: %v", err)
			}
			done(2000) // 8-10: prunable, not pruned
			if err := q.Verify(ctx); err != nil {
				t.Fatalf("before the damage: %v", err)
			}
			execSQL(t, "SET search_path = "+schemaName(dsn)+"; "+c.sql+"; RESET search_path")
			err = q.Verify(ctx)
			var ve *work.VerifyError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Verify after damaging the %s = %v, want a problem naming %q", c.name, err, c.want)
			}
		})
	}
}
