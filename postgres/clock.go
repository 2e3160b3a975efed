package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// The server's clock decides (issue 27 item 10, docs/design.md §9 "Which clock decides").
//
// A queue's plain methods (Submit, ClaimDue, Finish, ...: the twins without At) take their
// time from the queue's clock. On PostgreSQL every host's queue works on the same rows, so a
// host whose clock is 30 s fast would judge live leases expired and claim them (fencing held,
// but the task ran twice). So a queue from Open reads the database server's clock instead:
// serverClock measures the server's time once (SELECT clock_timestamp(), bracketed by two
// readings of the local monotonic clock) and from then on adds the local monotonic clock's
// elapsed time to it. It is measured again in the background, at most every clockRefresh,
// never as a round trip per call. Its error is half a measurement's round trip plus the
// local clock's drift since the last measurement; the wall clock of the host is not used.

// clockRefresh is how old a measurement may get before Now starts a new one in the
// background.
const clockRefresh = 10 * time.Second

// localClock is the clock a serverClock brackets its measurements with and measures elapsed
// time by: time.Now, whose readings carry the monotonic clock. A variable for the tests,
// which give queues skewed local clocks (a skew shifts both readings alike and so cancels).
var localClock = time.Now

// serverClock is the server's time, as an anchor measured once and the local monotonic
// time elapsed since.
type serverClock struct {
	local func() time.Time
	query func(ctx context.Context) (time.Time, error) // the server's clock_timestamp()
	ctx   context.Context                              // ends when the engine closes

	cur       atomic.Pointer[clockSample]
	measuring atomic.Bool // a background measurement runs
	mu        sync.Mutex  // one measurement at a time
}

// clockSample is one measurement: the server's time at the local reading local (which
// carries the monotonic clock), within rtt/2.
type clockSample struct {
	server time.Time
	local  time.Time
	rtt    time.Duration
}

// newServerClock measures the server's clock (the best of a few tries, so one slow round
// trip does not set the error bound).
func newServerClock(ctx, engineCtx context.Context, query func(context.Context) (time.Time, error)) (*serverClock, error) {
	c := &serverClock{local: localClock, query: query, ctx: engineCtx}
	for range 3 {
		if err := c.measure(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// measure takes one sample and keeps it when its round trip is no longer than the current
// one's, or the current one is older than a few refreshes (the local clock may drift).
func (c *serverClock) measure(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	t0 := c.local()
	server, err := c.query(ctx)
	if err != nil {
		return err
	}
	t1 := c.local()
	rtt := t1.Sub(t0) // monotonic
	s := &clockSample{server: server.Add(rtt / 2), local: t1, rtt: rtt}
	cur := c.cur.Load()
	if cur == nil || rtt <= cur.rtt || t1.Sub(cur.local) > 3*clockRefresh {
		c.cur.Store(s)
	}
	return nil
}

// Now is the server's time: the anchor plus the local monotonic time elapsed since. A stale
// anchor starts one measurement in the background; Now never waits for the server.
func (c *serverClock) Now() time.Time {
	s := c.cur.Load()
	now := c.local()
	elapsed := now.Sub(s.local)
	if elapsed > clockRefresh && c.ctx.Err() == nil && c.measuring.CompareAndSwap(false, true) {
		go func() {
			defer c.measuring.Store(false)
			ctx, cancel := context.WithTimeout(c.ctx, clockRefresh)
			defer cancel()
			_ = c.measure(ctx) // a failed measurement keeps the last one; the next Now retries
		}()
	}
	return s.server.Add(elapsed)
}

// serverTime is the server's clock_timestamp(): its time now, not its transaction's.
func (e *engine) serverTime(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := queryRow(ctx, e, "SELECT clock_timestamp()", nil, &t) // on a live connection
	return t, err
}
