package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// The workload's names: manual kinds are claimed and settled by the operations below, run
// kinds by a runner (package runner) whose handlers record their running intervals.
const (
	kindManual  = "m.a"
	kindLimited = "m.lim" // MaxRunning limitedMax
	kindRun     = "run.a"
	kindRunOne  = "run.one" // MaxRunning 1: at most one handler of it anywhere
	limitedMax  = 2

	runLease  = time.Second // the runner's LeaseFor
	opTimeout = 5 * time.Second
)

var sessions = []string{"sA", "sB"}

// A client runs the workload on one queue: random operations, each recorded, and a runner.
// On PostgreSQL each client is a process of its own; on Pebble the owning process runs
// several clients as goroutine groups on its one queue.
type client struct {
	q    *work.Queue
	h    *hist
	rng  *rand.Rand
	skew time.Duration // added to the real time of the At twins' now
	keys int           // size of the key pool

	hmu  sync.Mutex
	hrng *rand.Rand // the handlers'

	held  []work.TaskDelivery // manual deliveries held
	tasks []string            // tasks this client submitted
	run   *runner.Runner
}

func (c *client) now() time.Time { return time.Now().Add(c.skew) }

// classify maps an error to a completion type: "fail" when it definitely did not happen,
// "info" when its outcome is unknown.
func classify(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, work.ErrInvalidRequest), errors.Is(err, work.ErrTaskNotFound),
		errors.Is(err, work.ErrIdempotencyConflict), errors.Is(err, work.ErrStaleDelivery),
		errors.Is(err, work.ErrInvalidTransition):
		return "fail"
	case errors.Is(err, postgres.ErrCommitUnknown), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled), errors.Is(err, work.ErrClosed):
		return "info"
	case errors.Is(err, work.ErrBackend):
		// PostgreSQL: an ErrBackend that is not ErrCommitUnknown did not commit (§9
		// Failures); the checker holds the queue to that.
		return "fail"
	}
	return "info"
}

func errName(err error) string {
	for _, e := range []error{work.ErrInvalidRequest, work.ErrTaskNotFound, work.ErrIdempotencyConflict,
		work.ErrStaleDelivery, work.ErrInvalidTransition, postgres.ErrCommitUnknown, work.ErrBackend,
		context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// useAt: half the operations use the At twin with the client's (skewed) clock, half the
// queue's own clock.
func (c *client) useAt() bool { return c.skew != 0 && c.rng.IntN(2) == 0 }

// step runs one random operation.
func (c *client) step(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	switch n := c.rng.IntN(100); {
	case n < 30:
		c.submit(ctx)
	case n < 45:
		c.claim(ctx)
	case n < 55:
		c.finish(ctx)
	case n < 60:
		c.release(ctx)
	case n < 65:
		c.extend(ctx)
	case n < 70:
		c.cancel(ctx)
	case n < 74:
		c.retry(ctx)
	case n < 84:
		c.wake(ctx)
	default:
		c.claimWakes(ctx)
	}
}

func (c *client) submit(ctx context.Context) {
	kinds := []string{kindManual, kindLimited, kindRun, kindRunOne}
	kind := kinds[c.rng.IntN(len(kinds))]
	sess := sessions[c.rng.IntN(len(sessions))]
	r := rec{F: "submit", Sess: sess, Kind: kind}
	// Handler runs (the run kinds): most short, some longer than several leases, which
	// only heartbeats keep.
	ms := 50 + c.rng.IntN(500)
	if c.rng.IntN(3) == 0 {
		ms = 1000 + c.rng.IntN(3000)
	}
	if c.rng.IntN(2) == 0 {
		// A keyed submit: keys are few, so repeats are many, from every client; the intent
		// (1 or 2) decides the input, so half the repeats conflict.
		r.Key = fmt.Sprintf("k%d", c.rng.IntN(c.keys))
		r.Intent = 1 + c.rng.IntN(2)
		kind = kindRun
		if r.Key[len(r.Key)-1]%2 == 0 {
			kind = kindManual
		}
		r.Kind = kind
		ms = 1200 * r.Intent
	}
	req := work.TaskRequest{Kind: kind, IdempotencyKey: r.Key,
		Input: json.RawMessage(fmt.Sprintf(`{"ms":%d}`, ms))}
	if r.Key == "" && c.rng.IntN(3) == 0 {
		req.Wake = work.WakeOnCompletion // part of a key's intent: keyed submits never ask
	}
	n := c.h.invoke(r)
	r.OpID = fmt.Sprintf("%s/%d", c.h.p, n)
	req.Headers = map[string]string{"op": r.OpID}
	s := c.q.Session(sess)
	var t work.Task
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		t, err = s.SubmitAt(ctx, req, time.Unix(0, r.Ak))
	} else {
		t, err = s.Submit(ctx, req)
	}
	c.complete(n, r, err, func(r *rec) {
		r.Task = t.ID
		c.tasks = append(c.tasks, sess+"/"+t.ID)
	})
}

// complete writes the completion of operation n.
func (c *client) complete(n int64, r rec, err error, ok func(*rec)) {
	r.I, r.T, r.At, r.Err = n, classify(err), 0, errName(err)
	if err == nil && ok != nil {
		ok(&r)
	}
	if errors.Is(err, work.ErrIdempotencyConflict) {
		var we *work.Error
		if errors.As(err, &we) {
			r.Task = we.ID
		}
	}
	c.h.write(r)
}

func (c *client) claim(ctx context.Context) {
	kind := kindManual
	if c.rng.IntN(2) == 0 {
		kind = kindLimited
	}
	lease := time.Duration(200+c.rng.IntN(1300)) * time.Millisecond
	r := rec{F: "claim", Kind: kind}
	n := c.h.invoke(r)
	var ds []work.TaskDelivery
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		ds, err = c.q.ClaimKindsAt(ctx, []string{kind}, time.Unix(0, r.Ak), lease, 1+c.rng.IntN(2))
	} else {
		ds, err = c.q.ClaimKinds(ctx, []string{kind}, lease, 1+c.rng.IntN(2))
	}
	c.complete(n, r, err, func(r *rec) {
		for _, d := range ds {
			r.Claims = append(r.Claims, claimR{Task: d.Task.ID, Attempt: d.Attempt, Exp: d.LeaseExpiresAt.UnixNano()})
			c.held = append(c.held, d)
		}
	})
}

// pick removes and returns a random held delivery.
func (c *client) pick() (work.TaskDelivery, bool) {
	if len(c.held) == 0 {
		return work.TaskDelivery{}, false
	}
	i := c.rng.IntN(len(c.held))
	d := c.held[i]
	c.held = append(c.held[:i], c.held[i+1:]...)
	return d, true
}

func (c *client) finish(ctx context.Context) {
	d, ok := c.pick()
	if !ok {
		return
	}
	o := work.Success(json.RawMessage(`1`))
	if c.rng.IntN(4) == 0 {
		o = work.Failure("chaos")
	}
	r := rec{F: "finish", Task: d.Task.ID, Attempt: d.Attempt, Exp: d.LeaseExpiresAt.UnixNano(), Kind: d.Task.Kind}
	n := c.h.invoke(r)
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		_, err = c.q.FinishAt(ctx, d, o, time.Unix(0, r.Ak))
	} else {
		_, err = c.q.Finish(ctx, d, o)
	}
	c.complete(n, r, err, nil)
}

func (c *client) release(ctx context.Context) {
	d, ok := c.pick()
	if !ok {
		return
	}
	r := rec{F: "release", Task: d.Task.ID, Attempt: d.Attempt, Kind: d.Task.Kind}
	n := c.h.invoke(r)
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		_, err = c.q.ReleaseAt(ctx, d, work.ReleaseRequest{}, time.Unix(0, r.Ak))
	} else {
		_, err = c.q.Release(ctx, d, work.ReleaseRequest{})
	}
	c.complete(n, r, err, nil)
}

func (c *client) extend(ctx context.Context) {
	d, ok := c.pick()
	if !ok {
		return
	}
	r := rec{F: "extend", Task: d.Task.ID, Attempt: d.Attempt, Kind: d.Task.Kind}
	n := c.h.invoke(r)
	lease := time.Duration(200+c.rng.IntN(800)) * time.Millisecond
	var nd work.TaskDelivery
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		nd, err = c.q.ExtendAt(ctx, d, lease, time.Unix(0, r.Ak))
	} else {
		nd, err = c.q.Extend(ctx, d, lease)
	}
	c.complete(n, r, err, func(r *rec) {
		r.Exp = nd.LeaseExpiresAt.UnixNano()
		c.held = append(c.held, nd)
	})
}

func (c *client) someTask() (sess, id string, ok bool) {
	if len(c.tasks) == 0 {
		return "", "", false
	}
	st := c.tasks[c.rng.IntN(len(c.tasks))]
	for i := 0; i < len(st); i++ {
		if st[i] == '/' {
			return st[:i], st[i+1:], st[i+1:] != ""
		}
	}
	return "", "", false
}

func (c *client) cancel(ctx context.Context) {
	sess, id, ok := c.someTask()
	if !ok {
		return
	}
	r := rec{F: "cancel", Sess: sess, Task: id}
	n := c.h.invoke(r)
	var t work.Task
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		t, err = c.q.Session(sess).CancelAt(ctx, id, time.Unix(0, r.Ak))
	} else {
		t, err = c.q.Session(sess).Cancel(ctx, id)
	}
	c.complete(n, r, err, func(r *rec) { r.State = t.State.String() })
}

func (c *client) retry(ctx context.Context) {
	sess, id, ok := c.someTask()
	if !ok {
		return
	}
	r := rec{F: "retry", Sess: sess, Task: id}
	n := c.h.invoke(r)
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		_, err = c.q.Session(sess).RetryAt(ctx, id, time.Time{}, time.Unix(0, r.Ak))
	} else {
		_, err = c.q.Session(sess).Retry(ctx, id, time.Time{})
	}
	c.complete(n, r, err, nil)
}

func (c *client) wake(ctx context.Context) {
	sess := sessions[c.rng.IntN(len(sessions))]
	r := rec{F: "wake", Sess: sess}
	n := c.h.invoke(r)
	req := work.WakeRequest{Payload: json.RawMessage(fmt.Sprintf(`{"op":%q}`, fmt.Sprintf("%s/%d", c.h.p, n)))}
	var w work.Wake
	var err error
	if c.useAt() {
		r.Ak = c.now().UnixNano()
		w, err = c.q.Session(sess).WakeAt(ctx, req, time.Unix(0, r.Ak))
	} else {
		w, err = c.q.Session(sess).Wake(ctx, req)
	}
	c.complete(n, r, err, func(r *rec) { r.Wake = w.ID })
}

// claimWakes claims wakes with a short lease and acknowledges some of them; the others are
// left to expire and must be delivered again.
func (c *client) claimWakes(ctx context.Context) {
	lease := time.Duration(100+c.rng.IntN(700)) * time.Millisecond
	r := rec{F: "claimwakes"}
	n := c.h.invoke(r)
	ds, err := c.q.ClaimWakes(ctx, lease, 1+c.rng.IntN(3))
	c.complete(n, r, err, func(r *rec) {
		for _, d := range ds {
			r.Claims = append(r.Claims, claimR{Wake: d.Wake.ID, Attempt: d.Attempt, Exp: d.LeaseExpiresAt.UnixNano()})
		}
	})
	for _, d := range ds {
		if c.rng.IntN(3) == 0 {
			continue
		}
		a := rec{F: "ack", Wake: d.Wake.ID, Attempt: d.Attempt}
		m := c.h.invoke(a)
		err := c.q.AckWake(ctx, d)
		c.complete(m, a, err, nil)
	}
}

// handler is the runner's task handler: it "works" in 10 ms steps for the time its input
// asks, recording its running interval: from its start to its last step, a step being taken
// only while its context is alive and before its deadline (a careful handler's check; a
// paused process takes no step). A run that ends early reports its context's cause.
func (c *client) handler(ctx context.Context, t work.Task) (json.RawMessage, error) {
	var in struct {
		Ms int `json:"ms"`
	}
	json.Unmarshal(t.Input, &in)
	start := time.Now()
	c.h.write(rec{T: "hstart", Task: t.ID, Kind: t.Kind, Attempt: t.Attempts, At: start.UnixNano()})
	last := start
	alive := func() bool {
		if ctx.Err() != nil {
			return false
		}
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return false
		}
		return true
	}
	steps := 0
	for alive() && time.Since(start) < time.Duration(in.Ms)*time.Millisecond {
		last = time.Now()
		steps++
		time.Sleep(10 * time.Millisecond)
	}
	if alive() {
		last = time.Now()
		steps++
	}
	end := rec{T: "hend", Task: t.ID, Kind: t.Kind, Attempt: t.Attempts, At: last.UnixNano()}
	if steps == 0 {
		end.State = "nostep" // it never ran: its context had ended when it started
	}
	if err := context.Cause(ctx); err != nil {
		end.Err = err.Error()
	}
	c.h.write(end)
	if end.Err != "" {
		return nil, context.Cause(ctx)
	}
	if c.rng2() {
		return nil, errors.New("chaos: a handler's error")
	}
	return json.RawMessage(`2`), nil
}

// rng2 is the handlers' choice (one in eight fails), from the client's seed: handlers run
// in the runner's goroutines, so it has a generator and a lock of its own.
func (c *client) rng2() bool {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	return c.hrng.IntN(8) == 0
}

// startRunner starts the client's runner on the run kinds.
func (c *client) startRunner(worker string) error {
	r, err := runner.New(c.q, runner.Config{
		Handlers:    map[string]runner.Handler{kindRun: c.handler, kindRunOne: c.handler},
		Concurrency: 2,
		LeaseFor:    runLease,
		MaxAttempts: 1000,
		Backoff:     func(uint32, error) time.Duration { return 100 * time.Millisecond },
		WorkerID:    worker,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	c.run = r
	return r.Start()
}

// loop runs operations until ctx ends or maxOps were run.
func (c *client) loop(ctx context.Context, maxOps int) {
	for i := 0; i < maxOps && ctx.Err() == nil; i++ {
		c.step(ctx)
		time.Sleep(time.Duration(2+c.rng.IntN(20)) * time.Millisecond)
	}
}

func (c *client) stopRunner() {
	if c.run == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.run.Stop(ctx)
}
