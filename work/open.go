package work

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	engineapi "github.com/worklog/worklog/internal/engine"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
)

// Open opens (or creates) a durable queue in dir. A missing or empty directory becomes a new
// store. A refusal is an ErrBackend error wrapping a *pebblelog.OpenError (errors.As), whose
// kind says why: a non-empty directory that is not a worklog store (pebblelog.ErrNotAStore),
// a store of a newer format (ErrFormatTooNew), a store another process holds open
// (ErrLocked), a store with a missing or damaged file (ErrCorruptStore, which names the
// file), a directory that cannot be written (ErrReadOnlyStore). A refused Open changes none
// of the store's files. Invalid options give ErrInvalidRequest naming the field
// ("options.MaxValueBytes", "options.MemTableSize"), before dir is touched, and so does a
// dir shaped like a URL ("postgres://…", any "scheme://…"; Field "dir"): a PostgreSQL queue
// is opened with postgres.Open.
//
// Open does not replay the log: the projection is on disk. With the default SyncAlways every
// call returns only after its events are fsynced, and a crash of the process or the machine
// loses no acknowledged call.
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
	st, err := pebblelog.Open(dir, &so)
	if err != nil {
		return nil, backendErr(err)
	}
	pe := &pebbleEngine{st: st}
	if o.ArchiveDir != "" { // archive.go
		if pe.arch, err = openArchiver(o.ArchiveDir, so.FS); err != nil {
			return nil, backendErr(errors.Join(err, st.Close()))
		}
	}
	return NewEngineQueue(pe, engineapi.Config{MaxValueBytes: o.MaxValueBytes,
		Entropy: o.Entropy, OwnedValueMin: pebblelog.OwnedValueMin, OwnedOutputMin: pebblelog.OwnedOutputMin,
		Retention: o.Retention, PruneInterval: o.PruneInterval, Logger: o.Logger}), nil
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
	if b.caps.pebble == nil {
		return backendErr(errors.New("checkpoint needs a durable queue (Open)"))
	}
	return backendErr(b.caps.pebble.st.Checkpoint(dir))
}

// pebble is the Pebble engine under q, for the tests and benchmarks.
func (q *Queue) pebble() (*pebbleEngine, bool) {
	lb, ok := q.b.(*logBackend)
	if !ok || lb.caps.pebble == nil {
		return nil, false
	}
	return lb.caps.pebble, true
}

// pebbleEngine adapts a pebblelog.Store to the engine seam.
type pebbleEngine struct {
	st   *pebblelog.Store
	arch *archiver // Options.ArchiveDir (archive.go); nil without one
}

type pebbleTxn struct {
	projection.Reader
	t *pebblelog.Txn
}

func (t pebbleTxn) Append(ev events.Event) error { return t.t.Append(ev) }

func (e *pebbleEngine) Update(ctx context.Context, fn func(tx txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return closedAs(e.st.Update(ctx, func(t *pebblelog.Txn) error {
		return fn(pebbleTxn{Reader: t.Reader(), t: t})
	}))
}

func (e *pebbleEngine) View(ctx context.Context, fn func(projection.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return closedAs(e.st.ViewSnapshot(fn)) // one state: a prune may commit between two reads
}

func (e *pebbleEngine) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return closedAs(e.st.ReadLog(ctx, from, fn))
}

// DurableHead is the store's durable sequence (engineapi.DurableHead, pebblelog.Store.Durable):
// Queue.Follow never hands out an event whose fsync has not returned.
func (e *pebbleEngine) DurableHead() (uint64, <-chan struct{}, error) {
	seq, grown, err := e.st.Durable()
	return seq, grown, err
}

func (e *pebbleEngine) Verify(ctx context.Context) ([]string, error) {
	p, err := e.st.Verify(ctx, pebblelog.VerifyOptions{})
	return p, closedAs(err)
}

func (e *pebbleEngine) Close() error { return errors.Join(e.st.Close(), e.arch.close()) }

// StageValues writes a command's large values to blob files before it is queued (engine.go).
func (e *pebbleEngine) StageValues(values ...[]byte) (func(), error) {
	release, err := e.st.StageValues(values...)
	return release, closedAs(err)
}

// closedAs maps the store's closed error to ErrClosed, so callers see one closed sentinel.
func closedAs(err error) error {
	if errors.Is(err, pebblelog.ErrClosed) {
		return errors.Join(ErrClosed, err)
	}
	return err
}
