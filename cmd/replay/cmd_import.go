package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
)

// exportWire writes the whole log of the store dir names to stdout as a wire log.
func (a *app) exportWire(c *cobra.Command, dir string) error {
	if f, ok := a.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return usagef(c, "--wire writes binary: redirect it to a file (replay export %s --wire > store.wlog)", dir)
	}
	st, err := openStore(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	return a.writeWire(c.Context(), st, dir)
}

// writeWire writes st's whole log to a.out as a wire log.
func (a *app) writeWire(ctx context.Context, st store, dir string) error {
	last, err := st.LastSeq(ctx)
	if err != nil {
		return readError(dir, err)
	}
	// The pruned ranges go into the file in their places (version 2), so that the importing
	// store records them: its Verify explains the gaps, and its replay shows them.
	pruned, err := st.PrunedRanges(ctx)
	if err != nil {
		return readError(dir, err)
	}
	ww, err := newWireWriter(a.out, pruned)
	if err != nil {
		return err
	}
	p := a.newProgress("exporting", false)
	err = st.RawLog(ctx, 1, last, func(seq uint64, raw []byte) error {
		p.update(seq, last)
		return ww.event(seq, raw)
	})
	p.finish()
	if err == nil {
		err = ww.finish(last)
	}
	if errors.Is(err, errUndeclaredGap) {
		// A queue that prunes while export reads (a PostgreSQL queue's processes may run)
		// leaves a gap the ranges read first do not hold: that is not damage.
		if now, rerr := st.PrunedRanges(ctx); rerr == nil && !slices.Equal(now, pruned) {
			return fmt.Errorf("%s was pruned while export read it (the log lacks events that were there when it began): stop the queue's processes and export again", dir)
		}
	}
	if err != nil {
		return readError(dir, err)
	}
	return nil
}

const importLong = `Load a wire log (written by replay export --wire) into an empty store: a Pebble store
directory (created when missing; it must be new or empty) or a PostgreSQL queue named by a
postgres:// URL (its schema, worklog or the one the URL's search_path names, created when
missing; it must hold no events). FILE - reads standard input.

Every event keeps its sequence number and bytes, and is folded into the new store's
projection by the same code (projection.Apply) as when it was first written, through the
store's own writer: so the imported store reads the same tasks and wakes, and its leases
fence the same lease tokens. Events are appended in groups, each one transaction; when all
are in, import verifies the store (as replay verify does).

A log that was pruned (Queue.Prune) moves with its pruned ranges: the new store records
them as pruned, so it reads, verifies and goes on pruning as the old one did. A gap in the
log that no pruned range declares is refused, naming the missing sequence.

An import into a store that already holds events is refused: sequence numbers must stay
the ones they were. If an import fails part way (a truncated file, a lost connection), the
store holds a prefix of the log, consistent but incomplete: remove it (the directory, or
DROP SCHEMA ... CASCADE) and import again.

Stop the queue's processes, export, import, then point them at the new store: events
written to the old store after the export are not in the new one.`

// importGroup is how many events one transaction of an import appends.
const importGroup = 1024

func (a *app) importCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "import FILE DEST",
		Short: "Load a wire log (export --wire) into an empty Pebble store or PostgreSQL queue",
		Long:  importLong,
		Example: `  replay export ./store --wire > store.wlog
  replay import store.wlog 'postgres://worklog@db.internal/jobs?search_path=queue1'
  replay export 'postgres://worklog@db.internal/jobs?search_path=queue1' --wire | replay import - ./store-copy`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef(c, "import needs FILE and DEST: replay import FILE DEST, got %q", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			return a.runImport(c.Context(), args[0], displayName(args[1]))
		},
	}
	return c
}

// sink is the destination of an import: the engine-level path of each backend that appends
// events which already have their sequence numbers, folding each as it goes, and records the
// ranges the source had pruned (projection.ImportSteps: both in sequence order).
type sink interface {
	lastSeq(ctx context.Context) (uint64, error)
	append(ctx context.Context, evs []events.Event, pruned []projection.SeqRange) error
	verify(ctx context.Context) ([]string, error)
	close() error
}

func (a *app) runImport(ctx context.Context, file, dest string) error {
	var in io.Reader = os.Stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return fmt.Errorf("%s: %v", file, unwrapPathError(err))
		}
		defer f.Close()
		in = f
	}
	wr, err := newWireReader(in)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	s, err := openSink(ctx, dest)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			s.close()
		}
	}()
	if last, err := s.lastSeq(ctx); err != nil {
		return fmt.Errorf("%s: %v", dest, err)
	} else if last > 0 {
		return fmt.Errorf("%s already holds %s (seq 1..%d): import loads a log only into an empty store, so that every event keeps its sequence number; import into a new directory or a new schema",
			dest, plural(int(last), "event", "events"), last)
	}
	p := a.newProgress("importing", false)
	var group []events.Event
	var groupPruned []projection.SeqRange
	var n, last, from uint64 // events appended, the last sequence read, the group's first
	var pruned projection.SeqRanges
	flush := func() error {
		if len(group) == 0 && len(groupPruned) == 0 {
			return nil
		}
		if err := s.append(ctx, group, groupPruned); err != nil {
			return fmt.Errorf("%s: appending seq %d..%d: %w", dest, from, last, err)
		}
		group, groupPruned = group[:0], groupPruned[:0]
		return nil
	}
	for {
		rec, err := wr.read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil {
			if len(group) == 0 && len(groupPruned) == 0 {
				from = last + 1
			}
			if rec.ev != nil {
				group = append(group, rec.ev)
				n++
				last = rec.ev.Head().Seq
			} else {
				groupPruned = append(groupPruned, rec.pruned)
				pruned = append(pruned, rec.pruned)
				last = rec.pruned.To
			}
			p.update(n, 0)
			if len(group) == importGroup || len(groupPruned) == importGroup {
				err = flush()
			}
		} else {
			err = fmt.Errorf("%s: %w", file, err)
		}
		if err != nil {
			p.finish()
			if last > 0 {
				if done, lerr := s.lastSeq(ctx); lerr == nil && done > 0 {
					err = fmt.Errorf("%w; %s now holds seq 1..%d, a consistent prefix of the log: remove it and import again", err, dest, done)
				}
			}
			return err
		}
	}
	if err := flush(); err != nil {
		p.finish()
		return err
	}
	p.finish()
	problems, err := s.verify(ctx)
	if err != nil {
		return fmt.Errorf("%s: verifying after the import: %v", dest, err)
	}
	closed = true
	if err := s.close(); err != nil {
		return fmt.Errorf("%s: %v", dest, err)
	}
	what := fmt.Sprintf("%s (seq 1..%d)", plural(int(n), "event", "events"), last)
	if len(pruned) > 0 {
		what = fmt.Sprintf("%s (seq 1..%d, and %s of %s recorded as pruned)", plural(int(n), "event", "events"), last,
			plural(len(pruned), "pruned range", "pruned ranges"), plural(int(pruned.Count()), "seq", "seqs"))
	}
	if len(problems) > 0 {
		fmt.Fprintf(a.out, "import into %s: %s appended, but verify FAILED, %s:\n", dest, what, plural(len(problems), "problem", "problems"))
		for _, p := range problems {
			fmt.Fprintf(a.out, "  %s\n", p)
		}
		return exitCode(exitFindings)
	}
	fmt.Fprintf(a.out, "import into %s: ok. %s appended and folded; verify: the stored projection equals a rebuild from the log.\n", dest, what)
	return nil
}

func openSink(ctx context.Context, dest string) (sink, error) {
	if isPostgresURL(dest) {
		dsn := dest
		if raw, ok := rawURLs.Load(dest); ok {
			dsn = raw.(string)
		}
		im, err := postgres.OpenImporter(ctx, dsn)
		if err != nil {
			return nil, fmt.Errorf("cannot open the queue at %s: %v", dest, err)
		}
		return pgSink{im}, nil
	}
	st, err := pebblelog.Open(dest, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot open a store in %s: %v", dest, err)
	}
	return pebbleSink{st}, nil
}

type pgSink struct{ im *postgres.Importer }

func (s pgSink) lastSeq(ctx context.Context) (uint64, error) { return s.im.LastSeq(ctx) }
func (s pgSink) append(ctx context.Context, evs []events.Event, pruned []projection.SeqRange) error {
	return s.im.AppendLog(ctx, evs, pruned)
}
func (s pgSink) verify(ctx context.Context) ([]string, error) { return s.im.Verify(ctx) }
func (s pgSink) close() error                                 { return s.im.Close() }

// pebbleSink appends through pebblelog's writer (Store.AppendLog: Store.Update, Txn.Append):
// the path every command's events take, here given events that already have their sequence
// numbers.
type pebbleSink struct{ st *pebblelog.Store }

func (s pebbleSink) lastSeq(ctx context.Context) (uint64, error) { return s.st.LastSeq(ctx) }

func (s pebbleSink) append(ctx context.Context, evs []events.Event, pruned []projection.SeqRange) error {
	return s.st.AppendLog(ctx, evs, pruned)
}

func (s pebbleSink) verify(ctx context.Context) ([]string, error) {
	return s.st.Verify(ctx, pebblelog.VerifyOptions{})
}
func (s pebbleSink) close() error { return s.st.Close() }
