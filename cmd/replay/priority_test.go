package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/narrate"
	"github.com/worklog/worklog/projection"
)

// A submit's priority and headers show in the log line (headers in key order, escaped like
// every user string), the event's and the task's JSON, and the task's rule; a submit with
// neither shows neither.
func TestPriorityAndHeadersShown(t *testing.T) {
	a := &app{}
	ev := &events.TaskSubmitted{Header: events.Header{Seq: 1, SessionID: "s", At: 1}, TaskID: "t1", Kind: "k",
		Input: []byte(`{}`), Priority: -7, Headers: map[string]string{
			"traceparent": "00-ab-cd-01", "a key": "x=y\n", "tenant": "acme"}}
	details, ok := a.appendDetails(nil, ev)
	if !ok {
		t.Fatal("no details")
	}
	line := string(details)
	for _, want := range []string{`priority=-7`, `header:"a key"="x=y\n"`, `header:tenant=acme`, `header:traceparent=00-ab-cd-01`} {
		if !strings.Contains(line, want) {
			t.Errorf("log line %q lacks %q", line, want)
		}
	}
	if strings.Index(line, "a key") > strings.Index(line, "tenant") || strings.Index(line, "tenant") > strings.Index(line, "traceparent") {
		t.Errorf("headers not in key order: %q", line)
	}
	if strings.Contains(line, "\n") {
		t.Errorf("a header's newline reached the line unescaped: %q", line)
	}
	b, err := json.Marshal(a.eventJSON(ev))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"priority":-7`, `"headers":{"a key":"x=y\n","tenant":"acme","traceparent":"00-ab-cd-01"}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("event JSON %s lacks %s", b, want)
		}
	}
	task := &projection.Task{ID: "t1", Kind: "k", Priority: -7, Headers: ev.Headers}
	b, err = json.Marshal(a.taskJSON(task))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"priority":-7`) || !strings.Contains(string(b), `"tenant":"acme"`) {
		t.Errorf("task JSON %s lacks the priority or headers", b)
	}
	rule := narrate.TaskRule(ev, nil, task)
	if !strings.Contains(rule, "priority -7") || !strings.Contains(rule, "tenant=acme") {
		t.Errorf("rule %q lacks the priority or headers", rule)
	}

	plain := &events.TaskSubmitted{Header: events.Header{Seq: 1, SessionID: "s", At: 1}, TaskID: "t1", Kind: "k", Input: []byte(`{}`)}
	details, _ = a.appendDetails(nil, plain)
	b, _ = json.Marshal(a.eventJSON(plain))
	if line := string(details); strings.Contains(line, "priority") || strings.Contains(line, "header") ||
		strings.Contains(string(b), "priority") || strings.Contains(string(b), "headers") {
		t.Errorf("a plain submit shows priority or headers: %q %s", line, b)
	}
}
