package pebblelog

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// at gives ev the sequence number it had in the log it was exported from.
func at[E events.Event](seq uint64, ev E) E {
	ev.Head().Seq = seq
	return ev
}

// AppendLog imports a pruned log: the declared ranges are recorded as pruned (coalesced
// across calls, a range may end the log), the log's last sequence moves past them, and the
// store verifies clean, also after a reopen. A gap no range declares is ErrNotNext naming
// the missing sequence, and nothing of the call is kept.
func TestAppendLogPruned(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), &Options{})
	x := at(1, submitted("s1", "task_x", sec(1), false))
	y := at(5, submitted("s2", "task_y", sec(5), false))

	err := s.AppendLog(ctx, []events.Event{x, y}, []projection.SeqRange{{From: 2, To: 3}})
	if !errors.Is(err, ErrNotNext) || !strings.Contains(err.Error(), "seq 4 is missing") {
		t.Errorf("a gap at seq 4 that no range declares: %v, want ErrNotNext naming seq 4", err)
	}
	if last, err := s.LastSeq(context.Background()); err != nil || last != 0 {
		t.Errorf("the refused import left the log at seq %d (%v), want 0", last, err)
	}

	if err := s.AppendLog(ctx, []events.Event{x}, []projection.SeqRange{{From: 2, To: 3}}); err != nil {
		t.Fatal(err)
	}
	// The next call begins with a range that touches the stored one, and ends with one.
	if err := s.AppendLog(ctx, []events.Event{y}, []projection.SeqRange{{From: 4, To: 4}, {From: 6, To: 7}}); err != nil {
		t.Fatal(err)
	}
	check := func(head uint64, want projection.SeqRanges) {
		t.Helper()
		if last, err := s.LastSeq(context.Background()); err != nil || last != head {
			t.Errorf("last seq %d (%v), want %d (a pruned range ends the log)", last, err, head)
		}
		if got, err := s.PrunedRanges(context.Background()); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("pruned ranges %v (%v), want %v", got, err, want)
		}
		var seqs []uint64
		for _, ev := range readAll(t, s) {
			seqs = append(seqs, ev.Head().Seq)
		}
		if !reflect.DeepEqual(seqs, []uint64{1, 5}) {
			t.Errorf("the log holds seqs %v, want [1 5]", seqs)
		}
		mustVerify(t, s)
	}
	check(7, projection.SeqRanges{{From: 2, To: 4}, {From: 6, To: 7}})
	// A group of ranges alone, the first touching the stored tail.
	if err := s.AppendLog(ctx, nil, []projection.SeqRange{{From: 8, To: 8}, {From: 9, To: 10}}); err != nil {
		t.Fatal(err)
	}
	if last, err := s.LastSeq(context.Background()); err != nil || last != 10 {
		t.Errorf("last seq %d (%v) after a group of ranges, want 10", last, err)
	}
	want := projection.SeqRanges{{From: 2, To: 4}, {From: 6, To: 10}}
	if got, err := s.PrunedRanges(context.Background()); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("pruned ranges %v (%v), want %v", got, err, want)
	}
	mustVerify(t, s)
	dir := s.dir
	s.Close()
	s = openT(t, dir, &Options{})
	check(10, want)
	// The log goes on after the pruned tail.
	appendEvents(t, s, submitted("s1", "task_z", sec(9), false))
	if last, _ := s.LastSeq(context.Background()); last != 11 {
		t.Errorf("a command after the import appended at seq %d, want 11", last)
	}
	mustVerify(t, s)
}
