package work_test

import (
	"context"
	"fmt"
	"time"

	"github.com/worklog/worklog/work"
)

// A hand-written worker loop without a sleep: claim what is due, and when nothing is, block
// in WaitTasks until a submit (or a scheduled time, or a lease expiry) may have made a task
// claimable. (The runner package is this loop with heartbeats, retries and a graceful stop.)
func ExampleQueue_WaitTasks() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()

	done := make(chan struct{})
	go func() {
		defer close(done)
		for handled := 0; handled < 2; {
			ds, err := q.ClaimKinds(ctx, []string{"resize"}, time.Minute, 16)
			if err != nil {
				panic(err)
			}
			if len(ds) == 0 {
				if err := q.WaitTasks(ctx, []string{"resize"}); err != nil {
					panic(err) // ctx ended or the queue closed
				}
				continue // a wakeup may be spurious: claim again
			}
			for _, d := range ds {
				fmt.Println("resizing", string(d.Task.Input))
				if _, err := q.Finish(ctx, d, work.Success(nil)); err != nil {
					panic(err)
				}
				handled++
			}
		}
	}()

	s := q.Session("s")
	s.Submit(ctx, work.TaskRequest{Kind: "resize", Input: []byte(`"a.png"`)})
	// Due in 50 ms: the worker's WaitTasks sleeps until then, on a timer.
	s.Submit(ctx, work.TaskRequest{Kind: "resize", Input: []byte(`"b.png"`), RunAt: time.Now().Add(50 * time.Millisecond)})
	<-done
	// Output:
	// resizing "a.png"
	// resizing "b.png"
}
