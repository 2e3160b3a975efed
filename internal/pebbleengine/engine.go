// Package pebbleengine is the Pebble engine of worklog's event-sourced backend: a
// pebblelog.Store (and, with Options.ArchiveDir, an archive of pruned events) behind
// internal/engine's seam. work.Open builds one and hands it to work's queue constructor, as
// postgres.Open does with the PostgreSQL engine: both engines live outside work and are
// built by a constructor call.
package pebbleengine

import (
	"context"
	"errors"
	"time"

	engineapi "github.com/worklog/worklog/internal/engine"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
)

// Engine adapts a pebblelog.Store to the engine seam. Beside engineapi.Engine it is a
// Pruner, a DurableHead, a value stager (StageValues), an after-pruner (AfterPrune) and a
// checkpointer (Checkpoint): work resolves them once, when the queue is built.
type Engine struct {
	st   *pebblelog.Store
	arch *archiver // with an archive (archive.go); nil without one
}

// Open opens the store in dir with so and, when archiveDir is not "", the archive writer
// there (on so.FS). A failure closes what it opened.
func Open(dir string, so *pebblelog.Options, archiveDir string) (*Engine, error) {
	st, err := pebblelog.Open(dir, so)
	if err != nil {
		return nil, err
	}
	e := &Engine{st: st}
	if archiveDir != "" {
		if e.arch, err = openArchiver(archiveDir, so.FS); err != nil {
			return nil, errors.Join(err, st.Close())
		}
	}
	return e, nil
}

// Store is the engine's store, for tests and the benchmarks' disk figures.
func (e *Engine) Store() *pebblelog.Store { return e.st }

type pebbleTxn struct {
	projection.Reader
	t *pebblelog.Txn
}

func (t pebbleTxn) Append(ev events.Event) error { return t.t.Append(ev) }

// ReserveSubmits is engineapi.SubmitReserver's: pebblelog.Txn.ReserveSubmits.
func (t pebbleTxn) ReserveSubmits(requests, bytes int) { t.t.ReserveSubmits(requests, bytes) }

func (e *Engine) Update(ctx context.Context, fn func(tx engineapi.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return closedAs(e.st.Update(ctx, func(t *pebblelog.Txn) error {
		return fn(pebbleTxn{Reader: t.Reader(), t: t})
	}))
}

func (e *Engine) View(ctx context.Context, fn func(projection.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return closedAs(e.st.ViewSnapshot(fn)) // one state: a prune may commit between two reads
}

func (e *Engine) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return closedAs(e.st.ReadLog(ctx, from, fn))
}

// ViewDurable is engineapi.DurableViewer's: pebblelog.Store.ViewDurable, work's read of an
// idempotent repeat without a trip through the writer.
func (e *Engine) ViewDurable(ctx context.Context, fn func(projection.Reader) error) (bool, error) {
	durable, err := e.st.ViewDurable(ctx, fn)
	return durable, closedAs(err)
}

// ReadFirst is engineapi.DurableViewer's: a keyed request always reads its key first. A new
// key costs one Get more, a Bloom-filtered miss in the memtable and the tables; a repeat
// then costs two or three Gets instead of a command through the writer and its syncer.
func (e *Engine) ReadFirst(bool) bool { return true }

// DurableHead is the store's durable sequence (engineapi.DurableHead, pebblelog.Store.Durable):
// Queue.Follow never hands out an event whose fsync has not returned.
func (e *Engine) DurableHead() (uint64, <-chan struct{}, error) {
	seq, grown, err := e.st.Durable()
	return seq, grown, err
}

func (e *Engine) Verify(ctx context.Context) ([]string, error) {
	p, err := e.st.Verify(ctx, pebblelog.VerifyOptions{})
	return p, closedAs(err)
}

func (e *Engine) Close() error { return errors.Join(e.st.Close(), e.arch.close()) }

// StageValues writes a command's large values to blob files before it is queued (work's
// engine.go).
func (e *Engine) StageValues(values ...[]byte) (func(), error) {
	release, err := e.st.StageValues(values...)
	return release, closedAs(err)
}

// Checkpoint writes a consistent copy of the store into dir (Queue.Checkpoint).
func (e *Engine) Checkpoint(dir string) error { return e.st.Checkpoint(dir) }

// AfterPrune compacts the log span a prune emptied, in the background
// (pebblelog.Store.CompactPrunedLater; docs/design.md §11, "Memory and disk").
func (e *Engine) AfterPrune() { e.st.CompactPrunedLater() }

// PruneGroup is one command of the writer (pebblelog.Txn.Prune); with an archive, the two
// phases of archive.go.
func (e *Engine) PruneGroup(ctx context.Context, before int64, limit int) (engineapi.PruneGroupResult, error) {
	if e.arch != nil {
		return e.pruneArchived(ctx, before, limit)
	}
	var r pebblelog.PruneResult
	var held time.Duration
	err := e.Update(ctx, func(tx engineapi.Txn) error {
		var err error
		start := time.Now()
		r, err = tx.(pebbleTxn).t.Prune(before, limit) // set afresh: the closure may run twice
		held = time.Since(start)
		return err
	})
	if err != nil {
		return engineapi.PruneGroupResult{}, err
	}
	return engineapi.PruneGroupResult{Tasks: r.Tasks, Wakes: r.Wakes, Events: r.Events, More: r.More, Held: held}, nil
}

// closedAs maps the store's closed error to engineapi.ErrClosed (work.ErrClosed), so callers
// see one closed sentinel.
func closedAs(err error) error {
	if errors.Is(err, pebblelog.ErrClosed) {
		return errors.Join(engineapi.ErrClosed, err)
	}
	return err
}
