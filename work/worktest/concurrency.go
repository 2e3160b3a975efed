package worktest

import (
	"sync"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// concurrencyScenarios: calls from many goroutines keep every rule. Goroutines only collect
// results; the checks run on the test goroutine.
func concurrencyScenarios() []scenario {
	return []scenario{
		{"concurrency/claims_never_overlap", concClaims},
		{"concurrency/idempotent_submissions_make_one_task", concSubmits},
		{"concurrency/repeated_finishes_settle_once", concFinishes},
	}
}

const workers = 4

// parallel runs fn(i) for i in [0, workers) at once and waits.
func parallel(fn func(i int)) {
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i)
		}()
	}
	wg.Wait()
}

func concClaims(e *env) {
	const s = "session_conc"
	const tasks = 40
	for i := 0; i < tasks; i++ {
		e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
		e.wake(s, work.WakeRequest{}, at(100))
	}
	var mu sync.Mutex
	var got []work.TaskDelivery
	var gotWakes []work.WakeDelivery
	var errs []error
	parallel(func(int) {
		for {
			ds, err := e.q.ClaimDueAt(e.ctx, at(100), lease, 3)
			ws, werr := e.q.ClaimWakesAt(e.ctx, at(100), lease, 3)
			mu.Lock()
			got = append(got, ds...)
			gotWakes = append(gotWakes, ws...)
			for _, err := range []error{err, werr} {
				if err != nil {
					errs = append(errs, err)
				}
			}
			mu.Unlock()
			if err != nil || werr != nil || len(ds)+len(ws) == 0 {
				return
			}
		}
	})
	for _, err := range errs {
		e.ok("concurrent claim", err)
	}
	ids := map[string]bool{}
	for _, d := range got {
		e.noteToken(d.LeaseToken())
		if ids[d.Task.ID] || d.Attempt != 1 {
			e.t.Errorf("task %s delivered twice (attempt %d)", d.Task.ID, d.Attempt)
		}
		ids[d.Task.ID] = true
	}
	for _, d := range gotWakes {
		e.noteToken(d.LeaseToken())
		if ids[d.Wake.ID] || d.Attempt != 1 {
			e.t.Errorf("wake %s delivered twice (attempt %d)", d.Wake.ID, d.Attempt)
		}
		ids[d.Wake.ID] = true
	}
	if len(got) != tasks || len(gotWakes) != tasks {
		e.t.Fatalf("claimed %d tasks and %d wakes, want %d each", len(got), len(gotWakes), tasks)
	}

	// Settle them all at once.
	errs = nil
	parallel(func(i int) {
		for j := i; j < len(got); j += workers {
			_, err := e.q.FinishAt(e.ctx, got[j], work.Success(nil), at(101))
			aerr := e.q.AckWakeAt(e.ctx, gotWakes[j], at(101))
			mu.Lock()
			for _, err := range []error{err, aerr} {
				if err != nil {
					errs = append(errs, err)
				}
			}
			mu.Unlock()
		}
	})
	for _, err := range errs {
		e.ok("concurrent settle", err)
	}
	e.claimNone(at(1000))
	e.claimWakeNone(at(1000))
}

func concSubmits(e *env) {
	const s = "session_conc_keys"
	req := work.TaskRequest{Kind: "k", Input: js(`{"n":1}`), IdempotencyKey: "same"}
	wreq := work.WakeRequest{Payload: js(`{"n":1}`), IdempotencyKey: "same"}
	n := e.logLen()
	var mu sync.Mutex
	taskIDs, wakeIDs := map[string]bool{}, map[string]bool{}
	var errs []error
	parallel(func(int) {
		for j := 0; j < 5; j++ {
			t, err := e.q.Session(s).SubmitAt(e.ctx, req, at(100+j))
			w, werr := e.q.Session(s).WakeAt(e.ctx, wreq, at(100+j))
			mu.Lock()
			taskIDs[t.ID], wakeIDs[w.ID] = true, true
			for _, err := range []error{err, werr} {
				if err != nil {
					errs = append(errs, err)
				}
			}
			mu.Unlock()
		}
	})
	for _, err := range errs {
		e.ok("concurrent idempotent call", err)
	}
	if len(taskIDs) != 1 || len(wakeIDs) != 1 {
		e.t.Errorf("concurrent idempotent calls made %d tasks and %d wakes, want 1 each", len(taskIDs), len(wakeIDs))
	}
	e.appended("concurrent idempotent calls", n, events.TypeTaskSubmitted, events.TypeWakeRecorded)
}

func concFinishes(e *env) {
	const s = "session_conc_finish"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
	d := e.claimOne(at(100))
	o := work.SuccessWithSummary("once", js(`{"ok":true}`))
	n := e.logLen()
	var mu sync.Mutex
	var errs []error
	var results []work.Task
	parallel(func(int) {
		got, err := e.q.FinishAt(e.ctx, d, o, at(101))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		results = append(results, got)
	})
	for _, err := range errs {
		e.ok("concurrent repeated finish", err)
	}
	for _, got := range results {
		e.sameTask("a concurrent finish", got, results[0])
	}
	e.eqState("task", e.mustTask(s, t.ID).State, work.TaskSucceeded)
	e.appended("concurrent repeated finishes", n, events.TypeTaskSettled, events.TypeWakeRecorded)
}
