package work

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
)

// Waiting without polling (issue 13 §2).
//
// A waiter blocks on a broadcast channel that a commit closes when it may have made work
// claimable, and on a timer set to the earliest entry of the due index (or the
// available-wake index): a scheduled time or a lease expiry. What is due is decided by the
// projection, as the claims decide it; only the timer reads the queue's clock.
//
// The signal comes from the backend's one update path (logBackend.update), not from each
// command: it hands the decide code a transaction that looks at the type of each event
// appended, so a new command (or a new engine) signals without being told to.

// signal bits: which waiters an event may concern.
const (
	sigTasks uint8 = 1 << iota
	sigWakes
	sigLog   // any event committed: Queue.Follow's followers on an engine without engineapi.DurableHead (follow.go)
	sigSlots // a task left its lease (settled, released): a waiter held back by a kind's MaxRunning (kind_policies_wait.go)
)

// eventSignal is which waiters an event of type t may concern (ok false: a type this
// switch does not know, which TestEventSignalKnowsEveryType catches): an event that may make
// a task or a wake claimable, or that may move the earliest entry of an index earlier (so a
// waiter's timer is too late). Claims are not among them: a claim only takes due entries
// (at <= its now) and puts each back at now+lease, later than the entry it took, so the
// earliest entry a waiter computed can only move later; a waiter whose timer then fires
// early finds nothing and waits again. Settlements only remove entries; a completion wake is
// its own WakeRecorded.
func eventSignal(t events.Type) (sig uint8, ok bool) {
	switch t {
	case events.TypeTaskSubmitted, events.TypeTaskExtended,
		events.TypeTaskCancelRequested, events.TypeTaskRetried,
		events.TypeKindPolicySet: // a pause lifted, a limit raised, a bucket refilled
		return sigTasks, true
	case events.TypeScheduleSet: // its next tick may be earlier than a waiter's timer
		return sigTasks, true
	case events.TypeTaskReleased:
		return sigTasks | sigSlots, true
	case events.TypeTaskSettled:
		// It only removes entries, but frees a slot of its kind: only the waiters a
		// MaxRunning holds back listen for that.
		return sigSlots, true
	case events.TypeWakeRecorded:
		return sigWakes, true
	case events.TypeTaskClaimed, events.TypeWakeClaimed, events.TypeWakeAcked,
		events.TypeTaskSettleRejected, events.TypeWakeAckRejected, events.TypeScheduleRemoved,
		events.TypeTaskSubmitRejected:
		return 0, true
	}
	return 0, false
}

// waitHub is the broadcast point of one engine: a channel per signal that is closed (and
// forgotten) when the signal fires, made only when somebody waits, so a commit with no
// waiter costs one atomic load.
type waitHub struct {
	tasks, wakes atomic.Pointer[chan struct{}]
	log          atomic.Pointer[chan struct{}] // sigLog (follow.go)
	slots        atomic.Pointer[chan struct{}] // sigSlots (kind_policies_wait.go)
	done         chan struct{}                 // closed when the engine closes
	closeOnce    sync.Once

	// Commits of other processes, from an engine that implements engineapi.Watcher,
	// forwarded to both signals by one goroutine started by the first waiter. aware: the
	// watcher, when it would rather hear them only while somebody waits (WaiterWatcher).
	watcher   engineapi.Watcher
	watchOnce sync.Once
	aware     engineapi.WaiterWatcher
}

// newWaitHub is the hub of an engine whose Watcher (nil: none) reports other processes'
// commits.
func newWaitHub(watcher engineapi.Watcher) *waitHub {
	h := &waitHub{done: make(chan struct{}), watcher: watcher}
	if a, ok := watcher.(engineapi.WaiterWatcher); ok {
		h.aware = a
		a.WatchWaiters(h.waiting)
	}
	return h
}

// waiting reports whether anybody waits on a signal now.
func (h *waitHub) waiting() bool {
	return h.tasks.Load() != nil || h.wakes.Load() != nil || h.log.Load() != nil || h.slots.Load() != nil
}

func (h *waitHub) slot(which uint8) *atomic.Pointer[chan struct{}] {
	switch which {
	case sigWakes:
		return &h.wakes
	case sigLog:
		return &h.log
	case sigSlots:
		return &h.slots
	}
	return &h.tasks
}

// channel returns the channel the next signal of which closes. A waiter takes it before it
// reads the state it waits on; so does the watcher's Waiting call (WaiterWatcher), made
// once the channel is in place, so that waiting reports it from then on.
func (h *waitHub) channel(which uint8) <-chan struct{} {
	p := h.slot(which)
	if h.aware != nil {
		defer h.aware.Waiting()
	}
	for {
		if c := p.Load(); c != nil {
			return *c
		}
		c := make(chan struct{})
		if p.CompareAndSwap(nil, &c) {
			return c
		}
	}
}

// signal wakes every waiter of the signals in mask.
func (h *waitHub) signal(mask uint8) {
	for _, which := range [...]uint8{sigTasks, sigWakes, sigLog, sigSlots} {
		if mask&which == 0 {
			continue
		}
		p := h.slot(which)
		if p.Load() == nil { // nobody waits: the common case under load
			continue
		}
		if c := p.Swap(nil); c != nil {
			close(*c)
		}
	}
}

func (h *waitHub) close() {
	h.closeOnce.Do(func() { close(h.done) })
}

// watch starts, once, the goroutine that turns another process's commits into signals.
func (h *waitHub) watch() {
	if h.watcher == nil {
		return
	}
	h.watchOnce.Do(func() {
		changed := h.watcher.Changed()
		go func() {
			for {
				select {
				case _, ok := <-changed:
					if !ok {
						return
					}
					h.signal(sigTasks | sigWakes | sigLog | sigSlots)
				case <-h.done:
					return
				}
			}
		}()
	})
}

// watchCall is one logBackend.update: the transaction handed to the decide code
// (the engine's, whose Append it wraps) and what its events signaled. Calls are pooled, and
// run is made once per pooled call, so that watching costs a command no allocation (a
// closure and a wrapper per Update cost three, measured on BenchmarkInMemory).
type watchCall struct {
	txn  // the engine's transaction of the current run of fn
	hub  *waitHub
	fn   func(tx txn) error
	mask uint8              // the signals of the events appended, and sigLog once any was
	run  func(tx txn) error // runFn, bound once
}

var watchCalls = sync.Pool{New: func() any {
	w := &watchCall{}
	w.run = w.runFn
	return w
}}

// runFn is what the engine runs: fn over this call. fn may run twice (engine.Update): only
// the last run's events commit, so the mask starts afresh.
func (w *watchCall) runFn(tx txn) error {
	w.txn, w.mask = tx, 0
	return w.fn(w)
}

// Append signals before the command commits, so a waiter's claim can be queued while this
// batch is still being written and share its fsync. That early signal is safe: a claim runs
// after this batch in the engine's order (the single writer, or the in-memory engine's
// lock), so it sees the event, and if the batch is discarded the waiter only finds nothing.
// But a waiter that starts waiting after it and reads the state before the batch is visible
// would miss it, so Update signals again once the commit returned.
func (w *watchCall) Append(ev events.Event) error {
	if err := w.txn.Append(ev); err != nil {
		return err
	}
	if s, _ := eventSignal(ev.Type()); s != 0 {
		w.mask |= s
		w.hub.signal(s)
	}
	w.mask |= sigLog // followers only after the commit: the event may not be durable yet
	return nil
}

// update is the one way the decide code commits: the engine's Update, with the events its
// transaction appends signaled to the waiters (watchCall.Append) and signaled again once the
// commit returned.
func (b *logBackend) update(ctx context.Context, fn func(tx txn) error) error {
	w := watchCalls.Get().(*watchCall)
	w.hub, w.fn, w.mask = b.hub, fn, 0
	// The engine runs w.run only until Update returns (a caller whose ctx ends first waits
	// for a running closure and stops it from running again), so w is free after it.
	err := b.eng.Update(ctx, w.run)
	mask := w.mask
	w.txn, w.hub, w.fn = nil, nil, nil
	watchCalls.Put(w)
	if err == nil && mask != 0 {
		b.hub.signal(mask)
	}
	return err
}

// WaitTasks blocks until a task of one of kinds (of any kind when kinds is empty) may be
// claimable, so that a worker's loop needs no sleep: it returns nil at once when such a task
// is due now (pending and scheduled at or before now, or running with an expired lease);
// otherwise when a commit of this queue may have made one claimable (a submit, a release, a
// cancel request or a lease extension, of any kind), when the earliest scheduled time or
// lease expiry of those kinds comes, or, on an engine shared with other processes
// (PostgreSQL), when another process commits such a change. It returns an ErrBackend error
// wrapping ctx.Err() when ctx ends, and one wrapping ErrClosed when the queue is closed.
//
// A waiter uses no CPU while it waits: it blocks on a channel and a timer. Wakeups may be
// spurious: nil means "try to claim", and the claim may find nothing (another worker was
// faster, the commit concerned another kind, a task was claimed before its timer fired).
// Call it again then. What is due is read from the projection, as the claims read it; the
// queue's clock only sets the timer, so a clock that jumps makes a waiter return early (and
// wait again) or late, never miss a signal.
func (q *Queue) WaitTasks(ctx context.Context, kinds []string) error {
	for _, k := range kinds {
		if err := validateNonBlank("kind", k); err != nil {
			return err
		}
	}
	if err := q.begin(ctx); err != nil {
		return err
	}
	if q.caps.wait == nil {
		return unsupported("Queue.WaitTasks", "Waiter")
	}
	return wrap(q.caps.wait.WaitTasks(ctx, kinds))
}

// WaitWakes is WaitTasks for wakes: it returns when an unacknowledged wake may be claimable
// (one is available now, a wake was recorded, a wake's lease expired), with the same rules.
func (q *Queue) WaitWakes(ctx context.Context) error {
	if err := q.begin(ctx); err != nil {
		return err
	}
	if q.caps.wait == nil {
		return unsupported("Queue.WaitWakes", "Waiter")
	}
	return wrap(q.caps.wait.WaitWakes(ctx))
}

// SessionWakeWaiter is implemented by a backend that can wait for the wakes of chosen
// sessions (Queue.WaitSessionWakes, which validates the sessions and then calls it).
type SessionWakeWaiter interface {
	WaitSessionWakes(ctx context.Context, sessions []string) error
}

// WaitSessionWakes is WaitWakes for the wakes of sessions, ClaimSessionWakes' waiter: it
// returns when a wake of one of them may be claimable, not for a wake of another session.
// sessions is checked as ClaimSessionWakes checks it.
func (q *Queue) WaitSessionWakes(ctx context.Context, sessions []string) error {
	if err := q.begin(ctx); err != nil {
		return err
	}
	if err := validateSessions(sessions); err != nil {
		return err
	}
	if q.caps.sessWait == nil {
		return unsupported("Queue.WaitSessionWakes", "SessionWakeWaiter")
	}
	return wrap(q.caps.sessWait.WaitSessionWakes(ctx, sessions))
}

// WaitSessionWakes waits on the wake signal like WaitWakes, on the first entries of the
// sessions' own available-wake indexes, and after each return looks again: it returns only
// when one of those is available at the queue's clock's now. A signal of another session's
// wake costs the waiter one read of its sessions' index heads, not a return.
func (b *logBackend) WaitSessionWakes(ctx context.Context, sessions []string) error {
	scan := func(r projection.Reader, first func(projection.IndexEntry) bool) error {
		for _, s := range sessions {
			if err := r.ScanIndex(projection.IndexSessionWakes, s, math.MinInt64, math.MaxInt64, first); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		if err := b.wait(ctx, sigWakes, scan); err != nil {
			return err
		}
		now, due := b.clock().UnixNano(), false
		if err := b.eng.View(ctx, func(r projection.Reader) error {
			return scan(r, func(e projection.IndexEntry) bool { due = due || e.At <= now; return false })
		}); err != nil {
			return backendErr(err)
		}
		if due {
			return nil
		}
	}
}

// WaitTasks is Queue.WaitTasks on worklog's backend (kinds validated by the queue): the
// earliest moment a task of kinds may be claimable, under the kind policies
// (kind_policies_wait.go).
func (b *logBackend) WaitTasks(ctx context.Context, kinds []string) error {
	return b.waitTasks(ctx, kinds)
}

// WaitWakes is Queue.WaitWakes on worklog's backend.
func (b *logBackend) WaitWakes(ctx context.Context) error {
	return b.wait(ctx, sigWakes, func(r projection.Reader, first func(projection.IndexEntry) bool) error {
		return r.ScanIndex(projection.IndexWakes, "", math.MinInt64, math.MaxInt64, first)
	})
}

// earliestDue calls first with the due-index entry of least At that scan (a due index's
// IndexDue or IndexKindDue) holds, if any. The index is in claim order, priority first, so its
// first entry is the earliest of the highest priority only: each round asks for the first
// entry strictly earlier than the last one found, which is the head of a lower priority,
// until there is none. At most one round per priority present, each O(p · log n).
func earliestDue(scan func(maxAt int64, fn func(projection.IndexEntry) bool) error, first func(projection.IndexEntry) bool) error {
	bound := int64(math.MaxInt64)
	for {
		var e projection.IndexEntry
		found := false
		if err := scan(bound, func(x projection.IndexEntry) bool { e, found = x, true; return false }); err != nil {
			return err
		}
		if !found {
			return nil
		}
		first(e)
		if e.At == math.MinInt64 {
			return nil
		}
		bound = e.At - 1
	}
}

// wait is WaitTasks and WaitWakes: scan calls first with the first entry of each index the
// waiter cares about (first returns false to stop each scan at its first entry).
func (b *logBackend) wait(ctx context.Context, which uint8, scan func(projection.Reader, func(projection.IndexEntry) bool) error) error {
	return b.waitAt(ctx, which, func(r projection.Reader, _ int64, first func(projection.IndexEntry) bool) (uint8, error) {
		return 0, scan(r, first)
	})
}

// waitBlocks, when set (tests), is called by each waiter as it blocks: after it took the
// signal channels and read the state.
var waitBlocks func()

// waitAt is wait with the waiter's now (the queue's clock, read before the state) given to
// scan, which may name more signals to wait for (also: sigSlots).
func (b *logBackend) waitAt(ctx context.Context, which uint8, scan func(r projection.Reader, now int64, first func(projection.IndexEntry) bool) (also uint8, err error)) error {
	h := b.hub
	h.watch()
	// The channels are taken before the state is read: a commit after the read closes them,
	// so no signal falls between the read and the wait.
	signaled := h.channel(which)
	slots := h.channel(sigSlots)
	var earliest int64
	found := false
	now := b.clock().UnixNano()
	var also uint8
	err := b.eng.View(ctx, func(r projection.Reader) error {
		found = false
		var err error
		also, err = scan(r, now, func(e projection.IndexEntry) bool {
			if !found || e.At < earliest {
				earliest, found = e.At, true
			}
			return false
		})
		return err
	})
	if err != nil {
		return backendErr(err)
	}
	if also&sigSlots == 0 {
		slots = nil // a nil channel never fires
	}
	var timer <-chan time.Time
	if found {
		now := b.clock().UnixNano() // the timer's: the state's read took its time
		if earliest <= now {
			return nil
		}
		d := time.Duration(earliest - now)
		if d < 0 { // earliest - now overflowed: far enough to wait for signals only
			d = math.MaxInt64
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	if waitBlocks != nil {
		waitBlocks()
	}
	select {
	case <-signaled:
		return nil
	case <-slots:
		return nil
	case <-timer:
		return nil
	case <-ctx.Done():
		return backendErr(ctx.Err())
	case <-h.done:
		return backendErr(ErrClosed)
	}
}
