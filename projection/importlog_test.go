package projection

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
)

// ImportSteps takes events and declared pruned ranges in sequence order from next, and
// refuses, naming the sequence, whatever does not continue the log: an undeclared gap, an
// event inside a range, a range that starts elsewhere, an event out of order.
func TestImportSteps(t *testing.T) {
	ev := func(seq uint64) events.Event {
		return &events.TaskSubmitted{Header: events.Header{Seq: seq, SessionID: "s"}, TaskID: fmt.Sprint("t", seq), Kind: "k"}
	}
	for _, c := range []struct {
		name   string
		next   uint64
		evs    []uint64
		pruned []SeqRange
		steps  string // what was called, in order
		err    string // "" or what the ErrNotNext error names
	}{
		{"events only", 1, []uint64{1, 2, 3}, nil, "e1 e2 e3", ""},
		{"ranges between, before and after", 1, []uint64{3, 5}, []SeqRange{{1, 2}, {4, 4}, {6, 9}}, "p1-2 e3 p4-4 e5 p6-9", ""},
		{"ranges only", 4, nil, []SeqRange{{4, 5}, {6, 6}}, "p4-5 p6-6", ""},
		{"a range continues the log", 7, []uint64{9}, []SeqRange{{7, 8}}, "p7-8 e9", ""},
		{"an undeclared gap", 1, []uint64{1, 4}, nil, "e1", "seq 2 is missing (the next event is seq 4)"},
		{"a gap a range fills only in part", 1, []uint64{1, 5}, []SeqRange{{2, 3}}, "e1 p2-3", "seq 4 is missing"},
		{"an event in a range", 1, []uint64{1, 3}, []SeqRange{{2, 4}}, "e1", "event seq 3 lies in the pruned range 2..4"},
		{"a range that starts past next", 1, []uint64{1}, []SeqRange{{3, 4}}, "e1", "pruned range 3..4, the log's next sequence is 2"},
		{"a range before next", 5, []uint64{5}, []SeqRange{{3, 4}}, "", "pruned range 3..4, the log's next sequence is 5"},
		{"an event already in the log", 5, []uint64{4}, nil, "", "event seq 4, the log's next sequence is 5"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var evs []events.Event
			for _, s := range c.evs {
				evs = append(evs, ev(s))
			}
			var steps []string
			err := ImportSteps(c.next, evs, c.pruned,
				func(e events.Event) error { steps = append(steps, fmt.Sprint("e", e.Head().Seq)); return nil },
				func(r SeqRange) error { steps = append(steps, fmt.Sprintf("p%d-%d", r.From, r.To)); return nil })
			if got := strings.Join(steps, " "); got != c.steps {
				t.Errorf("steps %q, want %q", got, c.steps)
			}
			switch {
			case c.err == "" && err != nil:
				t.Errorf("error %v", err)
			case c.err != "" && (!errors.Is(err, ErrNotNext) || !strings.Contains(err.Error(), c.err)):
				t.Errorf("error %v, want ErrNotNext naming %q", err, c.err)
			}
		})
	}
}
