package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// BenchmarkSubmitMany (issue 23, "Batch submit"): one op is 10,000 tasks on postgres.Open,
// as one SubmitMany (one transaction; mode=many) or as 10,000 Submits one after another
// from one goroutine (mode=submits). The server is pgtest's (fsync off): the ratio compares
// the two paths, it is not bench/'s figure.
func BenchmarkSubmitMany(b *testing.B) {
	const n = work.MaxSubmitMany
	rs := make([]work.TaskRequest, n)
	for i := range rs {
		rs[i] = work.TaskRequest{Kind: "k", Input: []byte(`{"n":1}`)}
	}
	for _, mode := range []string{"many", "submits"} {
		b.Run("tasks=10000/mode="+mode, func(b *testing.B) {
			_, q := openEngine(b, pgtest.Schema(b), nil)
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s := q.Session(fmt.Sprintf("bench-%d", i))
				if mode == "many" {
					res, err := s.SubmitMany(ctx, rs)
					if err != nil || res[n-1].Err != nil {
						b.Fatal(err)
					}
					continue
				}
				for j := range rs {
					if _, err := s.Submit(ctx, rs[j]); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}
