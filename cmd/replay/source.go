package main

import (
	"context"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
)

// store is what replay reads: a Pebble store opened read-only (*pebblelog.Store) or a
// PostgreSQL queue read through one read-only snapshot (*pgStore, open_postgres.go). The
// commands see only this, so they print the same output for the same log on either.
type store interface {
	LastSeq() (uint64, error)
	// View calls fn with the stored projection, values (inputs, payloads) filled.
	View(fn func(projection.Reader) error) error
	Event(seq uint64) (events.Event, error)
	RawEvent(seq uint64) ([]byte, bool, error)
	ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error
	ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error
	// FoldRange is ReadRange for a caller that keeps no event (Pebble's may reuse memory).
	FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error
	RawLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error
	Sessions(ctx context.Context, fn func(session string) error) error
	SessionSeqs(ctx context.Context, session string, from uint64, fn func(seq uint64) error) error
	SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error
	ScanTasks(ctx context.Context, fn func(*projection.Task) error) error
	ScanWakes(ctx context.Context, fn func(*projection.Wake) error) error
	DiskUsage() (uint64, error)
	Verify(ctx context.Context, vo pebblelog.VerifyOptions) ([]string, error)
	Close() error
}

var _ store = (*pebblelog.Store)(nil)
