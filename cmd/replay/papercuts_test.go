package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestVerifyPrunedSaysWhatWasChecked: on a pruned store verify says how many events are live
// and how many pruned, where, and that the pruned ones were not checked; it does not call the
// log of 11 sequences, 9 of them pruned, "11 events, gap-free".
func TestVerifyPrunedSaysWhatWasChecked(t *testing.T) {
	t.Parallel()
	dir, _ := prunedStore(t, true)
	out := mustReplay(t, "verify", dir)
	for _, want := range []string{"runs to seq 11: 2 events live", "9 events pruned (seqs 1–6, 8–10), not checked here"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify: %q missing:\n%s", want, out)
		}
	}
	if strings.Contains(out, "gap-free") {
		t.Errorf("verify calls a pruned log gap-free:\n%s", out)
	}
	if js := mustReplay(t, "verify", dir, "--json"); !strings.Contains(js, `"pruned_events":9`) {
		t.Errorf("verify --json: no pruned_events 9:\n%s", js)
	}
}

// TestLogTypeFlag: log filters event types with --type; --kind, its old name, still works,
// says so on stderr and is not in --help.
func TestLogTypeFlag(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	want := mustReplay(t, "log", dir, "--type", "task_claimed")
	if !strings.Contains(want, "task_claimed") || strings.Contains(want, "task_submitted") {
		t.Fatalf("log --type task_claimed:\n%s", want)
	}
	r := replay(t, "log", dir, "--kind", "task_claimed")
	if r.code != 0 || r.stdout != want || !strings.Contains(r.stderr, "--kind is the old name of --type") {
		t.Errorf("log --kind: exit %d, stderr %q, same output %v", r.code, r.stderr, r.stdout == want)
	}
	if help := mustReplay(t, "log", "--help"); strings.Contains(help, "--kind") || !strings.Contains(help, "--type") {
		t.Errorf("log --help shows --kind or not --type:\n%s", help)
	}
}

// TestStateTimelineFilters: state and timeline list only the tasks (and wakes) of --state and
// --task-kind; a state no task or wake has is a usage error.
func TestStateTimelineFilters(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	out := mustReplay(t, "state", dir, "--state", "failed,canceled")
	if !strings.Contains(out, "reserve-stock") || !strings.Contains(out, "export-csv") || strings.Contains(out, "charge-card") ||
		strings.Contains(out, "WAKE") || !strings.Contains(out, "Listed (--state failed,canceled): 3 tasks, 0 wakes.") {
		t.Errorf("state --state failed,canceled:\n%s", out)
	}
	out = mustReplay(t, "state", dir, "--task-kind", "summarize", "--json")
	if strings.Count(out, `"kind":"summarize"`) != 2 || strings.Contains(out, `"kind":"translate"`) || strings.Contains(out, `"reason"`) {
		t.Errorf("state --task-kind summarize --json:\n%s", out)
	}
	out = mustReplay(t, "state", dir, "--state", "available")
	if strings.Contains(out, "TASK") || !strings.Contains(out, "1 wake.") {
		t.Errorf("state --state available:\n%s", out)
	}
	out = mustReplay(t, "timeline", dir, "--session", "checkout-4821", "--task-kind", "charge-card")
	if !strings.Contains(out, "charge-card") || strings.Contains(out, "reserve-stock") || strings.Contains(out, "send-receipt") {
		t.Errorf("timeline --task-kind charge-card:\n%s", out)
	}
	for _, args := range [][]string{{"state", dir, "--state", "done"}, {"timeline", dir, "--session", "checkout-4821", "--state", "acked"}} {
		if r := replay(t, args...); r.code != exitError || !strings.Contains(r.stderr, "is not a state") {
			t.Errorf("replay %v: exit %d, %s", args, r.code, r.stderr)
		}
	}
}

// TestTimelineHTMLCapped: the HTML page of a session of 250 tasks has its legend above the
// chart and a chart of at most 200 rows, saying so; the table still lists every task.
func TestTimelineHTMLCapped(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "store")
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	for i := range 250 {
		if _, err := q.Session("big").SubmitAt(context.Background(), work.TaskRequest{Kind: "k", Input: json.RawMessage(`{}`)}, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	html := filepath.Join(t.TempDir(), "big.html")
	mustReplay(t, "timeline", dir, "--session", "big", "--html", html)
	b, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	m := regexp.MustCompile(`<svg xmlns="http://www.w3.org/2000/svg" width="\d+" height="(\d+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no chart in the page")
	}
	if h, _ := strconv.Atoi(m[1]); h > 34+200*30+10 {
		t.Errorf("the chart is %d px tall for 250 rows", h)
	}
	if l, c := strings.Index(page, `<div class="legend">`), strings.Index(page, m[0]); l < 0 || l > c {
		t.Errorf("the legend is not above the chart (legend at %d, chart at %d)", l, c)
	}
	if !strings.Contains(page, "The chart shows the first 200 of 250 rows") {
		t.Errorf("the page does not say the chart is cut")
	}
}
