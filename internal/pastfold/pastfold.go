// Package pastfold computes the state of a store at a past point of its log one session at
// a time, with the projection's own fold (projection.Apply into a projection.Mem).
//
// A session's state depends only on its own events: every rule of the fold reads only the
// records of the event's own session (a completion wake is in its task's session), so a
// session's events, folded in order, give exactly that session's part of the state of the
// whole log at the same point. Folding one session reads its events through the store's
// per-session index, with no scan of the rest of the log, and holds only that session's
// records. So the whole queue at a past seq can be streamed session by session: the first
// sessions are ready at once, and memory is bounded by the largest session, whatever the
// log's length. `replay state --by-session` prints this way, and `replay state --session`
// folds one session; the console's past pages are meant to read through the same calls.
package pastfold

import (
	"context"
	"errors"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Source is what a fold reads: the per-session index and the sessions. Every store that
// replay reads (internal/source.Source) is one.
type Source interface {
	Sessions(ctx context.Context, fn func(session string) error) error
	SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error
}

// Cut is a point in the log: the prefix up to and including Seq, or (ByTime) the session's
// events stamped at or before At. For one session, ByTime stops at the session's first event
// stamped after At; to cut the whole log by time, resolve the time to a seq first (the
// events of the log are in seq order, their times need not be).
type Cut struct {
	Seq    uint64
	ByTime bool
	At     int64
}

// Stops reports whether the event of h is past the cut.
func (c Cut) Stops(h *events.Header) bool {
	if c.ByTime {
		return h.At > c.At
	}
	return h.Seq > c.Seq
}

// Session is the state of one session at a cut.
type Session struct {
	Mem    *projection.Mem
	Seq    uint64         // the session's last event folded (0: none)
	At     int64          // its time
	Next   *events.Header // with a time cut: the session's first event past it, if any
	Events uint64         // events folded
}

// errStop ends a session's walk at the cut.
var errStop = errors.New("pastfold: past the cut")

// SeqFree lets Apply fold events that are not contiguous in the global sequence (one
// session's, one task's): set Next to the seq of the event about to be applied, and it tells
// Apply that this event follows the last one.
type SeqFree struct {
	*projection.Mem
	Next uint64
}

// LastSeq is Next-1.
func (s *SeqFree) LastSeq() (uint64, error) { return s.Next - 1, nil }

// FoldSession folds the events of one session up to the cut.
func FoldSession(ctx context.Context, src Source, session string, c Cut) (*Session, error) {
	res := &Session{Mem: projection.NewMem()}
	s := &SeqFree{Mem: res.Mem}
	err := src.SessionLog(ctx, session, 0, func(ev events.Event) error {
		h := ev.Head()
		if c.Stops(h) {
			if c.ByTime {
				hc := *h
				res.Next = &hc
			}
			return errStop
		}
		s.Next = h.Seq
		if err := projection.Apply(s, ev); err != nil {
			return err
		}
		res.Seq, res.At = h.Seq, h.At
		res.Events++
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, err
	}
	return res, nil
}

// EachSession calls fn with the state at seq of every session that has an event at or
// before seq, in the store's session order (Source.Sessions), folding one session at a
// time: fn's Session is only valid during the call. It stops at fn's first error and
// returns it.
func EachSession(ctx context.Context, src Source, seq uint64, fn func(session string, s *Session) error) error {
	return src.Sessions(ctx, func(session string) error {
		s, err := FoldSession(ctx, src, session, Cut{Seq: seq})
		if err != nil {
			return err
		}
		if s.Events == 0 {
			return nil // the session begins after seq
		}
		return fn(session, s)
	})
}
