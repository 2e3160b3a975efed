package work_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// BenchmarkHeadOfLine is issue 48's head-of-line scenario on the in-memory queue, in claims:
// one session submits `big` tasks, then 100 sessions submit one each; a runner with 16 slots
// claims as many as it has free (ClaimDueAt), and each round finishes its oldest running
// task. The metric is claims/op: how many tasks were claimed before every small session's
// task had started. The target with FairSessions is at most 100 + 16
// (docs/projection.md §4.8); claims take part 1's order today, fair or not, so both give
// the whole backlog plus the small tasks. One op is one whole scenario.
func BenchmarkHeadOfLine(b *testing.B) {
	const big, small, slots = 100_000, 100, 16
	for _, fair := range []bool{false, true} {
		b.Run(fmt.Sprintf("fair=%v", fair), func(b *testing.B) {
			var claims int
			for range b.N {
				claims = headOfLineClaims(b, fair, big, small, slots)
			}
			b.ReportMetric(float64(claims), "claims/op")
		})
	}
}

func headOfLineClaims(b *testing.B, fair bool, big, small, slots int) int {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	now := time.Unix(1_700_000_000, 0)
	if err := q.SetKindPolicyAt(ctx, "k", work.KindPolicy{FairSessions: fair}, now); err != nil {
		b.Fatal(err)
	}
	reqs := make([]work.TaskRequest, 1000)
	for i := range reqs {
		reqs[i] = work.TaskRequest{Kind: "k"}
	}
	for done := 0; done < big; done += len(reqs) {
		if _, err := q.Session("big").SubmitManyAt(ctx, reqs, now); err != nil {
			b.Fatal(err)
		}
	}
	now = now.Add(time.Second)
	for s := range small {
		if _, err := q.Session(fmt.Sprintf("small-%03d", s)).SubmitManyAt(ctx, reqs[:1], now); err != nil {
			b.Fatal(err)
		}
	}
	var running []work.TaskDelivery
	claims, started := 0, 0
	for started < small {
		now = now.Add(time.Millisecond)
		if len(running) == slots {
			if _, err := q.FinishAt(ctx, running[0], work.Success(nil), now); err != nil {
				b.Fatal(err)
			}
			running = running[1:]
		}
		ds, err := q.ClaimDueAt(ctx, now, time.Hour, slots-len(running))
		if err != nil {
			b.Fatal(err)
		}
		if len(ds) == 0 {
			b.Fatalf("nothing claimed with %d of %d small tasks started", started, small)
		}
		for _, d := range ds {
			claims++
			if d.Task.SessionID != "big" {
				started++
			}
		}
		running = append(running, ds...)
	}
	return claims
}
