package postgres

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// session_wakes came after format 1: Open creates it in a queue made before it and fills it
// from wake_index (the available wakes, each under its record's session); OpenReadOnly
// creates nothing, its Verify still agrees and its per-session scan says the table is
// missing. Claims per session then work on the migrated queue.
func TestSessionWakesTableMigrates(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	admin := connect(t, dsn)
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for i := range 12 {
		s := []string{"s1", "s2", "s"}[i%3]
		w, err := q.Session(s).WakeAt(ctx, work.WakeRequest{}, at(i))
		if err != nil {
			t.Fatal(err)
		}
		want[s] = append(want[s], w.ID)
	}
	// s's wakes: one acknowledged (gone from the index), one leased until 100.
	ds, err := q.ClaimSessionWakesAt(ctx, []string{"s"}, at(20), 80*time.Second, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claim: %v, %d", err, len(ds))
	}
	if err := q.AckWakeAt(ctx, ds[0], at(21)); err != nil {
		t.Fatal(err)
	}
	want["s"] = append(want["s"][2:], ds[1].Wake.ID) // the leased one comes back last
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	if _, err := admin.Exec(ctx, "DROP TABLE session_wakes"); err != nil {
		t.Fatal(err)
	}
	exists := func() bool {
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT to_regclass('session_wakes') IS NOT NULL").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	ro, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatalf("OpenReadOnly of a queue without session_wakes: %v", err)
	}
	if problems, err := ro.Verify(ctx, VerifyOptions{}); err != nil || len(problems) > 0 {
		t.Errorf("read-only Verify of a queue without session_wakes: %v, %q", err, problems)
	}
	err = ro.View(ctx, func(r projection.Reader) error {
		return r.ScanIndex(projection.IndexSessionWakes, "s1", math.MinInt64, math.MaxInt64, func(projection.IndexEntry) bool { return true })
	})
	if !errors.Is(err, errNoSessionWakes) || !strings.Contains(err.Error(), "session_wakes") {
		t.Errorf("a per-session scan without session_wakes: %v, want errNoSessionWakes naming the table", err)
	}
	ro.Close()
	if exists() {
		t.Fatal("OpenReadOnly created session_wakes")
	}

	q, err = Open(ctx, dsn, nil)
	if err != nil {
		t.Fatalf("Open of a queue without session_wakes: %v", err)
	}
	defer q.Close()
	if !exists() {
		t.Fatal("Open did not create session_wakes")
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM session_wakes").Scan(&n); err != nil || n != 11 {
		t.Fatalf("session_wakes holds %d rows (%v), want the 11 unacknowledged wakes", n, err)
	}
	mustVerify(t, q)
	for _, s := range []string{"s1", "s2", "s"} {
		ds, err := q.ClaimSessionWakesAt(ctx, []string{s}, at(100), time.Minute, 100)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range ds {
			got = append(got, d.Wake.ID)
		}
		if strings.Join(got, " ") != strings.Join(want[s], " ") {
			t.Errorf("session %s after the migration: %q, want %q", s, got, want[s])
		}
	}
	mustVerify(t, q)
}

// The claim's scan reads session_wakes through its primary key (session, at, seq): the plan
// has an index scan on session_wakes_pkey and no sequential scan of the table, with 20,000
// entries of 1,000 other sessions in it.
func TestSessionWakesPlan(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	admin := connect(t, dsn)
	if _, err := admin.Exec(ctx, `INSERT INTO session_wakes
		SELECT convert_to('s' || (i % 1000), 'UTF8'), i, i, convert_to('w' || i, 'UTF8') FROM generate_series(1, 20000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "ANALYZE session_wakes"); err != nil {
		t.Fatal(err)
	}
	st := newStatements(schemaName(dsn))
	for _, sql := range []struct {
		name string
		sql  string
		args []any
	}{
		{"first page", st.idx[projection.IndexSessionWakes].scan, []any{int64(math.MaxInt64), 64, []byte("s7")}},
		{"next page", st.idx[projection.IndexSessionWakes].scanFrom, []any{int64(math.MaxInt64), 64, []byte("s7"), int64(7), int64(7)}},
	} {
		rows, err := admin.Query(ctx, "EXPLAIN "+sql.sql, sql.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		rows.Close()
		p := strings.Join(plan, "\n")
		if !strings.Contains(p, "session_wakes_pkey") || strings.Contains(p, "Seq Scan on session_wakes") {
			t.Errorf("%s: the plan does not read session_wakes by its key:\n%s", sql.name, p)
		}
		t.Logf("%s:\n%s", sql.name, p)
	}
}
