package work_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// BenchmarkInMemory measures the hot commands on the in-memory queue, where nothing but the
// decide code and the fold's upkeep of its records and indexes costs: a regression in the
// fold's per-event work (an index more to keep) shows here first. Submits spread over 50
// sessions and 4 kinds; submit+claim+finish submits
// one task, claims one and settles it, over a backlog kept at 1000.
func BenchmarkInMemory(b *testing.B) {
	ctx := context.Background()
	kinds := []string{"thumbnail", "email", "report", "index"}
	b.Run("op=submit", func(b *testing.B) {
		b.ReportAllocs()
		q := work.NewInMemory()
		defer q.Close()
		sessions := make([]*work.Session, 50)
		for i := range sessions {
			sessions[i] = q.Session(fmt.Sprintf("session-%03d", i))
		}
		now := time.Unix(1_767_225_600, 0)
		i := 0
		u0 := rusage()
		for b.Loop() {
			r := benchRequest
			r.Kind = kinds[i%len(kinds)]
			if _, err := sessions[i%len(sessions)].SubmitAt(ctx, r, now); err != nil {
				b.Fatal(err)
			}
			i++
		}
		reportCPU(b, u0)
	})
	b.Run("op=submit+claim+finish", func(b *testing.B) {
		b.ReportAllocs()
		q := work.NewInMemory()
		defer q.Close()
		now := time.Unix(1_767_225_600, 0)
		submit := func(i int) {
			r := benchRequest
			r.Kind = kinds[i%len(kinds)]
			if _, err := q.Session(fmt.Sprintf("session-%03d", i%50)).SubmitAt(ctx, r, now); err != nil {
				b.Fatal(err)
			}
		}
		for i := range 1000 {
			submit(i)
		}
		i := 0
		u0 := rusage()
		for b.Loop() {
			submit(i) // keep the backlog
			i++
			ds, err := q.ClaimDueAt(ctx, now, time.Minute, 1)
			if err != nil || len(ds) != 1 {
				b.Fatal(len(ds), err)
			}
			if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), now); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, u0)
	})
}

// reportCPU reports the process's CPU time per op since u0 (steadier than wall time on a
// shared machine).
func reportCPU(b *testing.B, u0 usage) {
	b.ReportMetric(float64(rusage().sub(u0).cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}
