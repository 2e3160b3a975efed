package postgres

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// This file compiles on its own at c55a183 too (it needs only fast_test.go's tripCounter), to
// measure the base: git show pgkey24:postgres/keyfast_bench_test.go > postgres/keyfast_bench_test.go

// unpreparedTrips is tripCounter without the prepares (a statement is prepared once on each
// pooled connection, and which connection a read-first's statement gets is the pool's
// choice) and without the inbox's poll (SubmitTx's, on its own timer).
type unpreparedTrips struct{ tripCounter }

func (c *unpreparedTrips) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	if tr, _ := ctx.Value(traceKey{}).(traced); inboxCheck(tr.sql) { // not the head's reads, which check the inbox too
		return
	}
	c.tripCounter.TraceQueryEnd(ctx, conn, d)
}

func (c *unpreparedTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}
func (c *unpreparedTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// openCountedUnprepared is openCounted with unpreparedTrips.
func openCountedUnprepared(t testing.TB, dsn string) (*engine, *work.Queue, *tripCounter) {
	tc := &unpreparedTrips{}
	testConfigHook = func(c *pgxpool.Config) { c.ConnConfig.Tracer = tc }
	defer func() { testConfigHook = nil }()
	e, q := openEngine(t, dsn, nil)
	return e, q, &tc.tripCounter
}

// BenchmarkKeyedSubmit is bench/'s W1 on postgres.Open: new keyed submits from 1 and 16
// goroutines, with the round trips of the queue's connections per submit (trips/op, a count:
// 2 before a new key was taken unread, at 1 goroutine). pgtest's server (fsync off).
func BenchmarkKeyedSubmit(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			_, q, tc := openCountedUnprepared(b, pgtest.Schema(b))
			s := q.Session("bench")
			ctx := context.Background()
			var next atomic.Int64
			submit := func() error {
				_, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(`{"n":1}`), IdempotencyKey: fmt.Sprint("key-", next.Add(1))})
				return err
			}
			for range 3 { // warm: the cache exact and alone, the statements prepared
				if err := submit(); err != nil {
					b.Fatal(err)
				}
			}
			tc.n.Store(0)
			b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			if callers == 1 {
				for i := 0; i < b.N; i++ {
					if err := submit(); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := submit(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(tc.n.Load())/float64(b.N), "trips/op")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "submits/s")
		})
	}
}
