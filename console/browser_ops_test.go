package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// opsQueue fills q for the operator's scenario: in session "shop", three failed charges and
// two pending emails; in "ops", a schedule and one pending report. It returns the seq
// before the scenario's actions.
func opsQueue(t *testing.T, q *work.Queue) uint64 {
	t.Helper()
	ctx := context.Background()
	s := q.Session("shop")
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Second)
		if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "charge", IdempotencyKey: fmt.Sprintf("order-%d", i), Input: json.RawMessage(`{"amount":5}`)}, at); err != nil {
			t.Fatal(err)
		}
		ds, err := q.ClaimKindsAt(ctx, []string{"charge"}, at, time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatal(ds, err)
		}
		if _, err := q.FinishAt(ctx, ds[0], work.Failure("card declined"), at.Add(500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "email"}, t0.Add(time.Duration(10+i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	o := q.Session("ops")
	if err := o.SetScheduleAt(ctx, work.Schedule{Name: "nightly-report", Cron: "0 3 * * *", TimeZone: "Europe/Paris", Task: work.TaskRequest{Kind: "report"}}, t0.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := o.SubmitAt(ctx, work.TaskRequest{Kind: "report"}, t0.Add(21*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := q.SetKindPolicyAt(ctx, "email", work.KindPolicy{MaxRunning: 4, Rate: 10, Burst: 20}, t0.Add(22*time.Second)); err != nil {
		t.Fatal(err)
	}
	return headSeq(t, q)
}

func rowsOf(t *testing.T, ctx context.Context) []string {
	t.Helper()
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#task-list tbody tr")).map(r => r.className + " " + r.cells[0].textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func nav(t *testing.T, ctx context.Context, url, wait string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(wait))); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

func click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel)), chromedp.Click(chromedp.CSS(sel))); err != nil {
		t.Fatalf("click %s: %v", sel, err)
	}
}

// operatorScenario is an operator's first hour in a real browser, on q: the task list,
// filtered to the failed ones; one opened and retried; the rest retried in bulk; a kind
// paused; the past banner on the new pages with no action offered there. shots names the
// screenshots (docs/console/) or is false.
func operatorScenario(t *testing.T, q *work.Queue, shots bool) {
	ctx, dialogs := browser(t)
	before := opsQueue(t, q)
	srv := newServer(t, q, withActions())
	u := srv.URL
	shoot := func(name string) {
		if shots {
			shootPage(t, ctx, name)
		}
	}

	// The list: every task, newest first.
	nav(t, ctx, u+"/tasks", "#task-list")
	if rows := rowsOf(t, ctx); len(rows) != 6 || !strings.HasPrefix(rows[0], "s-pending") || !strings.HasPrefix(rows[5], "s-failed") {
		t.Fatalf("the list: %v", rows)
	}
	shoot("tasks")
	// Filter: failed charges, by the form.
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#f-state"), "failed"), chromedp.SetValue(chromedp.CSS("#f-kind"), "charge")); err != nil {
		t.Fatal(err)
	}
	click(t, ctx, "#filter-btn")
	waitURL(t, ctx, "state=failed")
	rows := rowsOf(t, ctx)
	if len(rows) != 3 {
		t.Fatalf("filtered: %v", rows)
	}
	for _, r := range rows {
		if !strings.HasPrefix(r, "s-failed") {
			t.Fatalf("filtered: %v", rows)
		}
	}
	// q by idempotency key.
	nav(t, ctx, u+"/tasks?q=order-1", "#task-list")
	if rows := rowsOf(t, ctx); len(rows) != 1 {
		t.Fatalf("q=order-1: %v", rows)
	}
	// The task: open it and retry it.
	click(t, ctx, "#task-list tbody tr:first-child td a")
	waitText(t, ctx, "#task-state", "failed")
	click(t, ctx, "#retry-btn")
	waitText(t, ctx, "#task-state", "pending")
	// Bulk retry of the two still failed.
	nav(t, ctx, u+"/tasks?state=failed", "#bulk-retry")
	click(t, ctx, "#bulk-retry")
	waitText(t, ctx, "#bulk-done", "retry: 2 task(s) acted on, 0 skipped")
	if got := text(t, ctx, "#no-tasks"); got != "No task matches." {
		t.Errorf("failed tasks after the bulk retry: %q", got)
	}
	shoot("tasks-bulk")
	var pg apiTasksPage
	getJSON(t, srv, u+"/api/tasks?state=pending&kind=charge", &pg)
	if len(pg.Tasks) != 3 {
		t.Fatalf("pending charges after the retries: %d", len(pg.Tasks))
	}

	// Kinds: pause charge.
	nav(t, ctx, u+"/kinds", "#kind-charge .pause-btn")
	click(t, ctx, "#kind-charge .pause-btn")
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#kind-charge .resume-btn"))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "#kind-charge .tag"); got != "paused" {
		t.Errorf("charge after pause: %q", got)
	}
	if pols, err := q.KindPolicies(context.Background()); err != nil || !pols["charge"].Paused {
		t.Fatalf("charge's policy after pause: %+v %v", pols, err)
	}
	if ds, _ := q.ClaimKinds(context.Background(), []string{"charge"}, time.Minute, 1); len(ds) != 0 {
		t.Fatal("a paused kind was claimed")
	}
	shoot("kinds")
	nav(t, ctx, u+"/schedules", "#schedules")
	if got := text(t, ctx, "#schedules tbody tr td:nth-child(4)"); got != "Europe/Paris" {
		t.Errorf("the schedule's zone: %q", got)
	}
	shoot("schedules")

	// The past: before the actions, each new page has the banner and offers nothing.
	for _, p := range []string{"/tasks", "/kinds", "/schedules"} {
		nav(t, ctx, fmt.Sprintf("%s%s?at_seq=%d", u, p, before), "#past-banner")
		if got := text(t, ctx, "#past-banner"); !strings.Contains(got, fmt.Sprintf("seq %d", before)) || !strings.Contains(got, "Actions are disabled") {
			t.Errorf("%s: banner %q", p, got)
		}
		if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("form[method=post]").length`)); err != nil || n != 0 {
			t.Errorf("%s in the past: %d action forms (%v)", p, n, err)
		}
		if p == "/tasks" {
			if rows := rowsOf(t, ctx); len(rows) != 6 || strings.Count(strings.Join(rows, ","), "s-failed") != 3 {
				t.Errorf("the past list: %v", rows)
			}
			shoot("tasks-past")
		}
		if p == "/kinds" {
			if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#kind-charge .tag").length`)); n != 0 {
				t.Error("charge paused in the past")
			}
		}
	}
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d alert(s)", n)
	}
}

func waitURL(t *testing.T, ctx context.Context, part string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if loc, err := chromedp.Run(ctx, chromedp.Location()); err == nil && strings.Contains(loc, part) {
			if err := chromedp.Do(ctx, chromedp.WaitReady(chromedp.CSS("footer"))); err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never went to a URL with %s", part)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBrowserOperatorOnPebble(t *testing.T) {
	q, err := work.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	operatorScenario(t, q, true)
}

func TestBrowserOperatorOnPostgres(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, err := postgres.Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	operatorScenario(t, q, false)
}
