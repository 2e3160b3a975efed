package console

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/worklog/worklog/events"
)

// TestConsoleKnowsEveryType: every type of the catalogue, as its golden sample
// (events/testdata/golden), has its own line on the log and task pages (details) and, for a
// task's event, its own sentence in the task's story (taskRule; wakeRule for a wake's): a new
// type that falls to a default fails here (docs/design.md §8, step 12).
func TestConsoleKnowsEveryType(t *testing.T) {
	for _, info := range events.Types() {
		files, err := filepath.Glob(filepath.Join("..", "events", "testdata", "golden", info.Name+".v*.bin"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no golden sample of %s: %v", info.Name, err)
		}
		b, err := os.ReadFile(files[len(files)-1])
		if err != nil {
			t.Fatal(err)
		}
		ev, err := events.Decode(b, 0)
		if err != nil {
			t.Fatalf("%s: %v", files[len(files)-1], err)
		}
		// task_cancel_requested carries nothing but its subject: no details to show.
		if details(ev) == "" && info.Type != events.TypeTaskCancelRequested {
			t.Errorf("%s: the console's details (pages.go) has no case for it", info.Name)
		}
		// A schedule's or a kind's event is in no task's or wake's story (the log page shows it).
		var rule string
		switch info.Subject {
		case events.SubjectTask:
			rule = taskRule(ev, nil, nil)
		case events.SubjectWake:
			rule = wakeRule(ev, nil, nil)
		default:
			continue
		}
		if rule == info.Name {
			t.Errorf("%s: the console's story (fold.go taskRule/wakeRule) has no case for it", info.Name)
		}
	}
}
