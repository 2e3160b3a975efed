package work_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/worklog/worklog/work"
)

// The main flow: a session submits work, a worker claims and finishes it, and the session is
// woken by the completion wake, which it acknowledges.
func Example() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

	session := q.Session("session_123")
	task, _ := session.SubmitAt(ctx, work.TaskRequest{
		Kind:           "thumbnail",
		Input:          json.RawMessage(`{"image":"cover.png"}`),
		IdempotencyKey: "thumbnail:cover.png",
		Wake:           work.WakeOnCompletion,
	}, now)
	fmt.Println("submitted:", task.Kind, task.State)

	deliveries, _ := q.ClaimDueAt(ctx, now, time.Minute, 10)
	d := deliveries[0]
	fmt.Println("claimed attempt", d.Attempt, "of", d.Task.Kind)

	done, _ := q.FinishAt(ctx, d, work.Success(json.RawMessage(`{"thumb":"cover-64.png"}`)), now.Add(time.Second))
	fmt.Println("finished:", done.State, string(done.Outcome.Output))

	wakes, _ := q.ClaimWakesAt(ctx, now.Add(time.Second), time.Minute, 10)
	w := wakes[0]
	fmt.Println("wake:", w.Wake.Reason.Kind, w.Wake.Reason.State, w.Wake.SessionID)
	fmt.Println("ack:", q.AckWakeAt(ctx, w, now.Add(2*time.Second)))

	again, _ := q.ClaimWakesAt(ctx, now.Add(time.Hour), time.Minute, 10)
	fmt.Println("wakes left:", len(again))
	fmt.Println("verify:", q.Verify(ctx))
	// Output:
	// submitted: thumbnail pending
	// claimed attempt 1 of thumbnail
	// finished: succeeded {"thumb":"cover-64.png"}
	// wake: task_finished succeeded session_123
	// ack: <nil>
	// wakes left: 0
	// verify: <nil>
}
