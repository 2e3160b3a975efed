package work_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/worklog/worklog/work"
)

// BenchmarkSubmitMany (issue 23, "Batch submit": 10,000 tasks at least 20× faster than
// 10,000 Submits from one goroutine): one op is 10,000 tasks on a durable queue (default
// SyncAlways), submitted as one SubmitMany (mode=many) or as 10,000 Submits one after
// another from one goroutine (mode=submits). tasks/s is the figure to compare; the ratio of
// the two is the target.
func BenchmarkSubmitMany(b *testing.B) {
	const n = work.MaxSubmitMany
	rs := make([]work.TaskRequest, n)
	for i := range rs {
		rs[i] = benchRequest
	}
	for _, mode := range []string{"many", "submits"} {
		b.Run("tasks=10000/mode="+mode, func(b *testing.B) {
			q, err := work.Open(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
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
