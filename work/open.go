package work

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"

	engineapi "github.com/worklog/worklog/internal/engine"

	"github.com/worklog/worklog/internal/inspect"
	"github.com/worklog/worklog/internal/pebbleengine"
	"github.com/worklog/worklog/pebblelog"
)

// Open opens (or creates) a durable queue in dir. A missing or empty directory becomes a new
// store. A refusal is an ErrBackend error wrapping a *pebblelog.OpenError (errors.As), whose
// kind says why: a non-empty directory that is not a worklog store (pebblelog.ErrNotAStore),
// a store of a newer format (ErrFormatTooNew), a store another process holds open
// (ErrLocked), a store with a missing or damaged file (ErrCorruptStore, which names the
// file), a directory that cannot be written (ErrReadOnlyStore). A refused Open changes none
// of the store's files. Invalid options give an *OptionError (ErrInvalidOptions) naming the
// field (Options "work.Options", Field "MaxValueBytes"), before dir is touched; a blank dir,
// or one shaped like a URL ("postgres://…", any "scheme://…"), is ErrInvalidRequest with
// Field "dir": a PostgreSQL queue is opened with postgres.Open.
//
// While the queue is open, Open serves a read-only inspection endpoint for this user only
// (a Unix socket found from dir; Options.NoInspect turns it off): the replay tool reads the
// live store through it (replay stats DIR, replay log --follow DIR, replay serve DIR...),
// which the store's lock keeps any other process from opening. Close stops it first.
//
// Open does not replay the log: the projection is on disk. With the default SyncAlways every
// call returns only after its events are fsynced, and a crash of the process or the machine
// loses no acknowledged call.
//
// The store's directory removed while the queue is open (rm -rf) fails the queue: every call
// then returns ErrBackend (wrapping pebblelog.ErrStoreFailed, "the store's directory was
// removed"), Close too. On Linux no call that began after the removal is acknowledged (before
// it answers each group commit the writer checks that the directory it holds open still has
// links: one fstat per group). The directory moved away or replaced by another, or
// WORKLOG.lock removed or replaced, and a removal on other systems, are noticed by a check
// every 100 ms: a call that began more than 100 ms after it is never acknowledged; one that
// began within those 100 ms may be, into files no longer in the directory.
func Open(dir string, opts *Options) (*Queue, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	if blank(dir) {
		return nil, invalid("dir", "must not be blank")
	}
	if err := checkNotURL(dir); err != nil {
		return nil, err
	}
	if err := checkArchiveDir(dir, o.ArchiveDir); err != nil {
		return nil, err
	}
	so := o.storeOptions()
	pe, err := pebbleengine.Open(dir, &so, o.ArchiveDir)
	if err != nil {
		return nil, backendErr(err)
	}
	q := newEngineQueue(pe, engineapi.Config{MaxValueBytes: o.MaxValueBytes,
		Entropy: o.Entropy, OwnedValueMin: pebblelog.OwnedValueMin, OwnedOutputMin: pebblelog.OwnedOutputMin,
		BorrowedInputMin: pebblelog.OwnedValueMin, // the batch copies it; the writer forgets it (input.go)
		Retention:        o.Retention, PruneInterval: o.PruneInterval, Logger: o.Logger})
	if !o.NoInspect {
		q.stopInspect = serveInspect(dir, pe.Store(), o.Logger)
	}
	return q, nil
}

// serveInspect starts the inspection endpoint of the store in dir (Options.NoInspect) and
// returns what stops it, or nil when it could not start: the queue works without it, and
// logger says why.
func serveInspect(dir string, st *pebblelog.Store, logger *slog.Logger) func() error {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil // a store on a filesystem of its own (Options.FS): no directory to serve from
	}
	srv, err := inspect.Serve(dir, st, logger)
	if err != nil {
		if logger != nil {
			logger.Warn("worklog: no inspection endpoint: replay cannot read this store while the queue is open", "dir", dir, "err", err)
		}
		return nil
	}
	return srv.Close
}

// urlScheme matches the scheme of a URL-shaped dir: a scheme of two or more characters
// followed by "//" (a one-letter scheme is a Windows drive, "C:\store"), or any postgres
// scheme ("postgres:db" is a DSN too). A colon alone is a legal character of a directory
// name ("data:2024"), so that is not refused.
var urlScheme = regexp.MustCompile(`^(?i:([a-z][a-z0-9+.\-]+)://|(postgres(?:ql)?):)`)

// checkNotURL refuses a dir that is a URL: Open would take "postgres://…" for a relative
// path and make a store in ./postgres:/… (issue 26.5). The error names the scheme only: a
// DSN may hold a password.
func checkNotURL(dir string) error {
	m := urlScheme.FindStringSubmatch(dir)
	if m == nil {
		return nil
	}
	scheme := strings.ToLower(m[1] + m[2])
	msg := fmt.Sprintf("is a URL (scheme %q), not a directory", scheme)
	if scheme == "postgres" || scheme == "postgresql" {
		msg += "; open a PostgreSQL queue with postgres.Open"
	}
	return invalid("dir", msg)
}

// Checkpoint writes a consistent copy of a durable queue's store into dir (which must not
// exist) while the queue keeps running; files are hard-linked where possible. Open the copy,
// or point the replay tool at it: a live store cannot be opened by a second process.
func (q *Queue) Checkpoint(dir string) error {
	if q.closed.Load() {
		return backendErr(ErrClosed)
	}
	if q.caps.checkpoint == nil {
		return unsupported("Queue.Checkpoint", "Checkpointer")
	}
	return wrap(q.caps.checkpoint.Checkpoint(dir))
}

// Checkpoint is Queue.Checkpoint on worklog's backend: only the Pebble engine has one.
func (b *logBackend) Checkpoint(dir string) error {
	if b.caps.checkpoint == nil {
		return backendErr(errors.New("checkpoint needs a durable queue (Open)"))
	}
	return backendErr(b.caps.checkpoint.Checkpoint(dir))
}

// pebble is the Pebble engine under q, for the tests and benchmarks.
func (q *Queue) pebble() (*pebbleengine.Engine, bool) {
	lb, ok := q.b.(*logBackend)
	if !ok {
		return nil, false
	}
	pe, ok := lb.eng.(*pebbleengine.Engine)
	return pe, ok
}
