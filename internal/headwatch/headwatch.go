// Package headwatch is a sequence number that only grows, watched without polling: the
// durable head of a log, which Queue.Follow's followers wait on (docs/design.md, "Following
// the log").
//
// One writer advances it (pebblelog's syncer, the in-memory engine under its lock); any
// number of readers take the current value together with a channel that is closed the next
// time it grows. The channel is made only when somebody reads, so an advance that nobody
// watches costs one atomic store and one atomic load.
package headwatch

import "sync/atomic"

// Head is a growing sequence number and the channel its next advance closes. The zero Head
// is at 0. A Head must not be copied after first use.
type Head struct {
	seq     atomic.Uint64
	ch      atomic.Pointer[chan struct{}]
	stopped atomic.Bool
}

// closed is a channel that is always closed: what Load hands out once the Head is stopped.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Load returns the current value and a channel that is closed once the value may have grown
// past it (or the Head is stopped). The channel is taken before the value is read, so an
// advance that the value does not show always closes the channel: a reader that waits on it
// after reading up to the value misses nothing.
func (h *Head) Load() (uint64, <-chan struct{}) {
	ch := h.channel()
	return h.seq.Load(), ch
}

// Seq is the current value, without a channel: for a reader that only compares (pebblelog's
// durable reads), so that it does not make Advance close a channel nobody waits on.
func (h *Head) Seq() uint64 { return h.seq.Load() }

func (h *Head) channel() <-chan struct{} {
	for {
		if h.stopped.Load() {
			return closed
		}
		if c := h.ch.Load(); c != nil {
			return *c
		}
		c := make(chan struct{})
		if h.ch.CompareAndSwap(nil, &c) {
			if h.stopped.Load() { // Stop ran between the check and the swap: it may have missed c
				h.wake()
			}
			return c
		}
	}
}

// Advance raises the value to seq (a lower seq changes nothing) and wakes every reader
// waiting on the channel of an earlier Load. Only one goroutine at a time may call it.
func (h *Head) Advance(seq uint64) {
	if seq <= h.seq.Load() {
		return
	}
	h.seq.Store(seq)
	h.wake()
}

// Stop wakes every reader, and makes every later Load return a closed channel: the log will
// not grow again (its store failed), so a reader must look at why instead of waiting.
func (h *Head) Stop() {
	h.stopped.Store(true)
	h.wake()
}

func (h *Head) wake() {
	if h.ch.Load() == nil { // nobody waits: the common case under load
		return
	}
	if c := h.ch.Swap(nil); c != nil {
		close(*c)
	}
}
