package projection

import (
	"testing"

	"github.com/worklog/worklog/events"
)

// embedding wraps a State the way cmd/replay's recorder does: it overrides a write hook and
// nothing of the record access.
type embedding struct {
	State
	edits int
}

func (e *embedding) TaskEdited(t *Task) error { e.edits++; return e.State.TaskEdited(t) }

// TestWrappedMemChangesInPlace: a State that embeds a Mem (cmd/replay's recorder and seqFree
// do) folds on the Mem's own records, as a bare Mem does, and still sees every change.
func TestWrappedMemChangesInPlace(t *testing.T) {
	m := fold(t, number([]events.Event{submitW("t", 0)}))
	stored, _ := m.EditTask("t")
	for _, s := range []State{&embedding{State: m}, &struct{ *Mem }{m}} {
		last, _ := m.LastSeq()
		ev := claim("t", 100*int64(last), uint32(last), "tok") // each after the last lease

		ev.Seq = last + 1
		if err := Apply(s, ev); err != nil {
			t.Fatal(err)
		}
		if now, _ := m.EditTask("t"); now != stored || stored.Attempts != uint32(last) {
			t.Errorf("%T: the claim replaced or missed the stored record (%p then %p, attempts %d)", s, stored, now, stored.Attempts)
		}
		if e, ok := s.(*embedding); ok && e.edits != 1 {
			t.Errorf("TaskEdited called %d times, want 1", e.edits)
		}
	}
	checkInvariants(t, m)
}
