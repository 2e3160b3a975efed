package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/worklog/worklog/internal/storegen"
	"github.com/worklog/worklog/work"
)

// byIDs is a state --json document's tasks and wakes as raw JSON by id, and the sessions in
// the order the tasks list them.
type byIDs struct {
	Tasks, Wakes         map[string]string
	TaskOrder            []string // session of each task, in output order
	TaskCount, WakeCount int
}

func stateByID(t *testing.T, out string) byIDs {
	t.Helper()
	var d struct {
		Tasks     []json.RawMessage `json:"tasks"`
		Wakes     []json.RawMessage `json:"wakes"`
		TaskCount int               `json:"task_count"`
		WakeCount int               `json:"wake_count"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("state --json is not JSON: %v\n%s", err, out)
	}
	r := byIDs{Tasks: map[string]string{}, Wakes: map[string]string{}, TaskCount: d.TaskCount, WakeCount: d.WakeCount}
	for _, x := range d.Tasks {
		var id struct{ ID, Session string }
		if err := json.Unmarshal(x, &id); err != nil {
			t.Fatal(err)
		}
		r.Tasks[id.ID] = string(x)
		r.TaskOrder = append(r.TaskOrder, id.Session)
	}
	for _, x := range d.Wakes {
		var id struct{ ID string }
		if err := json.Unmarshal(x, &id); err != nil {
			t.Fatal(err)
		}
		r.Wakes[id.ID] = string(x)
	}
	return r
}

// TestStateBySessionMatchesFold: `state --by-session` prints, at every seq tried, exactly the
// tasks and wakes of the full fold (field by field), with the counts at the end, each
// session's tasks together; on a store of every kind of event (buildStore), the demo store
// and a generated one.
func TestStateBySessionMatchesFold(t *testing.T) {
	t.Parallel()
	gen := filepath.Join(t.TempDir(), "gen")
	q, err := work.Open(gen, &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storegen.Build(context.Background(), q, 1500, storegen.Options{Sessions: 7, Round: 200}); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	built := filepath.Join(t.TempDir(), "built")
	buildStore(t, built, 3, 120)
	for _, dir := range []string{demoStore(t), built, gen} {
		var st statsJSON
		if err := json.Unmarshal([]byte(mustReplay(t, "stats", dir, "--json")), &st); err != nil {
			t.Fatal(err)
		}
		last := st.LastSeq
		for _, seq := range []uint64{1, 2, last / 7, last / 3, last / 2, last - 1, last} {
			at := strconv.FormatUint(seq, 10)
			want := stateByID(t, mustReplay(t, "state", dir, "--at-seq", at, "--json", "--no-cache"))
			got := stateByID(t, mustReplay(t, "state", dir, "--at-seq", at, "--json", "--by-session"))
			if !reflect.DeepEqual(got.Tasks, want.Tasks) || !reflect.DeepEqual(got.Wakes, want.Wakes) {
				t.Fatalf("%s at seq %d: --by-session differs from the full fold:\n got %d tasks %d wakes\nwant %d tasks %d wakes\n%v\n%v",
					dir, seq, len(got.Tasks), len(got.Wakes), len(want.Tasks), len(want.Wakes), got.Tasks, want.Tasks)
			}
			if got.TaskCount != len(got.Tasks) || got.WakeCount != len(got.Wakes) {
				t.Errorf("%s at seq %d: counts %d, %d for %d tasks, %d wakes", dir, seq, got.TaskCount, got.WakeCount, len(got.Tasks), len(got.Wakes))
			}
			seen := map[string]bool{}
			for i, s := range got.TaskOrder {
				if i > 0 && s != got.TaskOrder[i-1] && seen[s] {
					t.Fatalf("%s at seq %d: session %s's tasks are not together: %v", dir, seq, s, got.TaskOrder)
				}
				seen[s] = true
			}
		}
		// The text output ends with the counts.
		out := mustReplay(t, "state", dir, "--by-session")
		if !strings.Contains(out, "session by session") || !strings.Contains(out, "\nAfter seq "+strconv.FormatUint(last, 10)+": ") {
			t.Errorf("%s: the text output lacks its header or its counts:\n%s", dir, out)
		}
	}
}
