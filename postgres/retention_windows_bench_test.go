package postgres

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// BenchmarkRetentionWindows (issue 24 §5): does the disk stay flat under retention on
// PostgreSQL? Windows of tasks, one simulated hour each, go through a queue (submitted in
// batches, claimed and finished by 4 workers, with an input of 200 bytes and an output);
// after each window everything that became prunable before the window's start is pruned
// (Queue.Prune, as Options.Retention = 1h would). After each window the benchmark waits
// WORKLOG_PG_RETENTION_PAUSE (default 3s) for autovacuum, then logs the size of every table
// of the queue (pg_total_relation_size: heap, indexes, TOAST) and their sum; the last
// window's sum and the largest sum of the second half are reported as MB metrics.
//
// Two variants: params=worklog (the storage parameters Open sets, storage.go) and
// params=server (the same queue with them reset to the server's defaults). On pgtest's
// throwaway server (fsync off) autovacuum_naptime is set to 1s while it runs, so that the
// pauses stand for the hours between a real queue's windows (its naptime is one minute).
// Sizes are not timings: the machine's load does not change them much, but autovacuum runs
// when it gets to, so compare the plateau of the second half, not a single window.
//
//	WORKLOG_PG_RETENTION_WINDOWS=10 WORKLOG_PG_RETENTION_TASKS=20000 \
//	  go test ./postgres -run '^$' -bench RetentionWindows -benchtime 1x -timeout 1h -v
func BenchmarkRetentionWindows(b *testing.B) {
	windows, tasks := envInt("WORKLOG_PG_RETENTION_WINDOWS", 8), envInt("WORKLOG_PG_RETENTION_TASKS", 3_000)
	pause := 3 * time.Second
	if v := os.Getenv("WORKLOG_PG_RETENTION_PAUSE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		pause = d
	}
	srv := pgtest.Need(b)
	dsn := pgtest.Schema(b)
	admin := connect(b, dsn)
	if srv.Throwaway() { // pgtest's own server: make autovacuum look often
		if _, err := admin.Exec(context.Background(), "ALTER SYSTEM SET autovacuum_naptime = '1s'"); err != nil {
			b.Fatal(err)
		}
		if _, err := admin.Exec(context.Background(), "SELECT pg_reload_conf()"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			admin.Exec(context.Background(), "ALTER SYSTEM RESET autovacuum_naptime")
			admin.Exec(context.Background(), "SELECT pg_reload_conf()")
		})
	}
	for range 50 { // the reload is a signal: wait until it took effect
		var nap string
		if err := admin.QueryRow(context.Background(), "SELECT current_setting('autovacuum_naptime')").Scan(&nap); err != nil || nap != "1min" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var av, nap, launchers string
	if err := admin.QueryRow(context.Background(), `SELECT current_setting('autovacuum'), current_setting('autovacuum_naptime'),
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum launcher')::text`).Scan(&av, &nap, &launchers); err != nil {
		b.Fatal(err)
	}
	b.Logf("autovacuum %s, naptime %s, %s launcher", av, nap, launchers)
	for _, params := range []string{"worklog", "server"} {
		b.Run("params="+params, func(b *testing.B) {
			for range b.N {
				retentionWindows(b, admin, pgtest.Schema(b), params == "server", windows, tasks, pause)
			}
		})
	}
}

func retentionWindows(b *testing.B, admin *pgx.Conn, dsn string, serverDefaults bool, windows, tasks int, pause time.Duration) {
	ctx := context.Background()
	e, q := openEngine(b, dsn, nil)
	if serverDefaults {
		var ddl []string
		for table, params := range storageParams {
			var names []string
			for _, p := range params {
				names = append(names, p[:strings.IndexByte(p, '=')])
			}
			ddl = append(ddl, "ALTER TABLE "+pgx.Identifier{e.schema, table}.Sanitize()+" RESET ("+strings.Join(names, ", ")+")")
		}
		if _, err := admin.Exec(ctx, strings.Join(ddl, ";")); err != nil {
			b.Fatal(err)
		}
	}
	input := []byte(`{"payload":"` + strings.Repeat("x", 186) + `"}`)
	t0 := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	var peak int64
	for w := range windows {
		start := t0.Add(time.Duration(w) * time.Hour)
		s := q.Session(fmt.Sprintf("window-%d", w))
		for i := 0; i < tasks; i += work.MaxSubmitMany {
			rs := make([]work.TaskRequest, min(work.MaxSubmitMany, tasks-i))
			for j := range rs {
				rs[j] = work.TaskRequest{Kind: fmt.Sprintf("k%d", (i+j)%4), Input: input}
			}
			if _, err := s.SubmitManyAt(ctx, rs, start); err != nil {
				b.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					ds, err := q.ClaimDueAt(ctx, start.Add(time.Minute), time.Hour, 64)
					if err != nil || len(ds) == 0 {
						errs <- err
						return
					}
					for _, d := range ds {
						if _, err := q.FinishAt(ctx, d, work.Success([]byte(`"done"`)), start.Add(2*time.Minute)); err != nil {
							errs <- err
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		if _, err := q.Prune(ctx, start); err != nil {
			b.Fatal(err)
		}
		time.Sleep(pause)
		sizes, total := tableSizes(b, admin, e.schema)
		var vacuums, dead int64
		if err := admin.QueryRow(ctx, `SELECT coalesce(sum(autovacuum_count), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint
			FROM pg_stat_user_tables WHERE schemaname = $1`, e.schema).Scan(&vacuums, &dead); err != nil {
			b.Fatal(err)
		}
		b.Logf("window %d: %.1f MB, %d autovacuums so far, %d dead rows (%s)", w+1, float64(total)/1e6, vacuums, dead, sizes)
		if w >= windows/2 {
			peak = max(peak, total)
		}
		if w == windows-1 {
			b.ReportMetric(float64(total)/1e6, "MB-last")
			b.ReportMetric(float64(peak)/1e6, "MB-peak-2nd-half")
		}
	}
	if err := q.Verify(ctx); err != nil {
		b.Fatal(err)
	}
}

// tableSizes is every table's pg_total_relation_size in schema (a line of "name size" in
// kB), and their sum in bytes.
func tableSizes(b *testing.B, c *pgx.Conn, schema string) (string, int64) {
	rows, err := c.Query(context.Background(), `SELECT c.relname::text, pg_total_relation_size(c.oid) FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY 2 DESC`, schema)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var parts []string
	var total int64
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			b.Fatal(err)
		}
		total += n
		parts = append(parts, fmt.Sprintf("%s %d", name, n/1024))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return strings.Join(parts, ", ") + " kB", total
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
