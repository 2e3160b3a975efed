package postgres

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// BenchmarkSubmit measures submits per second at 1 and 16 concurrent callers, with the
// design as built (a failed closure re-runs its group's commands alone: nothing on the
// success path) and with one SAVEPOINT round trip per command, the least a savepoint per
// command costs. The server is pgtest's (fsync off): the figures compare designs, they are
// not bench/'s.
func BenchmarkSubmit(b *testing.B) {
	for _, callers := range []int{1, 16} {
		for _, sp := range []bool{false, true} {
			name := fmt.Sprintf("callers=%d/groups=rerun", callers)
			if sp {
				name = fmt.Sprintf("callers=%d/groups=savepoint", callers)
			}
			b.Run(name, func(b *testing.B) {
				e, q := openEngine(b, pgtest.Schema(b), nil)
				e.savepointEach = sp
				s := q.Session("bench")
				ctx := context.Background()
				b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
				if callers == 1 {
					for i := 0; i < b.N; i++ {
						if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "submits/s")
			})
		}
	}
}
