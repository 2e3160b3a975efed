package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// Submitting inside the application's transaction, on the PostgreSQL server BENCH_PG_DSN
// names (run.sh's, or any): worklog's postgres.SubmitTx beside River's InsertTx.
//
//	BENCH_PG_DSN=postgres://... go test -run '^$' -bench 'InsertTx|SubmitTxClaimable' -benchtime 2000x .

// benchDB creates a fresh database on BENCH_PG_DSN's server and returns its DSN; it is dropped
// at the end of the benchmark.
func benchDB(b *testing.B) string {
	b.Helper()
	dsn := os.Getenv("BENCH_PG_DSN")
	if dsn == "" {
		b.Skip("no BENCH_PG_DSN (run.sh sets it)")
	}
	ctx := context.Background()
	name := fmt.Sprintf("bench_tx_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	admin.Close(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		admin, err := pgx.Connect(ctx, dsn)
		if err == nil {
			admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			admin.Close(ctx)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		b.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// appPool is the application's pool on dsn, with its one-row table.
func appPool(b *testing.B, dsn string, conns int) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), "CREATE TABLE app_orders (id bigint PRIMARY KEY, body bytea NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	return pool
}

// txArgs is River's job without uniqueness, as a keyless SubmitTx.
type txArgs struct {
	Input json.RawMessage `json:"input"`
}

func (txArgs) Kind() string { return "bench" }

// BenchmarkInsertTx: one application transaction per op — BEGIN, the INSERT of one row of
// the application's, worklog's postgres.SubmitTx or River's InsertTx (no key, no uniqueness),
// COMMIT — from 1 and 16 goroutines, each on its own connection of the application's pool.
// The figure is ops/s (an op: the whole transaction, COMMIT included).
func BenchmarkInsertTx(b *testing.B) {
	for _, sys := range []string{"worklog-submittx", "river-inserttx"} {
		for _, g := range []int{1, 16} {
			b.Run(fmt.Sprintf("system=%s/goroutines=%d", sys, g), func(b *testing.B) {
				dsn := benchDB(b)
				ctx := context.Background()
				pool := appPool(b, dsn, g+2)
				var insert func(ctx context.Context, tx pgx.Tx, i int) error
				switch sys {
				case "worklog-submittx":
					q, err := postgres.Open(ctx, dsn, &postgres.Options{MaxConns: 4})
					if err != nil {
						b.Fatal(err)
					}
					defer q.Close()
					insert = func(ctx context.Context, tx pgx.Tx, i int) error {
						_, err := postgres.SubmitTx(ctx, tx, q, "bench", work.TaskRequest{Kind: "bench", Input: input(i)})
						return err
					}
				case "river-inserttx":
					driver := riverpgxv5.New(pool)
					m, err := rivermigrate.New(driver, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
						b.Fatal(err)
					}
					client, err := river.NewClient(driver, &river.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
					if err != nil {
						b.Fatal(err)
					}
					insert = func(ctx context.Context, tx pgx.Tx, i int) error {
						_, err := client.InsertTx(ctx, tx, txArgs{Input: input(i)}, nil)
						return err
					}
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, g)
				b.ResetTimer()
				start := time.Now()
				for range g {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := int(next.Add(1)) - 1
							if i >= b.N {
								return
							}
							err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
								if _, err := tx.Exec(ctx, "INSERT INTO app_orders VALUES ($1, $2)", i, input(i)); err != nil {
									return err
								}
								return insert(ctx, tx, i)
							})
							if err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				select {
				case err := <-errs:
					b.Fatal(err)
				default:
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
			})
		}
	}
}

// BenchmarkSubmitTxClaimable: commit-to-claimable latency under W2's load. A runner with 16
// slots works through a backlog of do-nothing tasks on one queue, kept between 3,000 and
// 3,100 by a feeder's SubmitMany of 100 (a group as long as the runner's: a fill of 2,000
// held the log head 60–200 ms, and every claim queued behind it); on another queue of the
// same schema (another process's), each op commits a one-row application transaction with a
// SubmitTx of kind probe, then claims probe tasks (ClaimKinds) until it gets that one: the
// time from COMMIT's return to the claim's, p50-ms and p99-ms. Each op also times the same
// for a task submitted by Submit (from Submit's return, the task in the log): submit-p50-ms
// and submit-p99-ms, the floor a claim has under this load (it waits for the log head like
// every write), against which SubmitTx's figures are read.
func BenchmarkSubmitTxClaimable(b *testing.B) {
	dsn := benchDB(b)
	ctx := context.Background()
	u, _ := url.Parse(dsn)
	qs := u.Query()
	qs.Set("search_path", "worklog")
	u.RawQuery = qs.Encode()
	qdsn := u.String()
	pool := appPool(b, dsn, 4)
	load, err := postgres.Open(ctx, qdsn, &postgres.Options{MaxConns: 18})
	if err != nil {
		b.Fatal(err)
	}
	defer load.Close()
	probe, err := postgres.Open(ctx, qdsn, &postgres.Options{MaxConns: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer probe.Close()
	// W2's load: 16 slots on a backlog of 3,000 to 3,100 tasks.
	fill := func(n int) error {
		rs := make([]work.TaskRequest, n)
		for i := range rs {
			rs[i] = work.TaskRequest{Kind: "bench", Input: input(i)}
		}
		_, err := load.Session("load").SubmitMany(ctx, rs)
		return err
	}
	if err := fill(3000); err != nil {
		b.Fatal(err)
	}
	var done atomic.Int64
	r, err := runner.New(load, runner.Config{
		Handlers: map[string]runner.Handler{"bench": func(context.Context, work.Task) (json.RawMessage, error) {
			done.Add(1)
			return nil, nil
		}},
		Concurrency: 16, Prefetch: 16, LeaseFor: 10 * time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	feeder := make(chan error, 1)
	go func() {
		filled := int64(3000)
		for {
			select {
			case <-stop:
				feeder <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
			for filled-done.Load() < 3000 {
				if err := fill(100); err != nil {
					feeder <- err
					return
				}
				filled += 100
			}
		}
	}()
	// claimed claims probe tasks until it gets id, and returns the time since from.
	claimed := func(id string, from time.Time) time.Duration {
		for {
			ds, err := probe.ClaimKinds(ctx, []string{"probe"}, time.Minute, 4)
			if err != nil {
				b.Fatal(err)
			}
			took := time.Since(from)
			got := false
			for _, d := range ds { // outside the timing
				got = got || d.Task.ID == id
				if _, err := probe.Finish(ctx, d, work.Outcome{State: work.TaskSucceeded}); err != nil {
					b.Fatal(err)
				}
			}
			if got {
				return took
			}
		}
	}
	lat := make([]time.Duration, 0, b.N)
	plain := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var task work.Task
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO app_orders VALUES ($1, $2)", i, input(i)); err != nil {
				return err
			}
			var err error
			task, err = postgres.SubmitTx(ctx, tx, probe, "probe", work.TaskRequest{Kind: "probe", Input: input(i)})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, claimed(task.ID, time.Now()))
		task, err = probe.Session("probe").Submit(ctx, work.TaskRequest{Kind: "probe", Input: input(i)})
		if err != nil {
			b.Fatal(err)
		}
		plain = append(plain, claimed(task.ID, time.Now()))
	}
	b.StopTimer()
	close(stop)
	if err := <-feeder; err != nil {
		b.Fatal(err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r.Stop(stopCtx)
	slices.Sort(lat)
	slices.Sort(plain)
	ms := func(lat []time.Duration, p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(ms(lat, 0.50), "p50-ms")
	b.ReportMetric(ms(lat, 0.99), "p99-ms")
	b.ReportMetric(ms(plain, 0.50), "submit-p50-ms")
	b.ReportMetric(ms(plain, 0.99), "submit-p99-ms")
	b.ReportMetric(float64(done.Load())/b.Elapsed().Seconds(), "w2-tasks/s")
}
