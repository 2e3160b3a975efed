package projection

import (
	"errors"
	"fmt"

	"github.com/worklog/worklog/events"
)

// ErrNotNext: the events or pruned ranges given to an import do not continue the log where it
// ends (docs/design.md §9, "Moving from an embedded store"). The error names the sequence.
var ErrNotNext = errors.New("the imported log does not continue the log")

// ImportSteps walks a run of a log being imported (events that already have their sequence
// numbers, and the ranges of sequences the source had pruned) in sequence order, from next,
// the sequence the target's log goes on with. It calls event for each event and gap for each
// pruned range, each only when it begins exactly at the sequence that is next by then, so a
// backend's import appends the events and records the ranges in the order of the log and
// never moves its last sequence past one that is neither.
//
// A gap between events that no range of pruned declares, an event inside a declared range, or
// a range that does not begin where the log goes on is ErrNotNext naming the sequence; what
// came before it was called, so the caller discards its transaction. pruned must be sorted;
// ranges that touch are accepted (the backends coalesce them as they record them).
func ImportSteps(next uint64, evs []events.Event, pruned []SeqRange, event func(events.Event) error, gap func(SeqRange) error) error {
	i := 0
	for _, ev := range evs {
		seq := ev.Head().Seq
		for i < len(pruned) && pruned[i].From <= seq {
			r := pruned[i]
			if r.From != next || r.To < r.From {
				return fmt.Errorf("%w: pruned range %d..%d, the log's next sequence is %d", ErrNotNext, r.From, r.To, next)
			}
			if r.To >= seq {
				return fmt.Errorf("%w: event seq %d lies in the pruned range %d..%d", ErrNotNext, seq, r.From, r.To)
			}
			if err := gap(r); err != nil {
				return err
			}
			next = r.To + 1
			i++
		}
		if seq != next {
			if seq > next {
				return fmt.Errorf("%w: seq %d is missing (the next event is seq %d) and no pruned range declares seqs %d..%d", ErrNotNext, next, seq, next, seq-1)
			}
			return fmt.Errorf("%w: event seq %d, the log's next sequence is %d", ErrNotNext, seq, next)
		}
		if err := event(ev); err != nil {
			return err
		}
		next++
	}
	for ; i < len(pruned); i++ {
		r := pruned[i]
		if r.From != next || r.To < r.From {
			return fmt.Errorf("%w: pruned range %d..%d, the log's next sequence is %d", ErrNotNext, r.From, r.To, next)
		}
		if err := gap(r); err != nil {
			return err
		}
		next = r.To + 1
	}
	return nil
}
