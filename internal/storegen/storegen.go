// Package storegen builds stores of a given size through the public work API, for the tests
// and benchmarks that read the past at scale (issue 49): verify, the state at a past seq,
// Follow's catch-up. A store of n tasks holds about 3.1n events: every task is submitted,
// claimed and settled (one in ten fails, one in twenty is left running, one in twenty stays
// pending), and one task in four wakes its session on completion. The work is done in rounds
// of Round tasks so that any past seq shows a mix of states, as a real queue would.
//
// The clock is the caller's: the store's events are stamped from Options.Start on, one
// millisecond a round, so two stores built with the same options hold the same log up to
// its random ids.
package storegen

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/worklog/worklog/work"
)

// Options shape a generated store. The zero value is usable.
type Options struct {
	// Sessions is how many sessions the tasks are spread over (default: one per 150 tasks,
	// at least one).
	Sessions int
	// Round is how many tasks are submitted, then claimed and settled, at a time (default 1000).
	Round int
	// Start is the time of the first event (default 2026-06-01T00:00:00Z).
	Start time.Time
}

// Result says what Build appended.
type Result struct {
	Tasks    int // tasks submitted
	Settled  int // tasks settled (succeeded or failed)
	LastTime time.Time
}

// Build appends n tasks and their lives to q.
func Build(ctx context.Context, q *work.Queue, n int, o Options) (Result, error) {
	if n < 0 {
		return Result{}, fmt.Errorf("storegen: n is %d, want at least 0", n)
	}
	if o.Sessions <= 0 {
		o.Sessions = max(1, n/150)
	}
	if o.Round <= 0 {
		o.Round = 1000
	}
	if o.Start.IsZero() {
		o.Start = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	}
	const leaseFor = 10 * time.Minute
	var res Result
	now := o.Start
	reqs := make([]work.TaskRequest, 0, o.Round)
	for done := 0; done < n; {
		m := min(o.Round, n-done)
		// One SubmitMany per session touched by this round, in task order.
		reqs = reqs[:0]
		sess := sessionOf(done, o.Sessions)
		for i := done; i < done+m; i++ {
			if s := sessionOf(i, o.Sessions); s != sess {
				if err := submit(ctx, q, sess, reqs, now); err != nil {
					return res, err
				}
				reqs, sess = reqs[:0], s
			}
			reqs = append(reqs, request(i))
		}
		if err := submit(ctx, q, sess, reqs, now); err != nil {
			return res, err
		}
		now = now.Add(time.Millisecond)
		// Claim what is due, then settle it; a few tasks stay running or pending.
		left := m - m/20 // one in twenty stays pending until a later round claims it
		for left > 0 {
			ds, err := q.ClaimDueAt(ctx, now, leaseFor, min(left, 500))
			if err != nil {
				return res, err
			}
			if len(ds) == 0 {
				break
			}
			left -= len(ds)
			settles := make([]work.Settle, 0, len(ds))
			for _, d := range ds {
				k := taskNumber(d)
				switch {
				case k%20 == 7:
					continue // left running: its lease is still held at the end
				case k%10 == 3:
					o := work.Failure("flaky upstream " + strconv.Itoa(k))
					settles = append(settles, work.Settle{Delivery: d, Outcome: &o})
				default:
					o := work.Success(json.RawMessage(`{"ok":true,"n":` + strconv.Itoa(k) + `}`))
					settles = append(settles, work.Settle{Delivery: d, Outcome: &o})
				}
			}
			rs, _, err := q.SettleAndClaimAt(ctx, settles, nil, now, leaseFor, 0)
			if err != nil {
				return res, err
			}
			for _, r := range rs {
				if r.Err != nil {
					return res, fmt.Errorf("storegen: settle of %s: %w", r.Task.ID, r.Err)
				}
			}
			res.Settled += len(rs)
			now = now.Add(time.Millisecond)
		}
		done += m
		res.Tasks = done
	}
	res.LastTime = now
	return res, nil
}

func submit(ctx context.Context, q *work.Queue, session int, reqs []work.TaskRequest, now time.Time) error {
	if len(reqs) == 0 {
		return nil
	}
	rs, err := q.Session(SessionID(session)).SubmitManyAt(ctx, reqs, now)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.Err != nil {
			return fmt.Errorf("storegen: submit: %w", r.Err)
		}
	}
	return nil
}

// sessionOf spreads consecutive tasks over sessions in runs of 50, so a SubmitMany carries
// up to 50 tasks and every session holds tasks of the whole log's span.
func sessionOf(i, sessions int) int { return (i / 50) % sessions }

// SessionID is the id of the generated session number i.
func SessionID(i int) string { return fmt.Sprintf("sess-%05d", i) }

func request(i int) work.TaskRequest {
	r := work.TaskRequest{
		Kind:  fmt.Sprintf("kind-%d", i%7),
		Input: json.RawMessage(`{"n":` + strconv.Itoa(i) + `,"payload":"abcdefghijklmnopqrstuvwxyz"}`),
	}
	if i%4 == 0 {
		r.Wake = work.WakeOnCompletion
	}
	return r
}

// taskNumber is the i a task was generated from, read back from its input.
func taskNumber(d work.TaskDelivery) int {
	var in struct{ N int }
	_ = json.Unmarshal(d.Task.Input, &in)
	return in.N
}
