package postgres_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// BenchmarkSubmitTxTakenIn measures the latency from an application transaction's COMMIT
// (SubmitTx inside it) to the task being listed, with plain Submits from 8 goroutines as
// load beside it. It reports p50 and p99 in ms (target: p99 <= 100 ms, issue 24 §3). Figures
// taken on a shared machine are not results (docs/performance.md).
func BenchmarkSubmitTxTakenIn(b *testing.B) {
	dsn := pgtest.Schema(b)
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	stop := make(chan struct{})
	loadDone := make(chan struct{})
	go func() { // the load: plain submits
		defer close(loadDone)
		s := q.Session("load")
		for {
			select {
			case <-stop:
				return
			default:
			}
			done := make(chan struct{}, 8)
			for range 8 {
				go func() { s.Submit(ctx, work.TaskRequest{Kind: "load"}); done <- struct{}{} }()
			}
			for range 8 {
				<-done
			}
		}
	}()
	defer func() { close(stop); <-loadDone }()
	s := q.Session("bench")
	lat := make([]time.Duration, 0, b.N)
	last := "" // the session's last task: submission i's task is the first after it
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tx, err := c.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := postgres.SubmitTx(ctx, tx, q, "bench", work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprintf("b-%d", i)}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		for {
			ts, err := s.Tasks(ctx, work.TaskFilter{Limit: 1, After: last})
			if err != nil {
				b.Fatal(err)
			}
			if len(ts) > 0 {
				last = ts[0].ID
				break
			}
			if time.Since(t0) > time.Minute {
				b.Fatal("not taken in within a minute")
			}
			time.Sleep(200 * time.Microsecond)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
