package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/inspect"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
)

// openStore opens dir read-only and turns every way that can fail into one clear sentence
// that names the directory. Nothing is written into dir except the lock files WORKLOG.lock
// and LOCK, which the locks themselves create; on a directory replay cannot write (a
// read-only mount, a backup, another user's store) nothing at all (see pebblelog.Open).
//
// A postgres:// or postgresql:// URL opens that PostgreSQL queue instead (openPostgres).
func openStore(dir string) (store, error) {
	if isPostgresURL(dir) {
		return openPostgres(dir)
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: no such directory", dir)
	case err != nil:
		return nil, fmt.Errorf("%s: %v", dir, unwrapPathError(err))
	case !fi.IsDir():
		return nil, fmt.Errorf("%s is a file, not a worklog store directory", dir)
	}
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true, CacheSize: 32 << 20})
	if err == nil {
		return st, nil
	}
	var oe *pebblelog.OpenError
	if !errors.As(err, &oe) {
		return nil, fmt.Errorf("cannot open the store in %s: %v", dir, err)
	}
	switch oe.Kind {
	case pebblelog.ErrLocked:
		// Held by a running process: read the live store through its inspection endpoint
		// (work.Options.NoInspect).
		c, derr := inspect.Dial(context.Background(), dir)
		if derr != nil {
			return nil, lockedError(dir, derr)
		}
		return c, nil
	case pebblelog.ErrFormatTooNew:
		return nil, fmt.Errorf("%s was written by a newer worklog: store %s: build replay from that worklog version or later", dir, oe.Detail)
	case pebblelog.ErrFormatTooOld:
		return nil, fmt.Errorf("%s was written by an earlier development build of worklog: store %s%s", dir, oe.Detail, hint(oe))
	case pebblelog.ErrNotAStore:
		return nil, fmt.Errorf("%s is not a worklog store: %s%s", dir, oe.Detail, hint(oe))
	case pebblelog.ErrCorruptStore:
		what := oe.Detail
		if oe.File != "" {
			what = oe.File + ": " + what
		}
		if oe.Err != nil {
			what += ": " + oe.Err.Error()
		}
		return nil, fmt.Errorf("%s is a damaged worklog store: %s%s", dir, what, hint(oe))
	}
	if errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("%s: permission denied (replay needs to read the store)", dir)
	}
	if oe.Err != nil {
		return nil, fmt.Errorf("cannot open the store in %s: %s: %v", dir, oe.Detail, unwrapPathError(oe.Err))
	}
	return nil, fmt.Errorf("cannot open the store in %s: %s", dir, oe.Detail)
}

// hint is the advice of an open error, as a clause to end a sentence with.
func hint(oe *pebblelog.OpenError) string {
	if oe.Hint == "" {
		return ""
	}
	return "; " + oe.Hint
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func lockedError(dir string, derr error) error {
	why := fmt.Sprintf("its inspection endpoint did not answer (%v)", derr)
	if errors.Is(derr, fs.ErrNotExist) || errors.Is(derr, syscall.ECONNREFUSED) {
		why = "it serves no inspection endpoint (work.Options.NoInspect is set)"
	}
	return fmt.Errorf(`%s is open in a running process, and %s.
Pebble locks the store, even for reading, so replay cannot open it itself. work.Open serves the endpoint
for the process's own user unless Options.NoInspect is set; or take a checkpoint from inside that process
and point replay at the copy:

    // q is the process's *work.Queue; the destination must not exist yet.
    if err := q.Checkpoint("/path/to/copy"); err != nil { ... }

    replay verify /path/to/copy

work.Queue.Checkpoint writes a consistent copy while the queue keeps running (files are hard-linked where possible).
Or stop the process and run replay on %s itself`, dir, why, dir)
}

// readError explains a failure while reading the log: above all an event that does not
// decode, named by its sequence.
func readError(dir string, err error) error {
	var de *events.DecodeError
	if errors.As(err, &de) {
		return fmt.Errorf("%s: corrupt log: %v (replay verify %s lists every problem)", dir, de, dir)
	}
	if errors.Is(err, events.ErrCorrupt) || errors.Is(err, pebblelog.ErrCorruptRecord) {
		return fmt.Errorf("%s: corrupt store: %v (replay verify %s lists every problem)", dir, err, dir)
	}
	var ae *projection.ApplyError
	if errors.As(err, &ae) {
		return fmt.Errorf("%s: the log is inconsistent at seq %d (%s %s): %s; replay verify %s lists every problem",
			dir, ae.Seq, ae.Type, ae.ID, ae.Rule, dir)
	}
	return err
}

// progress writes a one-line, self-overwriting progress report to stderr, and only when
// stderr is a terminal (or --progress always): pipes and files never see it.
type progress struct {
	w       *os.File
	label   string
	started time.Time
	last    time.Time
	shown   bool
}

// newProgress returns a progress reporter, or nil (which reports nothing) when progress is
// not shown. A command that streams its output (log, export) shows no progress when that
// output goes to the same terminal: the lines themselves show it, and a progress line would
// garble them.
func (a *app) newProgress(label string, streaming bool) *progress {
	f, ok := a.stderr.(*os.File)
	switch a.progress {
	case "never":
		return nil
	case "auto":
		if !ok || !term.IsTerminal(int(f.Fd())) {
			return nil
		}
		if out, isFile := a.stdout.(*os.File); streaming && isFile && term.IsTerminal(int(out.Fd())) {
			return nil
		}
	}
	if !ok {
		return nil
	}
	now := time.Now()
	return &progress{w: f, label: label, started: now, last: now}
}

// update reports done of total (total 0: unknown), at most five times a second and never in
// the first half second.
func (p *progress) update(done, total uint64) {
	if p == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.last) < 200*time.Millisecond || now.Sub(p.started) < 500*time.Millisecond {
		return
	}
	p.last = now
	p.shown = true
	if total > 0 {
		fmt.Fprintf(p.w, "\r\033[Kreplay: %s: seq %d of %d (%d%%)", p.label, done, total, done*100/total)
	} else {
		fmt.Fprintf(p.w, "\r\033[Kreplay: %s: %d", p.label, done)
	}
}

// finish clears the progress line.
func (p *progress) finish() {
	if p == nil || !p.shown {
		return
	}
	fmt.Fprint(p.w, "\r\033[K")
}
