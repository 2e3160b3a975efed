package main

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"slices"
	"sort"
	"sync"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/projection"
)

// Reading a store together with its archive (--archive DIR; work.Options.ArchiveDir): the
// events the store pruned are read from the archive where it holds them, so that log,
// state, timeline, task and export see the log as if nothing had been pruned. Pruned
// sequences the archive lacks stay pruned: PrunedRanges returns only those, and every
// command marks and steps over them as on a store without an archive.
//
// The archive dir is not recorded in the store: a store and its archive are copied and
// moved separately (a checkpoint holds no archive), so the flag names it.

// archivedStore is a store read with its archive.
type archivedStore struct {
	store
	arch   *archive.Reader
	dir    string               // the archive's directory, as given
	pruned projection.SeqRanges // the store's own pruned ranges
	left   projection.SeqRanges // those the archive does not hold: still pruned

	sessOnce sync.Once
	sessions map[string][]uint64 // the archived pruned events by session, built on first use
	sessErr  error
}

// openArchived opens the archive in dir and wraps st with it.
func openArchived(st store, dir string) (*archivedStore, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return nil, fmt.Errorf("--archive %s: %v", dir, unwrapPathError(err))
	}
	pruned, err := st.PrunedRanges(context.Background()) // as openPostgres, at open: the commands' reads take theirs
	if err != nil {
		return nil, err
	}
	r, err := archive.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("--archive %s: %w", dir, err)
	}
	return &archivedStore{store: st, arch: r, dir: dir, pruned: pruned, left: r.Missing(pruned)}, nil
}

func (s *archivedStore) Close() error { return errors.Join(s.arch.Close(), s.store.Close()) }

// PrunedRanges returns the pruned ranges the archive does not cover.
func (s *archivedStore) PrunedRanges(context.Context) (projection.SeqRanges, error) {
	return s.left, nil
}

// archived reports whether seq is read from the archive: pruned from the store and held by
// the archive. (The archive may also hold copies of live events, left by a crash between a
// segment's fsync and its prune: the store's copy is read.)
func (s *archivedStore) archived(seq uint64) bool {
	return s.pruned.Contains(seq) && !s.left.Contains(seq)
}

func (s *archivedStore) RawEvent(ctx context.Context, seq uint64) ([]byte, bool, error) {
	if s.archived(seq) {
		b, ok, err := s.arch.Get(seq)
		if err != nil {
			return nil, false, fmt.Errorf("archive %s: %w", s.dir, err)
		}
		return b, ok, nil
	}
	return s.store.RawEvent(ctx, seq)
}

func (s *archivedStore) Event(ctx context.Context, seq uint64) (events.Event, error) {
	if !s.archived(seq) {
		return s.store.Event(ctx, seq)
	}
	b, ok, err := s.RawEvent(ctx, seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w at seq %d: the archive %s lost the event", events.ErrCorrupt, seq, s.dir)
	}
	return events.Decode(b, seq)
}

// errPullStop ends a walk the merge no longer reads.
var errPullStop = errors.New("stop")

// pull turns a walk into a pull iterator; *errp holds the walk's error once it ended.
func pull(walk func(fn func(uint64, []byte) error) error, errp *error) (next func() (uint64, []byte, bool), stop func()) {
	return iter.Pull2(iter.Seq2[uint64, []byte](func(yield func(uint64, []byte) bool) {
		err := walk(func(seq uint64, raw []byte) error {
			if !yield(seq, raw) {
				return errPullStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errPullStop) {
			*errp = err
		}
	}))
}

// RawLog merges the store's log and the archived events of [from, to] in seq order.
func (s *archivedStore) RawLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error {
	if len(s.pruned) == 0 {
		return s.store.RawLog(ctx, from, to, fn)
	}
	var lerr, aerr error
	lnext, lstop := pull(func(f func(uint64, []byte) error) error { return s.store.RawLog(ctx, from, to, f) }, &lerr)
	defer lstop()
	anext, astop := pull(func(f func(uint64, []byte) error) error {
		return s.arch.Read(ctx, max(from, 1), to, func(seq uint64, raw []byte) error {
			if !s.archived(seq) {
				return nil
			}
			return f(seq, raw)
		})
	}, &aerr)
	defer astop()
	ls, lraw, lok := lnext()
	as, araw, aok := anext()
	for lok || aok {
		var err error
		switch {
		case lok && (!aok || ls < as):
			err = fn(ls, lraw)
			ls, lraw, lok = lnext()
		case lok && ls == as: // never: an archived sequence is pruned from the store
			return fmt.Errorf("%w: seq %d is both in the store and read from the archive %s", events.ErrCorrupt, ls, s.dir)
		default:
			err = fn(as, araw)
			as, araw, aok = anext()
		}
		if err != nil {
			return err
		}
	}
	if aerr != nil {
		return fmt.Errorf("archive %s: %w", s.dir, aerr)
	}
	return lerr
}

func (s *archivedStore) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return s.ReadRange(ctx, from, 0, fn)
}

func (s *archivedStore) ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return s.RawLog(ctx, from, to, func(seq uint64, raw []byte) error {
		ev, err := events.Decode(raw, seq)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

func (s *archivedStore) FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	var d events.Decoder
	return s.RawLog(ctx, from, to, func(seq uint64, raw []byte) error {
		ev, err := d.Decode(raw, seq)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// sessionIndex reads the archived pruned events once and indexes them by session.
func (s *archivedStore) sessionIndex(ctx context.Context) (map[string][]uint64, error) {
	s.sessOnce.Do(func() {
		s.sessions = map[string][]uint64{}
		s.sessErr = s.arch.Read(ctx, 0, 0, func(seq uint64, raw []byte) error {
			if !s.archived(seq) {
				return nil
			}
			var d events.Decoder
			ev, err := d.Decode(raw, seq)
			if err != nil {
				return fmt.Errorf("archive %s: %w", s.dir, err)
			}
			id := ev.Head().SessionID
			s.sessions[id] = append(s.sessions[id], seq)
			return nil
		})
	})
	return s.sessions, s.sessErr
}

func (s *archivedStore) Sessions(ctx context.Context, fn func(session string) error) error {
	idx, err := s.sessionIndex(ctx)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var all []string
	if err := s.store.Sessions(ctx, func(id string) error {
		seen[id] = true
		all = append(all, id)
		return nil
	}); err != nil {
		return err
	}
	for id := range idx {
		if !seen[id] {
			all = append(all, id)
		}
	}
	slices.SortFunc(all, source.SessionOrder) // every source's order
	for _, id := range all {
		if err := fn(id); err != nil {
			return err
		}
	}
	return nil
}

func (s *archivedStore) SessionSeqs(ctx context.Context, session string, from uint64, fn func(seq uint64) error) error {
	idx, err := s.sessionIndex(ctx)
	if err != nil {
		return err
	}
	var live []uint64
	if err := s.store.SessionSeqs(ctx, session, from, func(seq uint64) error {
		live = append(live, seq)
		return nil
	}); err != nil {
		return err
	}
	arch := idx[session]
	arch = arch[sort.Search(len(arch), func(i int) bool { return arch[i] >= from }):]
	all := append(slices.Clone(arch), live...)
	slices.Sort(all)
	for _, seq := range all {
		if err := fn(seq); err != nil {
			return err
		}
	}
	return nil
}

func (s *archivedStore) SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error {
	return s.SessionSeqs(ctx, session, from, func(seq uint64) error {
		ev, err := s.Event(ctx, seq)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// openStore opens dir (openStore) with the archive of --archive, if given.
func (a *app) openStore(dir string) (store, error) {
	st, err := openStore(dir)
	if err != nil || a.archive == "" {
		return st, err
	}
	as, err := openArchived(st, a.archive)
	if err != nil {
		st.Close()
		return nil, err
	}
	return as, nil
}
