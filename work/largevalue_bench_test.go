package work_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// BenchmarkSubmitValueSize: one caller submits tasks with inputs of a given size on a durable
// queue (SyncAlways), then claims and finishes them with an output of the same size: the cost
// of a large value in Pebble (format 3 and below, and format 4 below pebblelog.BlobMin) beside
// the cost of a blob file (format 4 from BlobMin), which is how BlobMin was chosen.
func BenchmarkSubmitValueSize(b *testing.B) {
	for _, size := range []int{64 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			q, err := work.Open(b.TempDir(), &work.Options{MaxValueBytes: 64 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			ctx := context.Background()
			v := randomJSONString(rand.New(rand.NewPCG(1, 1)), size)
			s := q.Session("s")
			b.SetBytes(int64(2 * size))
			b.ResetTimer()
			for range b.N {
				if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: v}); err != nil {
					b.Fatal(err)
				}
				ds, err := q.ClaimDue(ctx, time.Minute, 1)
				if err != nil || len(ds) != 1 {
					b.Fatal(len(ds), err)
				}
				if _, err := q.Finish(ctx, ds[0], work.Success(v)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
