package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// goldenEvents decodes the golden files of package events (events/testdata/golden), every
// schema version of every type of the catalogue. The events tests require those files for
// every type, so a new type brings its own sample here: realistic ids, a real lease token.
func goldenEvents(t *testing.T) map[events.Type][]events.Event {
	t.Helper()
	out := map[events.Type][]events.Event{}
	for _, info := range events.Types() {
		files, err := filepath.Glob(filepath.Join("..", "..", "events", "testdata", "golden", info.Name+".v*.bin"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no golden file for %s in events/testdata/golden: the events tests say how to write it", info.Name)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := events.Decode(b, 0)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out[info.Type] = append(out[info.Type], ev)
		}
	}
	return out
}

// TestEveryTypeEveryOutput walks every type of the events catalogue through every switch of
// replay that must know it: the log line, the JSON of log/export/task, the timeline story
// and its HTML marks, the task explanation's rule, the --kind filter, the stats table and the
// help, and checks that lease tokens stay redacted. A type that falls to a switch's default
// fails here, naming the function to add a case to (docs/design.md §8).
func TestEveryTypeEveryOutput(t *testing.T) {
	samples := goldenEvents(t)
	for _, info := range events.Types() {
		t.Run(info.Name, func(t *testing.T) {
			for _, ev := range samples[info.Type] {
				checkEveryOutput(t, info, ev)
			}
		})
	}

	// stats: a line for every type in the text, counted under its name.
	var buf bytes.Buffer
	a := &app{out: bufio.NewWriter(&buf)}
	s := &statsJSON{LastSeq: 99, Events: map[string]uint64{}}
	for _, info := range events.Types() {
		s.Events[info.Name] = 7
	}
	a.writeStatsText(s)
	a.out.Flush()
	for _, info := range events.Types() {
		if !regexp.MustCompile(`(?m)^  ` + info.Name + ` +7$`).Match(buf.Bytes()) {
			t.Errorf("stats text has no line for %s (writeStatsText, cmd_stats.go):\n%s", info.Name, buf.String())
		}
	}

	// log --help lists every type, and --kind accepts every name.
	help := eventTypesHelp()
	f := &eventFilter{}
	for _, info := range events.Types() {
		if !strings.Contains(help, "  "+info.Name+" ") {
			t.Errorf("log --help does not list %s", info.Name)
		}
		if err := parseTypes(&cobra.Command{Use: "log"}, []string{info.Name}, f); err != nil || !f.types[info.Type] {
			t.Errorf("--kind %s: %v", info.Name, err)
		}
	}
}

func checkEveryOutput(t *testing.T, info events.TypeInfo, ev events.Event) {
	t.Helper()
	redacted := &app{}
	shown := &app{showTokens: true}
	token := events.LeaseToken(ev)
	taskID, wakeID := ev.Subject()
	var texts []string // everything printed without --show-tokens

	// The log line (format.go, appendDetails).
	if _, ok := redacted.appendDetails(nil, ev); !ok {
		t.Errorf("appendDetails (format.go) has no case for %s: the log line would show only the type", info.Name)
	}
	line := redacted.eventLine(ev, 3, 10)
	if strings.Contains(line, unknownEventNote) {
		t.Errorf("the log line of %s says it cannot describe it: %s", info.Name, line)
	}
	texts = append(texts, line)
	if token != "" && !strings.Contains(shown.eventLine(ev, 3, 10), token) {
		t.Errorf("the log line of %s with --show-tokens does not show its lease token", info.Name)
	}

	// The JSON of log --json, export and task --json (format.go, eventJSONOK).
	j, ok := redacted.eventJSONOK(ev)
	if !ok {
		t.Errorf("eventJSON (format.go) has no case for %s: its JSON would carry only the header", info.Name)
	}
	if j.Event != info.Name || j.TaskID != taskID && info.Subject == events.SubjectTask || j.WakeID != wakeID && info.Subject == events.SubjectWake {
		t.Errorf("the JSON of %s: event %q, task_id %q, wake_id %q; want %q, %q, %q", info.Name, j.Event, j.TaskID, j.WakeID, info.Name, taskID, wakeID)
	}
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	texts = append(texts, string(b))

	// The timeline (story.go, sessionStory.add) and its HTML marks (html.go).
	s := &sessionStory{Session: ev.Head().SessionID, tasks: map[string]*taskStory{}, wakes: map[string]*wakeStory{}}
	if !s.add(ev) {
		t.Errorf("sessionStory.add (story.go) has no case for %s: the timeline would show only a bare mark", info.Name)
	}
	s.EndAt = s.LastAt
	s.finish()
	var marks []mark
	for _, x := range s.Tasks {
		marks = append(marks, x.Marks...)
	}
	for _, x := range s.Wakes {
		marks = append(marks, x.Marks...)
	}
	for _, x := range s.Schedules {
		marks = append(marks, x.Marks...)
	}
	if len(marks) == 0 && info.Subject != events.SubjectKind { // a kind's event is no session's
		t.Errorf("the timeline of %s has no mark for it", info.Name)
	}
	for _, m := range marks {
		if m.Kind == markUnknown || m.Kind == "" {
			t.Errorf("the timeline mark of %s has kind %q", info.Name, m.Kind)
		}
		if cls := markCSS(m); !strings.Contains(htmlStyle, "."+cls+" ") && !strings.Contains(htmlStyle, "."+cls+",") {
			t.Errorf("the timeline page has no style for the %s mark of %s (add svg .%s to htmlStyle in html.go)", cls, info.Name, cls)
		}
		texts = append(texts, m.Text)
	}
	var page bytes.Buffer
	redacted.writeTimelineText(&page, s)
	texts = append(texts, page.String(), timelineHTML(s, "store"))

	// The task explanation (cmd_task.go, taskRule and wakeRule): the rule a type applied.
	var rules []string
	switch info.Subject {
	case events.SubjectTask:
		before, after := &projection.Task{ID: taskID}, &projection.Task{ID: taskID}
		r, ok := taskRule(ev, before, after)
		if !ok {
			t.Errorf("taskRule (cmd_task.go) has no case for %s: replay task would not explain it", info.Name)
		}
		rules = append(rules, r)
	case events.SubjectWake:
		for _, completion := range []bool{false, true} {
			r, ok := wakeRule(ev, &projection.Wake{ID: wakeID}, &projection.Wake{ID: wakeID}, completion)
			if !ok {
				t.Errorf("wakeRule (cmd_task.go) has no case for %s: replay task would not explain it", info.Name)
			}
			rules = append(rules, r)
		}
	}
	texts = append(texts, rules...)

	// No output shows a lease token without --show-tokens.
	if token != "" {
		for _, s := range texts {
			if strings.Contains(s, token) {
				t.Errorf("the output of %s shows its lease token without --show-tokens:\n%s", info.Name, s)
			}
		}
	}
}

// TestReplayJSONDocListsEveryType: docs/replay-json.md, the JSON contract, has a row for the
// fields of every event type.
func TestReplayJSONDocListsEveryType(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "replay-json.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range events.Types() {
		if !strings.Contains(string(doc), "\n| `"+info.Name+"` |") {
			t.Errorf("docs/replay-json.md has no row for the fields of %s in its table of events", info.Name)
		}
	}
}
