package pebblelog

import (
	"fmt"
	"time"
)

// Calls into Pebble, outside the writer, that can write or rotate the WAL (issue 25).
//
// Our writer is not the only goroutine of ours that rotates Pebble's WAL: a flush does it in
// its caller's goroutine (DB.Flush, and DB.Compact, which flushes a memtable that overlaps its
// range: CompactPruned after a prune, Tools.CompactRange, a new store's rotateFirstWAL), and a
// commit outside the writer may fill the memtable (the format key, the upgrade's).
// When the WAL write in flight fails meanwhile, DB.rotateWAL panics with DB.mu unlocked, a
// fatal runtime error that ended the host process (walFS). And a write to the WAL outside the
// writer (LogData: Checkpoint, the archive, removePrunedBlobs and Close with NoSync; the
// commits above) panics in DB.commitWrite once the WAL writer has failed, in the caller's
// goroutine, where nothing recovered it.
//
// So each such call runs through failures.call: in a goroutine of its own, counted in
// failures.calls, so that walFS parks it, like the writer inside a commit, where Pebble would
// panic fatally; a panic it can recover (commitWrite's) fails the store and marks the
// database parked (Pebble's commit mutex stays held). Its caller waits for it while the store
// is healthy, and once the store has failed only until a goroutine is parked (or at most the
// stall timeout): no caller, and no Close, waits for a parked goroutine. Close waits for the
// calls in flight before it closes the database (failures.idle), and leaves it open when one
// is parked.

// call runs fn (what names it in the failure) as described above and returns its error, or
// the store's failure when the store failed during the call.
func (f *failures) call(what string, fn func() error) error {
	done := make(chan error, 1)
	f.calls.Add(1)
	go func() {
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					f.parked.Store(true) // before the failure is published (see fatal)
					err = f.fail(fmt.Errorf("pebble panicked in %s: %v", what, p))
				}
			}()
			return fn()
		}()
		f.calls.Add(-1) // never, when fn parks: the count then stays up for good
		done <- err
	}()
	result := func(err error) error {
		if ferr := f.err(); ferr != nil {
			return ferr // Pebble answers a commit whose Fatalf returned with nil
		}
		return err
	}
	select {
	case err := <-done:
		return result(err)
	case <-f.ch:
	}
	// The store failed while fn runs: fn returns, or parks (walFS, fatal), or waits in Pebble
	// for a disk that does not answer.
	wait := f.stall
	if wait <= 0 {
		wait = DefaultStallTimeout
	}
	limit := time.NewTimer(wait)
	defer limit.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return result(err)
		case <-tick.C:
			if f.parked.Load() {
				return f.err()
			}
		case <-limit.C:
			return f.err()
		}
	}
}

// idle returns a channel closed once done is closed and no call is in flight (call): what
// Close waits for before it may close the database. While a call is parked it is never closed.
func (f *failures) idle(done <-chan struct{}) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		<-done
		for f.calls.Load() != 0 {
			if f.parked.Load() {
				return // the parked call never ends; Close does not close the database
			}
			time.Sleep(time.Millisecond)
		}
		close(ch)
	}()
	return ch
}
