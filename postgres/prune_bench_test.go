package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
)

// BenchmarkPrune: one Prune of 512 finished tasks (two groups of 256), each with an
// idempotency key, by another queue than the one that finished them (its writer's cache
// holds none of them, as after a restart or in another process); the setup is not timed.
// Reports the cost per pruned task.
func BenchmarkPrune(b *testing.B) {
	const n = 512
	ctx := context.Background()
	dsn := pgtest.Schema(b)
	q := openQueue(b, dsn)
	pruner := openQueue(b, dsn)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		finishOld(b, q, "s", "k", n)
		b.StartTimer()
		res, err := pruner.Prune(ctx, pruneBase.Add(time.Hour))
		if err != nil || res.Tasks != n {
			b.Fatalf("Prune: %+v, %v", res, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/task")
}
