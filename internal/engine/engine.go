// Package engine is the storage seam under worklog's event-sourced queue: a log of events and
// the projection folded from it. Package work's decide code runs on any Engine, so the
// in-memory queue, the Pebble store and the PostgreSQL backend behave alike by construction.
//
// It is internal: the seam may change with the decide code. An engine becomes a *work.Queue
// through one constructor, NewQueue, which work's in-memory engine (NewInMemory), work.Open
// (the Pebble engine of internal/pebbleengine) and postgres.Open (the PostgreSQL engine of
// package postgres) use alike: both durable engines live outside work and are built by a
// constructor call. Package work sets NewQueue in its init, so that work's exported API names
// none of this package's types.
package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Engine is a log of events and the projection folded from it.
type Engine interface {
	// Update runs fn alone against the latest state. The events fn appends through tx are
	// applied to the projection as they are appended (so fn reads its own writes) and commit
	// atomically with it when fn returns nil: durably, for a durable engine, before Update
	// returns. If fn returns an error nothing it appended is kept.
	//
	// fn may run more than once, and only its last run counts: pebblelog's writer runs the
	// commands of a group against one shared batch, and when one of them fails it discards
	// the batch and re-runs each command alone, against a state that may lack what the
	// commands before it wrote. So fn must set everything it reports (its outputs, its
	// domain error) afresh at its start, and carry nothing over from an earlier run.
	Update(ctx context.Context, fn func(tx Txn) error) error
	// View runs fn against a consistent read of committed state.
	View(ctx context.Context, fn func(r projection.Reader) error) error
	// ReadLog calls fn for each event with seq >= from, in order, until fn returns an error.
	ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error
	// Verify rebuilds the projection from the log and lists every difference from the
	// stored one; it also checks the log is gap-free and decodes.
	Verify(ctx context.Context) ([]string, error)
	Close() error
}

// Txn is the write side of one command.
type Txn interface {
	projection.Reader
	// Append assigns the next sequence number to ev, applies it to the projection and adds it
	// to the command's batch.
	Append(ev events.Event) error
}

// KeyPrefetcher is a Txn whose reads are round trips (PostgreSQL's): a command that will read
// many task idempotency keys of one session (the ticks a claim submits: work.submitTicks)
// names them first, and they are read in one statement; TaskKey then answers them without a
// read. A Txn without it (Pebble's, memory's) reads each when asked.
type KeyPrefetcher interface {
	PrefetchTaskKeys(sessionID string, keys []string) error
}

// NewKeyPrefetcher is a Txn whose reads are round trips: a command that will look up many
// task keys of one session it expects to be new (a batch submit: work.SubmitMany) names them
// first, and the Txn reads them in one statement where it would have read each, or, where
// it takes a new key as absent without a read (PostgreSQL's group run before the lock: its
// insert proves it), reads none. TaskKey answers the same either way.
type NewKeyPrefetcher interface {
	PrefetchNewTaskKeys(sessionID string, keys []string) error
}

// NewQueue is a *work.Queue over e, configured by c: package work sets it in its init (this
// package cannot name work's types, since work imports it), so it is set wherever a caller
// can name *work.Queue. Callers assert the result: engine.NewQueue(e, c).(*work.Queue).
var NewQueue func(e Engine, c Config) any

// SubmitReserver is a Txn that sizes what it writes ahead (Pebble's batch): a command about to
// submit requests tasks whose requests hold bytes of values and text in all (a batch submit:
// work.SubmitMany) says so first, so that the Txn does not grow its buffer again and again.
type SubmitReserver interface {
	ReserveSubmits(requests, bytes int)
}

// Config is what a queue over an Engine needs besides the engine.
type Config struct {
	MaxValueBytes int       // the largest input, payload or output accepted, in bytes
	Entropy       io.Reader // randomness for ids and lease tokens; nil: crypto/rand
	// OwnedValueMin: the engine's reads hand out values longer than this that nothing else
	// references, so snapshots may take them without a copy; 0: every value is copied.
	OwnedValueMin int
	// OwnedOutputMin: likewise for a task's output read by the decide code, from this length
	// on (0: always copied).
	OwnedOutputMin int
	// BorrowedInputMin: a task input longer than this that a command appends is copied by
	// the engine into what it writes (a batch, a transaction's rows) before the command's
	// Update returns, and kept nowhere once it has: so the queue passes the caller's own
	// bytes to the command instead of a copy of them (a SubmitMany of 64 MiB costs 64 MiB
	// less). 0: every input is copied first (the in-memory engine keeps them in its state).
	BorrowedInputMin int
	// Retention > 0 starts the queue's background pruner (work's loop, the one every backend
	// runs), with PruneInterval and Logger: work.Options' fields of the same names.
	Retention, PruneInterval time.Duration
	Logger                   *slog.Logger
	// Clock is the queue's clock: every method without an At twin's time, the background
	// pruner and a waiter's timer read it (nil: the host's wall clock). A backend shared by
	// several hosts supplies one clock for all of them (postgres: the server's).
	Clock func() time.Time
}

// Watcher is implemented by an engine whose state other processes also change (PostgreSQL):
// Changed returns a channel that receives a value after a commit of another process may have
// made work claimable (a task submitted, released or canceled, a wake recorded, a lease
// changed). The queue's waiters wake on it as they wake on this process's own commits; a
// spurious value is harmless, a missed one only delays a waiter until its timer.
type Watcher interface {
	Changed() <-chan struct{}
}

// WaiterWatcher is a Watcher that may stop hearing other processes' commits while this
// process has no waiter (PostgreSQL: their commits then send it no notification). The
// queue calls WatchWaiters once, with waiting, which reports whether a waiter waits now;
// and Waiting whenever a waiter starts to wait, before it reads the state it waits on. From
// then on the engine must report every other process's commit: when it was not listening,
// it listens again and sends Changed once it does (the waiter then reads again).
type WaiterWatcher interface {
	Watcher
	WatchWaiters(waiting func() bool)
	Waiting()
}

// Pruner is implemented by an engine that can prune history (Queue.Prune). What is prunable
// is decided by projection's rule (projection.Task.PruneAt, Wake.PruneAt, PrunableBefore),
// never restated by an engine: a State-based engine removes a subject with
// projection.PruneSubject. An engine without it answers Queue.Prune with an ErrBackend
// error wrapping ErrPruneNotSupported.
type Pruner interface {
	// PruneGroup removes up to limit subjects prunable before before (Unix nanoseconds),
	// oldest first, each whole with its events, atomically: a crash keeps all of a group or
	// none of it. Queue.Prune calls it until More is false, so a large prune is many small
	// commands beside normal traffic. Like Update's fn, it may be retried: it reports only
	// what its committed group removed.
	PruneGroup(ctx context.Context, before int64, limit int) (PruneGroupResult, error)
}

// PruneGroupResult is what one PruneGroup removed.
type PruneGroupResult struct {
	Tasks, Wakes int           // records removed (a task's completion wake counts as a wake)
	Events       uint64        // events removed from the live log
	More         bool          // the group was full: more may be prunable before the same time
	Held         time.Duration // how long the group held the single writer, when the engine knows (Queue.Prune paces by it)
}

// ErrClosed is work.ErrClosed, set by work's init with NewQueue: the engines outside work
// (pebbleengine) wrap it in the error of a call after Close.
var ErrClosed error

// ErrPruneNotSupported is the cause of Queue.Prune's error on an engine without Pruner.
var ErrPruneNotSupported = errors.New("engine: this backend does not support pruning (it implements no engine.Pruner)")

// DurableHead is implemented by an engine that knows how far its log is durable (the
// in-memory engine: every committed event; Pebble: every event whose batch's fsync returned).
// Queue.Follow hands out events up to that sequence only, and waits on grown for more: grown
// is closed once the head may have grown past seq, or the engine failed (err, from then on).
// It is taken before seq is read, so a follower that reads up to seq and then waits on grown
// misses nothing.
//
// An engine without it (PostgreSQL) must show in ReadLog only committed events, as a prefix of
// the log, and announce other processes' commits through Watcher: its followers wake on this
// queue's own commits and on Watcher's values, and read to the end of the log.
type DurableHead interface {
	DurableHead() (seq uint64, grown <-chan struct{}, err error)
}

// Inbox is implemented by an engine into which other transactions commit submissions for the
// queue (PostgreSQL: postgres.SubmitTx, inside the application's own transaction). The
// submission is decided in that transaction (InboxEncoder: its id and time drawn, its key
// reserved), and the engine takes it into the log before any reader or claim of the queue
// could miss it. The queue also runs one ingest loop, woken by InboxReady, which asks the
// engine to take submissions in promptly, and decides the rows an older build left undecided
// (TakeInbox) with Submit's rules.
type Inbox interface {
	// SetInboxEncoder is called once, by the queue built over the engine, before the engine
	// is used: the engine's SubmitTx calls enc.
	SetInboxEncoder(enc InboxEncoder)
	// InboxReady receives a value after a submission may have been committed to the inbox,
	// and once when the engine starts (for rows committed while no queue ran). A spurious
	// value costs one empty take.
	InboxReady() <-chan struct{}
	// InboxPending reports whether the inbox may hold a row, by a read outside the writer: an
	// empty inbox (the pass at start, a spurious value) costs no writer command.
	InboxPending(ctx context.Context) (bool, error)
	// TakeInbox, called with the tx of an Update's fn, takes the decided submissions in (the
	// engine appends their events), then deletes up to n undecided rows (an older build's) no
	// other transaction holds, oldest first, and returns them: they are gone exactly when tx
	// commits. A row whose bytes do not decode is not returned: the engine moves it aside
	// (kept and reported, never dropped) in the same transaction.
	TakeInbox(tx Txn, n int) ([]InboxEntry, error)
	// RejectInbox moves an entry TakeInbox returned aside, with the reason it cannot be taken
	// in (it decodes but breaks a rule), in tx: kept and reported like an undecodable row.
	RejectInbox(tx Txn, e InboxEntry, reason error) error
}

// InboxEncoder validates a submission (a *work.TaskRequest for sessionID) with Submit's rules
// and decides it as a new task at the queue's clock's time; its error is the *work.Error
// Submit would return.
type InboxEncoder func(sessionID string, request any) (*InboxSubmission, error)

// InboxSubmission is a submission decided by the queue, to be stored by the engine.
type InboxSubmission struct {
	Event *events.TaskSubmitted // its task_submitted event, id and time set (Seq: a placeholder)
	Body  []byte                // Event encoded
	Task  any                   // the work.Task it is, when its key names no task
	// Existing answers when the key already names t: that task (a work.Task) for the same
	// intent, else the *work.Error of the conflict.
	Existing func(t *projection.Task) (any, error)
}

// InboxEntry is one undecided submission taken from the inbox (an older build's): the row's
// id, and the request as the body of a task_submitted event (TaskID and At are placeholders:
// the decide code draws the id and takes the time when it takes the row in).
type InboxEntry struct {
	Row       int64
	Submitted *events.TaskSubmitted
}

// DurableViewer is implemented by an engine that can answer a read of committed, durable
// state outside its single writer (PostgreSQL: with synchronous_commit on, a transaction is
// visible to others only after its commit record is flushed, and the writer's groups commit
// before they answer). work answers an idempotent repeat of Submit or RequestWake with it,
// without a write or a trip through the writer (issue 24, W3).
//
// ViewDurable runs fn against committed state; durable reports that everything fn could have
// read is durable (a crash loses none of it), so an answer built from it may be given without
// a write. Unlike View, the reads of one call need not be one snapshot (the PostgreSQL engine
// runs each as its own statement): each sees committed state at least as new as the read
// before it. That is enough for what it is used for: an idempotency key, which once written
// names its record for as long as the key exists, and that record. Only TaskKey, WakeKey,
// Task and Wake need be supported; the other reads may fail.
//
// ReadFirst reports whether a keyed Submit (RequestWake: wake) should read its key first: an
// engine whose writer can take a new key in one round trip without reading it (PostgreSQL's
// fast path, which takes an unread key as absent and lets its commit prove it) says no while
// repeats are rare, since reading first makes a new key cost a round trip more; a repeat then
// costs more than a read, so it says yes for a while after it has seen one.
type DurableViewer interface {
	ViewDurable(ctx context.Context, fn func(projection.Reader) error) (durable bool, err error)
	ReadFirst(wake bool) bool
}

// Forwarder is an engine that may have another process run a worker's round
// (Queue.SettleAndClaimAt) for it: PostgreSQL's shared writer (postgres.Options.SharedWriter),
// where the processes of one queue elect one whose writer runs every process's rounds, so
// that they commit in one group stream instead of taking turns on the log head.
//
// work encodes the round (req) and decodes the answer; the engine only carries bytes. ok
// false: no other process took the round (none is elected, this one is, or it could not be
// reached before the round was sent), and work runs it here. An error with ok true: the
// round was sent and its outcome is unknown (the connection failed, or ctx ended, before the
// answer came); the caller gets it, as when a COMMIT's answer is lost.
//
// CanForward reports whether a round offered now would be sent (a connection to the
// elected process is up): work encodes a round only then, so a process that forwards
// nothing (the option off, or the elected one itself) pays one check a round.
//
// SetForwardServer is called once, before the queue is used, with the function that runs a
// round another process sent here and encodes its answer.
type Forwarder interface {
	CanForward() bool
	Forward(ctx context.Context, req []byte) (resp []byte, ok bool, err error)
	SetForwardServer(serve func(ctx context.Context, req []byte) ([]byte, error))
}
