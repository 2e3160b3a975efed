package console_test

import (
	"context"
	"strings"
	"testing"

	"github.com/worklog/worklog/console"
	"github.com/worklog/worklog/work"
)

// TestTaskPageShowsHeadersPriorityAndTrace (issue 22): the task page lists the task's
// headers (escaped), its priority, and the trace id of its traceparent, linked to
// Options.TraceURL when set; a malformed traceparent shows no trace; a bad TraceURL is
// refused by New.
func TestTaskPageShowsHeadersPriorityAndTrace(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	s := q.Session("traced")
	traced, err := s.Submit(context.Background(), work.TaskRequest{Kind: "report", Priority: 7, Headers: map[string]string{
		"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01",
		"tenant":      "<script>alert(1)</script>",
	}})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := s.Submit(context.Background(), work.TaskRequest{Kind: "report", Headers: map[string]string{
		"traceparent": `00-"><script>alert(2)</script>-00f067aa0ba902b7-01`,
	}})
	if err != nil {
		t.Fatal(err)
	}

	srv := newServer(t, q, &console.Options{TraceURL: "https://jaeger.example.com/trace/{trace_id}"})
	r := get(t, srv, "/tasks/"+traced.ID)
	for _, want := range []string{
		`id="task-priority">7<`,
		`href="https://jaeger.example.com/trace/` + traceID + `"`,
		`id="task-headers"`, "<td>tenant</td>", "&lt;script&gt;alert(1)&lt;/script&gt;",
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("task page lacks %q", want)
		}
	}
	if strings.Contains(r.body, "<script>alert") {
		t.Error("a header's script is in the page unescaped")
	}
	r = get(t, srv, "/tasks/"+bad.ID)
	if strings.Contains(r.body, `id="task-trace"`) || strings.Contains(r.body, "<script>alert") {
		t.Errorf("a malformed traceparent: the page shows a trace or the script unescaped")
	}
	if r := get(t, srv, "/api/tasks/"+traced.ID); !strings.Contains(r.body, `"priority":7`) || !strings.Contains(r.body, `"traceparent":"00-`+traceID) {
		t.Errorf("the API's task object lacks priority or headers: %s", r.body)
	}

	// Without TraceURL the id is shown, not linked.
	plain := newServer(t, q, nil)
	if r := get(t, plain, "/tasks/"+traced.ID); !strings.Contains(r.body, `id="task-trace">`+traceID+`<`) {
		t.Error("without TraceURL the trace id is not shown plainly")
	}
	for _, u := range []string{"javascript:alert(1)//{trace_id}", "https://jaeger.example.com/trace/", "/trace/{trace_id}"} {
		if _, err := console.New(q, &console.Options{TraceURL: u}); err == nil {
			t.Errorf("TraceURL %q accepted", u)
		}
	}
}
