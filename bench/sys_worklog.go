package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

const worklogSession = "bench-session"

type worklogQueue struct {
	dir  string
	opts *work.Options
	q    *work.Queue
	s    *work.Session
	pool string // "runner", "runner-noprefetch", "dispatch" or "each"

	// reopen opens the queue again for the check (nil: work.Open(dir, opts)); done runs
	// after it (dropping a PostgreSQL row's database).
	reopen func(context.Context) (*work.Queue, error)
	done   func(context.Context) error
}

func openWorklog(mode work.SyncMode) func(context.Context, string, childConfig) (queue, error) {
	return func(_ context.Context, dir string, cfg childConfig) (queue, error) {
		var opts *work.Options // the default: work.Open(dir, nil), synced
		if mode != work.SyncAlways {
			opts = &work.Options{Sync: mode}
		}
		q, err := work.Open(dir, opts)
		if err != nil {
			return nil, err
		}
		return &worklogQueue{dir: dir, opts: opts, q: q, s: q.Session(worklogSession), pool: cfg.WorklogPool}, nil
	}
}

func (w *worklogQueue) request(key string, input []byte) work.TaskRequest {
	return work.TaskRequest{Kind: "bench", Input: input, IdempotencyKey: key}
}

func (w *worklogQueue) Enqueue(ctx context.Context, key string, input []byte) (string, error) {
	t, err := w.s.Submit(ctx, w.request(key, input))
	return t.ID, err
}

func (w *worklogQueue) Keys() bool { return true }

func (w *worklogQueue) Duplicate(ctx context.Context, key string, input []byte) (string, error) {
	t, err := w.s.Submit(ctx, w.request(key, input))
	if err == nil && t.State != work.TaskSucceeded {
		return "", fmt.Errorf("duplicate returned task %s in state %s, want the completed task", t.ID, t.State)
	}
	return t.ID, err
}

// Work runs the W2 pool in the shape -worklog-pool chose.
func (w *worklogQueue) Work(ctx context.Context, total, workers int) error {
	switch w.pool {
	case "each":
		return w.workEach(ctx, total, workers)
	case "dispatch":
		return w.workDispatch(ctx, total, workers)
	}
	prefetch := workers
	if w.pool == "runner-noprefetch" {
		prefetch = 0
	}
	return w.workRunner(ctx, total, workers, prefetch)
}

// countingHooks counts the tasks the runner recorded as succeeded (TaskEnd comes after the
// SettleAndClaim that recorded the result returned, that is once it is durable), and
// reports the first task that ended otherwise.
type countingHooks struct {
	runner.NoHooks
	total     int64
	succeeded atomic.Int64
	done      chan struct{} // closed when total succeeded
	failed    chan error    // cap 1
}

func (h *countingHooks) TaskEnd(_ context.Context, d work.TaskDelivery, r runner.TaskResult) {
	if r.Result != runner.Succeeded || r.SettleErr != nil {
		select {
		case h.failed <- fmt.Errorf("task %s: %v (handler error %v, settle error %v)", d.Task.ID, r.Result, r.Err, r.SettleErr):
		default:
		}
		return
	}
	if h.succeeded.Add(1) == h.total {
		close(h.done)
	}
}

// workRunner is W2 through the runner package, as River's rows go through River's client:
// a runner with `workers` handler slots (River's MaxWorkers) and a handler that does
// nothing; its dispatcher settles the finished deliveries and claims the next tasks in one
// SettleAndClaim per round, holding up to `prefetch` claimed tasks beyond the slots
// (Config.Prefetch). The clock stops when the last result is recorded (durable).
func (w *worklogQueue) workRunner(ctx context.Context, total, workers, prefetch int) error {
	hooks := &countingHooks{total: int64(total), done: make(chan struct{}), failed: make(chan error, 1)}
	r, err := runner.New(w.q, runner.Config{
		Handlers:    map[string]runner.Handler{"bench": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }},
		Concurrency: workers,
		Prefetch:    prefetch,
		LeaseFor:    10 * time.Minute,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:       hooks,
	})
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	var werr error
	select {
	case <-hooks.done:
	case werr = <-hooks.failed:
	case <-ctx.Done():
		werr = ctx.Err()
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return werr
	}
	return poolResult(nil, hooks.succeeded.Load(), total)
}

// completerBacklog bounds the settlements in flight in the dispatch pool, as River's batch
// completer bounds its backlog (River makes completions wait at 10,000).
const completerBacklog = 1024

// workDispatch is River's shape: one dispatcher (River's producer) claims as many due tasks
// as there are idle workers in one ClaimDue call and hands them out; a worker "runs" its task
// (no work) and passes the delivery to the completer, which settles it with Finish in the
// background while the worker takes the next task. That is what River's executors and
// BatchCompleter do: a job slot is free once the job returns, and the completer marks jobs
// completed in batches (here: the store's single writer folds the concurrent Finish calls
// into shared fsyncs). The clock stops when every Finish has returned, that is durable.
func (w *worklogQueue) workDispatch(ctx context.Context, total, workers int) error {
	const lease = 10 * time.Minute
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := make(chan struct{}, workers)
	for range workers {
		idle <- struct{}{}
	}
	deliveries := make(chan work.TaskDelivery, workers)
	errs := make(chan error, 1)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
		cancel()
	}
	var finished atomic.Int64
	var settling sync.WaitGroup
	backlog := make(chan struct{}, completerBacklog)
	complete := func(d work.TaskDelivery) {
		backlog <- struct{}{} // waits while the backlog is full
		settling.Go(func() {
			defer func() { <-backlog }()
			if _, err := w.q.Finish(ctx, d, work.Success(nil)); err != nil {
				fail(fmt.Errorf("finish %s: %w", d.Task.ID, err))
				return
			}
			finished.Add(1)
		})
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d := range deliveries {
				complete(d) // the task "ran"; its slot is free once the completer has it
				idle <- struct{}{}
			}
		})
	}
	func() {
		defer close(deliveries)
		for {
			// Wait for one idle worker, then take every other idle one.
			k := 0
			select {
			case <-idle:
				k = 1
			case <-ctx.Done():
				return
			}
			for spins := 0; k < workers && spins < 3; spins++ {
				runtime.Gosched() // let workers that are handing off their task finish doing so
			more:
				for k < workers {
					select {
					case <-idle:
						k++
					default:
						break more
					}
				}
			}
			ds, err := w.q.ClaimDue(ctx, lease, k)
			if err != nil {
				fail(fmt.Errorf("claim: %w", err))
				return
			}
			if len(ds) == 0 {
				return // everything is claimed; no lease expires within the run
			}
			for range k - len(ds) {
				idle <- struct{}{}
			}
			for _, d := range ds {
				deliveries <- d // never blocks: at most `workers` deliveries are out
			}
		}
	}()
	wg.Wait()
	settling.Wait()
	return poolResult(errs, finished.Load(), total)
}

// workEach is a pool of workers, each looping on ClaimDue(limit 1) and Finish: a worker holds a
// lease only on the task it works on. The store's single writer folds the concurrent claims and
// finishes into shared fsyncs.
func (w *worklogQueue) workEach(ctx context.Context, total, workers int) error {
	const lease = 10 * time.Minute
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var finished atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ds, err := w.q.ClaimDue(ctx, lease, 1)
				if err != nil {
					errs <- fmt.Errorf("claim: %w", err)
					cancel()
					return
				}
				if len(ds) == 0 {
					return // everything is claimed; no lease expires within the run
				}
				for _, d := range ds {
					if _, err := w.q.Finish(ctx, d, work.Success(nil)); err != nil {
						errs <- fmt.Errorf("finish %s: %w", d.Task.ID, err)
						cancel()
						return
					}
					finished.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return poolResult(errs, finished.Load(), total)
}

func (w *worklogQueue) Close() error {
	return w.q.Close()
}

// Completed reopens the store and reads every task of the session back through the public
// API, counting those that succeeded. The ids come from the store's own log.
func (w *worklogQueue) Completed(ctx context.Context) (int, error) {
	if w.done != nil {
		defer w.done(ctx)
	}
	var q *work.Queue
	var err error
	if w.reopen != nil {
		q, err = w.reopen(ctx)
	} else {
		q, err = work.Open(w.dir, w.opts)
	}
	if err != nil {
		return 0, err
	}
	defer q.Close()
	var ids []string
	err = q.ReadLog(ctx, 0, func(ev events.Event) error {
		if sub, ok := ev.(*events.TaskSubmitted); ok {
			ids = append(ids, sub.TaskID)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	s := q.Session(worklogSession)
	n := 0
	for _, id := range ids {
		t, ok, err := s.Task(ctx, id)
		if err != nil {
			return 0, err
		}
		if ok && t.State == work.TaskSucceeded {
			n++
		}
	}
	return n, nil
}
