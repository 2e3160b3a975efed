package work

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/headwatch"
	"github.com/worklog/worklog/projection"
)

// memEngine keeps the log and the projection in memory. One mutex serialises commands; the
// log is the source of truth, and a command that fails part-way is rolled back by refolding
// the log (never expected: decide checks before it appends).
type memEngine struct {
	mu     sync.RWMutex
	state  *projection.Mem
	log    []events.Event
	closed bool

	// Retention (prune.go): the sequences pruned from the log, and how many pruned events
	// log still holds (compacted away once they are a quarter of it). pruned is replaced,
	// never changed in place: ReadLog walks a snapshot of it.
	pruned projection.SeqRanges
	stale  int

	// head is the last committed sequence, advanced under mu once a command's events are in
	// (Queue.Follow, follow.go): every committed event of this engine is as durable as it gets.
	head headwatch.Head
}

func newMemEngine() *memEngine { return &memEngine{state: projection.NewMem()} }

type memTxn struct {
	*projection.Mem
	e *memEngine
}

func (t memTxn) Append(ev events.Event) error {
	last, _ := t.Mem.LastSeq()
	ev.Head().Seq = last + 1
	if err := projection.Apply(t.Mem, ev); err != nil {
		return err
	}
	t.e.log = append(t.e.log, ev)
	return nil
}

func (e *memEngine) Update(ctx context.Context, fn func(tx txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	start := len(e.log)
	if err := fn(memTxn{e.state, e}); err != nil {
		if len(e.log) > start {
			e.log = e.log[:start]
			if rerr := e.refold(); rerr != nil {
				return fmt.Errorf("%w; rolling back: %v", err, rerr)
			}
		}
		return err
	}
	if len(e.log) > start {
		e.head.Advance(e.log[len(e.log)-1].Head().Seq)
	}
	return nil
}

// DurableHead is the last committed sequence (engineapi.DurableHead): the in-memory engine
// never takes an event back once its command returned.
func (e *memEngine) DurableHead() (uint64, <-chan struct{}, error) {
	seq, grown := e.head.Load()
	return seq, grown, nil
}

func (e *memEngine) refold() error {
	st := projection.NewMemSized(len(e.log)/3, 0) // a task's life is about three events
	st.DeferIndexes()
	for _, ev := range e.log {
		if e.pruned.Contains(ev.Head().Seq) {
			continue
		}
		if err := foldGap(st, ev, e.pruned); err != nil {
			return err
		}
		if err := projection.Apply(st, ev); err != nil {
			return err
		}
	}
	if err := e.foldTail(st); err != nil {
		return err
	}
	st.BuildIndexes() // before readers share it: a deferred Mem builds them on first read
	e.state = st
	return nil
}

func (e *memEngine) View(ctx context.Context, fn func(r projection.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return ErrClosed
	}
	return fn(e.state)
}

func (e *memEngine) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	// The walk runs on the log as it is now, without the lock, so fn may call the queue,
	// writes included, as on the durable store. That is safe because an appended event never
	// changes and the log only grows past what a reader can see: a rollback truncates only
	// the failing command's own events, which it appended under the write lock, and later
	// appends write past every reader's length.
	e.mu.RLock()
	closed, log, pruned := e.closed, e.log[:len(e.log):len(e.log)], e.pruned
	e.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	// Sequences ascend; after a prune they have gaps, so the start is searched for.
	start := sort.Search(len(log), func(i int) bool { return log[i].Head().Seq >= from })
	// Each event is handed out as a decoded copy of its encoding: the stored events share
	// byte slices with the projection, and a callback must not be able to change either.
	var buf []byte
	for _, stored := range log[start:] {
		if err := ctx.Err(); err != nil {
			return err
		}
		seq := stored.Head().Seq
		if pruned.Contains(seq) {
			continue // pruned, not yet compacted away
		}
		var err error
		if buf, err = events.Append(buf[:0], stored); err != nil {
			return err
		}
		ev, err := events.Decode(buf, seq)
		if err != nil {
			return err
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

// verify refolds the log, through the wire encoding so that what the durable store would
// decode is what is checked, and compares the result with the live state.
func (e *memEngine) Verify(ctx context.Context) ([]string, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, ErrClosed
	}
	st := projection.NewMemSized(len(e.log)/3, 0)
	st.DeferIndexes() // Diff builds them
	var buf []byte
	var d events.Decoder // the fold keeps no event
	for _, ev := range e.log {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		seq := ev.Head().Seq
		if e.pruned.Contains(seq) {
			continue
		}
		var err error
		if buf, err = events.Append(buf[:0], ev); err != nil {
			return []string{fmt.Sprintf("seq %d: %v", seq, err)}, nil
		}
		dec, err := d.Decode(buf, seq)
		if err != nil {
			return []string{err.Error()}, nil
		}
		if err := foldGap(st, dec, e.pruned); err != nil {
			return nil, err
		}
		if err := projection.Apply(st, dec); err != nil {
			return []string{err.Error()}, nil
		}
	}
	if err := e.foldTail(st); err != nil {
		return nil, err
	}
	return st.Diff(e.state), nil
}

func (e *memEngine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}

// foldTail moves a fold's last sequence past the log's end when the newest events were
// pruned: the live state's last sequence stays where the log ended, and the next append
// must not reuse a pruned sequence. The ranges are coalesced and no event follows the fold's
// last one, so a last range beyond it is exactly the pruned tail.
func (e *memEngine) foldTail(st *projection.Mem) error {
	last, _ := st.LastSeq()
	if n := len(e.pruned); n > 0 && e.pruned[n-1].To > last {
		return st.SetLastSeq(e.pruned[n-1].To)
	}
	return nil
}
