package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
)

// isPostgresURL reports whether a store argument names a PostgreSQL queue rather than a
// directory.
func isPostgresURL(arg string) bool {
	return strings.HasPrefix(arg, "postgres://") || strings.HasPrefix(arg, "postgresql://")
}

// rawURLs maps the name replay prints for a PostgreSQL URL (its password masked) back to the
// URL itself, which only openStore sees.
var rawURLs sync.Map

// displayName is how replay names a store argument in its output and errors: a directory as
// given, a PostgreSQL URL with its password and every other secret replaced by xxxxx
// (redactDSN; put the password in PGPASSWORD or ~/.pgpass instead, which pgx reads, and
// nothing is masked).
func displayName(arg string) string {
	name := redactDSN(arg)
	if name != arg && isPostgresURL(arg) {
		rawURLs.Store(name, arg)
	}
	return name
}

// openPostgres opens the queue name (displayName of a postgres:// URL) through one read-only
// snapshot, and turns every way that can fail into one sentence naming it.
func openPostgres(name string) (store, error) {
	dsn := name
	if raw, ok := rawURLs.Load(name); ok {
		dsn = raw.(string)
	}
	ctx := context.Background()
	r, err := postgres.OpenReadOnly(ctx, dsn)
	if err == nil {
		return &pgStore{r: r, ctx: ctx, name: name}, nil
	}
	// pgx masks the passwords it quotes; a message that quotes the URL another way is
	// masked here too, so that no secret reaches the output whatever the error.
	msg := strings.ReplaceAll(err.Error(), dsn, name)
	switch {
	case errors.Is(err, postgres.ErrNotAQueue):
		return nil, fmt.Errorf("%s is not a worklog queue: %s", name, msg)
	case errors.Is(err, postgres.ErrFormatTooNew):
		return nil, fmt.Errorf("%s was written by a newer worklog: %s: build replay from that worklog version or later", name, msg)
	case errors.Is(err, postgres.ErrInvalidDSN):
		return nil, fmt.Errorf("%s: %s", name, msg)
	}
	return nil, fmt.Errorf("cannot read the queue at %s: %s", name, msg)
}

// pgStore is store over postgres.Store, whose connections are read-only. The queue's
// processes may go on writing while replay reads: a command reads the log up to the head it
// saw first (every snapshot of the log is a prefix of the next), and verify reads the log and
// the tables in one transaction.
type pgStore struct {
	r    *postgres.Store
	ctx  context.Context // for the reads whose store method takes none
	name string
}

var (
	_ store        = (*pgStore)(nil)
	_ prunedSource = (*pgStore)(nil)
)

func (s *pgStore) LastSeq() (uint64, error) { return s.r.LastSeq(s.ctx) }

func (s *pgStore) View(fn func(projection.Reader) error) error { return s.r.View(s.ctx, fn) }

func (s *pgStore) RawEvent(seq uint64) ([]byte, bool, error) {
	if seq == 0 {
		return nil, false, nil
	}
	last, err := s.LastSeq()
	if err != nil || seq > last {
		return nil, false, err
	}
	var raw []byte
	err = s.r.RawLog(s.ctx, seq, seq, func(_ uint64, b []byte) error { raw = b; return nil })
	if err != nil {
		return nil, false, err
	}
	return raw, raw != nil, nil
}

func (s *pgStore) Event(seq uint64) (events.Event, error) {
	raw, ok, err := s.RawEvent(seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w at seq %d: the event is missing", events.ErrCorrupt, seq)
	}
	return events.Decode(raw, seq)
}

func (s *pgStore) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return s.r.ReadRange(ctx, from, 0, fn)
}

func (s *pgStore) ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return s.r.ReadRange(ctx, from, to, fn)
}

func (s *pgStore) FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return s.ReadRange(ctx, from, to, fn)
}

func (s *pgStore) RawLog(ctx context.Context, from, to uint64, fn func(uint64, []byte) error) error {
	return s.r.RawLog(ctx, from, to, fn)
}

// Sessions lists the sessions in the order of Pebble's per-session index, whose keys start
// with the session's length: shorter first, then byte order. The same order on both
// backends keeps every listing of sessions the same.
func (s *pgStore) Sessions(ctx context.Context, fn func(string) error) error {
	var all []string
	if err := s.r.Sessions(ctx, func(x string) error { all = append(all, x); return nil }); err != nil {
		return err
	}
	slices.SortFunc(all, func(a, b string) int {
		if c := cmp.Compare(len(a), len(b)); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	for _, x := range all {
		if err := fn(x); err != nil {
			return err
		}
	}
	return nil
}

func (s *pgStore) SessionSeqs(ctx context.Context, session string, from uint64, fn func(uint64) error) error {
	return s.r.SessionLog(ctx, session, from, func(ev events.Event) error { return fn(ev.Head().Seq) })
}

func (s *pgStore) SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error {
	return s.r.SessionLog(ctx, session, from, fn)
}

func (s *pgStore) ScanTasks(ctx context.Context, fn func(*projection.Task) error) error {
	return s.r.ScanTasks(ctx, fn)
}

func (s *pgStore) ScanWakes(ctx context.Context, fn func(*projection.Wake) error) error {
	return s.r.ScanWakes(ctx, fn)
}

func (s *pgStore) DiskUsage() (uint64, error) { return s.r.DiskUsage(s.ctx) }

// PrunedRanges makes pgStore a prunedSource: the commands read a pruned queue as they read a
// pruned Pebble store (log marks the ranges, state refuses a point before the horizon, stats
// reports them).
func (s *pgStore) PrunedRanges() (projection.SeqRanges, error) { return s.r.PrunedRanges(s.ctx) }

func (s *pgStore) Verify(ctx context.Context, vo pebblelog.VerifyOptions) ([]string, error) {
	return s.r.Verify(ctx, postgres.VerifyOptions{Progress: vo.Progress})
}

func (s *pgStore) Close() error { return s.r.Close() }

// format is the stats line naming the store's layout, as the marker file does for Pebble.
func (s *pgStore) format() string {
	return fmt.Sprintf("worklog PostgreSQL format %d, schema %s", postgres.FormatVersion, s.r.Schema())
}
