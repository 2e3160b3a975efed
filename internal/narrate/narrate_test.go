package narrate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// TestEveryTypeNarrated: every task and wake type of the catalogue, as its golden sample,
// has its own sentence, also when the reader lacks the record before or after (a pruned
// history): a new type that has no case fails here, and so fail `replay task` and the
// console's task page, which both tell a history through this package.
func TestEveryTypeNarrated(t *testing.T) {
	for _, info := range events.Types() {
		files, err := filepath.Glob(filepath.Join("..", "..", "events", "testdata", "golden", info.Name+".v*.bin"))
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
		switch info.Subject {
		case events.SubjectTask:
			for _, before := range []*projection.Task{nil, {State: events.StateRunning, Attempts: 1, CancelRequested: true}} {
				if r := TaskRule(ev, before, nil); r == "" {
					t.Errorf("%s: TaskRule has no case for it", info.Name)
				}
			}
		case events.SubjectWake:
			for _, completion := range []bool{false, true} {
				if r := WakeRule(ev, nil, nil, completion); r == "" {
					t.Errorf("%s: WakeRule has no case for it", info.Name)
				}
			}
		}
	}
}

func TestSubmitRuleSaysEveryPartOfTheRequest(t *testing.T) {
	ev := &events.TaskSubmitted{
		Header: events.Header{Seq: 1, SessionID: "s", At: 1}, TaskID: "t1", Kind: "export",
		IdempotencyKey: "k 1", WakeOnCompletion: true, Priority: 5,
		Headers: map[string]string{"tenant": "acme"}, HasRunAt: true, RunAt: 2e9,
	}
	r := TaskRule(ev, nil, nil)
	for _, want := range []string{"kind export", `key "k 1"`, "on_completion", "priority 5", "tenant=acme", "not due before then"} {
		if !strings.Contains(r, want) {
			t.Errorf("%q lacks %q", r, want)
		}
	}
}

// TestWordsAreSafeToPrint: a value from the log never reaches a terminal with its control
// bytes: an escape sequence, a C1 byte, invalid UTF-8 and a newline are quoted.
func TestWordsAreSafeToPrint(t *testing.T) {
	for _, s := range []string{"\x1b[2Jgone", "a\x9bb", string([]byte{0xff, 'x'}), "two\nlines", ""} {
		w := Word(s)
		if strings.ContainsAny(w, "\x1b\n") || strings.Contains(w, string([]byte{0xff})) || !strings.HasPrefix(w, `"`) {
			t.Errorf("Word(%q) = %q: not quoted", s, w)
		}
	}
	if Word("plain-word") != "plain-word" {
		t.Errorf("a plain word is quoted: %q", Word("plain-word"))
	}
	if got := ShortWord("ééé", 3); got != "é…" {
		t.Errorf("ShortWord cut inside a character: %q", got)
	}
}

// TestRetryRuleSaysTheEarlierWakeStaysDeliverable: a retry that detached an unacknowledged
// completion wake says the wake stays deliverable and keeps the task from retention; one
// whose wake was acknowledged says it stays recorded.
func TestRetryRuleSaysTheEarlierWakeStaysDeliverable(t *testing.T) {
	ev := &events.TaskRetried{Header: events.Header{Seq: 9, SessionID: "s", At: 5}, TaskID: "t1", Attempts: 1, RunAt: 5}
	before := &projection.Task{ID: "t1", State: events.StateFailed, Attempts: 1, CompletionWakeID: "w1",
		Outcome: events.Outcome{State: events.StateFailed}}
	after := &projection.Task{ID: "t1", State: events.StatePending, Attempts: 1, AttemptsAtRetry: 1, UnackedEarlierWakes: 1}
	r := TaskRule(ev, before, after)
	for _, want := range []string{"w1 is not acknowledged yet", "stays deliverable with its outcome (failed)", "not pruned before it is acknowledged"} {
		if !strings.Contains(r, want) {
			t.Errorf("unacknowledged: %q lacks %q", r, want)
		}
	}
	after.UnackedEarlierWakes = 0
	if r := TaskRule(ev, before, after); !strings.Contains(r, "w1 (acknowledged) stays recorded") || strings.Contains(r, "deliverable") {
		t.Errorf("acknowledged: %q", r)
	}
}
