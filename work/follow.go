package work

import (
	"context"
	"errors"
	"math"

	"github.com/worklog/worklog/events"
)

// Following the log (issue 21 §1; docs/design.md, "Following the log").
//
// A follower reads the log from the store, never from the writer: it reads every retained
// event from its position up to the durable head, then waits on a channel that the head's
// next advance closes, and reads again. The writer only closes that channel (an atomic load
// when nobody follows), so a slow follower slows nobody else, and an idle one blocks on a
// channel: no CPU, no polling.

// Follower is implemented by a backend that can follow its log (Queue.Follow), with
// Queue.Follow's contract: fn's error is returned as is, ctx's end as ctx.Err().
type Follower interface {
	Follow(ctx context.Context, from uint64, fn func(events.Event) error) error
}

// Follow calls fn for every retained event with sequence >= from (0 or 1 means the start), in
// order, as ReadLog does (pruned events are the only gaps), and then keeps waiting and calls
// fn for each new event once it is committed: durable, never one a crash could take back (on
// the Pebble store, once the fsync of its batch returned; on PostgreSQL, committed rows,
// written by any process sharing the queue). Every event is handed to fn exactly once, in
// sequence order.
//
// It returns when ctx ends (ctx.Err(), as is), when fn returns an error (that error, as is),
// or when the queue is closed (an ErrBackend error wrapping ErrClosed) or its store failed
// (the store's error, as every other call gets it). A from beyond the log's head waits for
// that event. fn runs in the caller's goroutine and may call the queue; a slow fn slows only
// its own follower, never the queue's writer or other followers. A follower that waits uses
// no CPU: it blocks on a channel that a commit closes. A nil fn is ErrInvalidRequest ("fn").
//
// A queue over a custom Backend can follow when the backend is a Follower; otherwise Follow
// returns an ErrBackend error naming it.
func (q *Queue) Follow(ctx context.Context, from uint64, fn func(events.Event) error) error {
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := q.begin(ctx); err != nil {
		return err
	}
	if q.caps.follow == nil {
		return unsupported("Queue.Follow", "Follower")
	}
	fnErr, err := callerFn(fn, func(fn func(events.Event) error) error { return q.caps.follow.Follow(ctx, from, fn) })
	if fnErr != nil {
		return fnErr
	}
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return cerr
	}
	return wrap(err)
}

// errPastHead stops a read of the log at the first event past the durable head.
var errPastHead = errors.New("work: past the durable head")

// Follow is Queue.Follow on worklog's backend.
//
// On an engine that knows its durable head (engineapi.DurableHead: the in-memory engine and
// Pebble) a pass reads up to that head and waits on the head's channel. On one that does not
// (PostgreSQL, whose reads see only committed rows), a pass reads to the end of the log and
// waits on the hub's log signal, which this queue's commits close after they returned and the
// engine's Watcher closes on every other process's commit.
func (b *logBackend) Follow(ctx context.Context, from uint64, fn func(events.Event) error) error {
	next := max(from, 1)
	dh := b.caps.durable
	if dh == nil {
		b.hub.watch()
	}
	var fnErr error
	for {
		// The channel is taken before anything is read: a commit after the read closes it.
		limit := uint64(math.MaxUint64)
		var grown <-chan struct{}
		if dh != nil {
			var err error
			if limit, grown, err = dh.DurableHead(); err != nil {
				return backendErr(err)
			}
		} else {
			grown = b.hub.channel(sigLog)
		}
		if next <= limit {
			err := b.eng.ReadLog(ctx, next, func(ev events.Event) error {
				seq := ev.Head().Seq
				if seq > limit {
					return errPastHead
				}
				if err := fn(ev); err != nil {
					fnErr = err
					return err
				}
				next = seq + 1
				return nil
			})
			switch {
			case fnErr != nil:
				return fnErr
			case err == nil || errors.Is(err, errPastHead):
			case ctx.Err() != nil:
				return ctx.Err()
			case b.closed():
				return backendErr(ErrClosed) // the engine's own words for it differ (postgres: a canceled read)
			default:
				return backendErr(err)
			}
			if limit != math.MaxUint64 {
				next = limit + 1 // every retained event up to the head was handed out
			}
		}
		select {
		case <-grown:
		case <-ctx.Done():
			return ctx.Err()
		case <-b.hub.done:
			return backendErr(ErrClosed)
		}
	}
}

// closed reports whether the backend was closed.
func (b *logBackend) closed() bool {
	select {
	case <-b.hub.done:
		return true
	default:
		return false
	}
}
