package pastfold_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pastfold"
	"github.com/worklog/worklog/internal/storegen"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// TestEachSessionIsTheFold: at several seqs of a generated store, the sessions EachSession
// folds hold, together, exactly the tasks and wakes of the fold of the whole log up to that
// seq, each record field by field, and no session is visited twice.
func TestEachSessionIsTheFold(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storegen.Build(ctx, q, 1200, storegen.Options{Sessions: 5, Round: 250}); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	last, err := st.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{1, 77, last / 3, last / 2, last - 5, last} {
		full := projection.NewMem()
		if err := st.ReadRange(ctx, 1, seq, func(ev events.Event) error { return projection.Apply(full, ev) }); err != nil {
			t.Fatal(err)
		}
		tasks, wakes := map[string]projection.Task{}, map[string]projection.Wake{}
		seen := map[string]bool{}
		err := pastfold.EachSession(ctx, st, seq, func(session string, s *pastfold.Session) error {
			if seen[session] {
				t.Errorf("seq %d: session %s visited twice", seq, session)
			}
			seen[session] = true
			if s.Seq > seq || s.Seq == 0 {
				t.Errorf("seq %d: session %s folded up to seq %d", seq, session, s.Seq)
			}
			for _, x := range s.Mem.Tasks() {
				tasks[x.ID] = x
			}
			for _, x := range s.Mem.Wakes() {
				wakes[x.ID] = x
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		wantTasks, wantWakes := map[string]projection.Task{}, map[string]projection.Wake{}
		for _, x := range full.Tasks() {
			wantTasks[x.ID] = x
		}
		for _, x := range full.Wakes() {
			wantWakes[x.ID] = x
		}
		if !reflect.DeepEqual(tasks, wantTasks) || !reflect.DeepEqual(wakes, wantWakes) {
			t.Fatalf("seq %d: the sessions hold %d tasks and %d wakes, the fold %d and %d, or a record differs",
				seq, len(tasks), len(wakes), len(wantTasks), len(wantWakes))
		}
	}
}
