package work_test

import (
	"context"
	"encoding/json"
	"errors"
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

// Submitting with an idempotency key: repeating the same request returns the same task, in
// its current state; reusing the key for different work is refused.
func ExampleSession_SubmitAt() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	session := q.Session("session_123")

	req := work.TaskRequest{
		Kind:           "export",
		Input:          json.RawMessage(`{"format":"jsonl"}`),
		IdempotencyKey: "export-42",
		RunAt:          now.Add(time.Hour),
	}
	first, _ := session.SubmitAt(ctx, req, now)
	fmt.Println("submitted:", first.State, "due in", first.ScheduledAt.Sub(first.CreatedAt))

	// JSON is compared as a value: whitespace and key order do not matter.
	req.Input = json.RawMessage(`{ "format" : "jsonl" }`)
	again, _ := session.SubmitAt(ctx, req, now.Add(time.Minute))
	fmt.Println("same task:", again.ID == first.ID, string(again.Input))

	req.Input = json.RawMessage(`{"format":"csv"}`)
	_, err := session.SubmitAt(ctx, req, now.Add(2*time.Minute))
	fmt.Println("conflict:", errors.Is(err, work.ErrIdempotencyConflict))
	var we *work.Error
	if errors.As(err, &we) {
		fmt.Println("key:", we.Key, "field:", we.Field)
	}
	// Output:
	// submitted: pending due in 1h0m0s
	// same task: true {"format":"jsonl"}
	// conflict: true
	// key: export-42 field: input
}

// Delivery is at least once: a worker that does not settle before its lease expires loses
// the task to the next claim, with a new attempt and token, and can no longer settle it.
func ExampleQueue_ClaimDueAt() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const lease = 30 * time.Second

	q.Session("session_123").SubmitAt(ctx, work.TaskRequest{Kind: "retryable"}, now)

	first, _ := q.ClaimDueAt(ctx, now, lease, 10)
	fmt.Println("claimed attempt", first[0].Attempt, "until", first[0].LeaseExpiresAt.Format(time.TimeOnly))

	early, _ := q.ClaimDueAt(ctx, now.Add(lease-time.Second), lease, 10)
	fmt.Println("claimed before the lease expired:", len(early))

	second, _ := q.ClaimDueAt(ctx, now.Add(lease), lease, 10)
	fmt.Println("claimed attempt", second[0].Attempt, "of the same task:", second[0].Task.ID == first[0].Task.ID)

	_, err := q.FinishAt(ctx, first[0], work.Success(nil), now.Add(lease))
	fmt.Println("stale worker:", errors.Is(err, work.ErrStaleDelivery))

	done, _ := q.FinishAt(ctx, second[0], work.Success(json.RawMessage(`{"attempt":2}`)), now.Add(lease+time.Second))
	fmt.Println("finished:", done.State, "after", done.Attempts, "attempts")
	// Output:
	// claimed attempt 1 until 12:00:30
	// claimed before the lease expired: 0
	// claimed attempt 2 of the same task: true
	// stale worker: true
	// finished: succeeded after 2 attempts
}

// Cancellation is immediate for pending work and cooperative for running work: the request
// is recorded, the worker sees it, stops, and settles with Cancellation.
func ExampleSession_CancelAt() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	session := q.Session("session_123")

	later, _ := session.SubmitAt(ctx, work.TaskRequest{Kind: "digest", RunAt: now.Add(time.Hour)}, now)
	canceled, _ := session.CancelAt(ctx, later.ID, now)
	fmt.Println("pending task:", canceled.State)

	running, _ := session.SubmitAt(ctx, work.TaskRequest{Kind: "render", Wake: work.WakeOnCompletion}, now)
	ds, _ := q.ClaimDueAt(ctx, now, time.Minute, 10)
	requested, _ := session.CancelAt(ctx, running.ID, now.Add(time.Second))
	fmt.Println("running task:", requested.State, "cancel requested:", !requested.CancelRequestedAt.IsZero())

	// The worker checks for the request (here: reading the task) and stops.
	t, _, _ := session.Task(ctx, ds[0].Task.ID)
	if !t.CancelRequestedAt.IsZero() {
		done, _ := q.FinishAt(ctx, ds[0], work.Cancellation(), now.Add(2*time.Second))
		fmt.Println("worker stopped:", done.State)
	}

	wakes, _ := q.ClaimWakesAt(ctx, now.Add(2*time.Second), time.Minute, 10)
	fmt.Println("wake:", wakes[0].Wake.Reason.Kind, wakes[0].Wake.Reason.State)
	// Output:
	// pending task: canceled
	// running task: running cancel requested: true
	// worker stopped: canceled
	// wake: task_finished canceled
}

// A direct wake is claimable at once and redelivered after its lease expires until it is
// acknowledged; an acknowledgment by a superseded delivery is refused.
func ExampleQueue_AckWakeAt() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const lease = 30 * time.Second

	q.Session("session_123").WakeAt(ctx, work.WakeRequest{
		Payload:        json.RawMessage(`{"reason":"refresh"}`),
		IdempotencyKey: "refresh-1",
	}, now)

	first, _ := q.ClaimWakesAt(ctx, now, lease, 10)
	fmt.Println("wake:", first[0].Wake.Reason.Kind, string(first[0].Wake.Reason.Payload))

	retry, _ := q.ClaimWakesAt(ctx, now.Add(lease), lease, 10)
	fmt.Println("redelivered, attempt", retry[0].Attempt)

	err := q.AckWakeAt(ctx, first[0], now.Add(lease))
	fmt.Println("first delivery:", errors.Is(err, work.ErrStaleDelivery))
	fmt.Println("ack:", q.AckWakeAt(ctx, retry[0], now.Add(lease)))
	fmt.Println("ack again:", q.AckWakeAt(ctx, retry[0], now.Add(lease)))

	left, _ := q.ClaimWakesAt(ctx, now.Add(time.Hour), lease, 10)
	fmt.Println("wakes left:", len(left))
	// Output:
	// wake: requested {"reason":"refresh"}
	// redelivered, attempt 2
	// first delivery: true
	// ack: <nil>
	// ack again: <nil>
	// wakes left: 0
}
