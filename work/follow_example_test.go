package work_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// Shipping the log somewhere else (an audit store, a read model, a webhook): Follow hands out
// the history first, then each new event once it is durable, in sequence order, exactly
// once. Store the last sequence shipped and pass it plus one as from after a restart. The
// follower here stops itself after five events; a real one runs until its ctx ends.
func ExampleQueue_Follow() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	s := q.Session("s")
	s.Submit(ctx, work.TaskRequest{Kind: "resize", Input: []byte(`"a.png"`)}) // history: seq 1

	caughtUp := make(chan struct{})
	enough := errors.New("enough")
	done := make(chan error, 1)
	go func() {
		done <- q.Follow(ctx, 1, func(ev events.Event) error {
			fmt.Println(ev.Head().Seq, ev.Type())
			if ev.Head().Seq == 1 {
				close(caughtUp)
			}
			if ev.Head().Seq == 5 {
				return enough // Follow returns fn's error as is
			}
			return nil
		})
	}()

	<-caughtUp // live from here on
	ds, _ := q.ClaimDue(ctx, time.Minute, 1)
	q.Finish(ctx, ds[0], work.Success(nil))
	s.Wake(ctx, work.WakeRequest{})
	s.Submit(ctx, work.TaskRequest{Kind: "resize", Input: []byte(`"b.png"`)})
	fmt.Println(<-done == enough)
	// Output:
	// 1 task_submitted
	// 2 task_claimed
	// 3 task_settled
	// 4 wake_recorded
	// 5 task_submitted
	// true
}
