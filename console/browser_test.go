package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/worklog/worklog/work"
)

// browser starts a headless Debian chromium for one test, or skips the test with one line
// when there is none (.ci/run installs it). extra are more of chromium's options.
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) (context.Context, *atomic.Int32) {
	t.Helper()
	bin := os.Getenv("WORKLOG_CHROMIUM")
	if bin == "" {
		for _, b := range []string{"chromium", "chromium-browser"} {
			if p, err := exec.LookPath(b); err == nil {
				bin = p
				break
			}
		}
	}
	if bin == "" {
		t.Skip("browser tests skipped: no chromium on PATH (apt-get install chromium, or set WORKLOG_CHROMIUM)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1000),
		chromedp.UserDataDir(t.TempDir()),
	)
	opts = append(opts, extra...)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	// An alert would be a script from the data running: count them, and dismiss. A confirm is
	// the console's own (console.js, before a bulk action): accept it.
	var dialogs atomic.Int32
	err := chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			if d.Type == page.DialogTypeConfirm {
				// The console's own question before a bulk action or a pause: yes.
				go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
				return
			}
			dialogs.Add(1)
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	})
	if err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	return ctx, &dialogs
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// waitText waits until sel's text is want.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err == nil && strings.TrimSpace(s) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q, want %q (%v)", sel, s, want, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shoot saves a screenshot for docs/console.md when WORKLOG_CONSOLE_SCREENSHOTS names a
// directory (go test ./console -run Browser with it set to docs/console refreshes them).
func shoot(t *testing.T, ctx context.Context, name string) { shootPage(t, ctx, name) }

func shootPage(t *testing.T, ctx context.Context, name string) {
	dir := os.Getenv("WORKLOG_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	// Quality 100 is PNG.
	b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBrowserPagesSliderAndActions(t *testing.T) {
	ctx, dialogs := browser(t)
	f := newFixture(t)
	srv := newServer(t, f.q, withActions())
	u := srv.URL

	// Every page loads, and its title is the page's.
	for _, c := range []struct{ path, h1, shot string }{
		{"/", "Overview", "overview"},
		{"/sessions", "Sessions", "sessions"},
		{"/sessions/checkout-1", "Session checkout-1", "session"},
		{"/tasks/" + f.failed, "Task " + f.failed, "task"},
		{"/log", "Log", "log"},
		{"/stats", "Stats", "stats"},
		{"/verify?run=1", "Verify", "verify"},
		{"/tasks/" + f.failed + "?at_seq=5", "Task " + f.failed, "task-past"},
	} {
		if err := chromedp.Do(ctx, chromedp.Navigate(u+c.path), chromedp.WaitVisible(chromedp.CSS("main h1"))); err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if got := text(t, ctx, "main h1"); got != c.h1 {
			t.Errorf("%s: h1 %q", c.path, got)
		}
		shoot(t, ctx, c.shot)
	}

	// The time slider: the failed task at its first event is pending; moving the slider to
	// seq 5 shows it running, in the past; the step button goes on to its next event.
	if err := chromedp.Do(ctx, chromedp.Navigate(u+"/tasks/"+f.failed+"?at_seq=4"), chromedp.WaitVisible(chromedp.CSS("#seq-slider"))); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#task-state", "pending")
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById("seq-slider"); s.value = "5"; s.dispatchEvent(new Event("input")); s.dispatchEvent(new Event("change")); })()`)); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#task-state", "running")
	waitText(t, ctx, "#seq-out", "seq 5")
	if got := text(t, ctx, "#past-banner"); !strings.Contains(got, "seq 5") {
		t.Errorf("banner %q", got)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#step-next"))); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#seq-out", "seq 6")
	if err := chromedp.Do(ctx, chromedp.Navigate(u+"/tasks/"+f.failed+"?at_seq=8"), chromedp.WaitVisible(chromedp.CSS("#task-state"))); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#task-state", "failed")

	// Cancel: the button posts the form, the page comes back with the task canceled.
	if err := chromedp.Do(ctx, chromedp.Navigate(u+"/tasks/"+f.pending), chromedp.WaitVisible(chromedp.CSS("#cancel-btn"))); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#task-state", "pending")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#cancel-btn"))); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#task-state", "canceled")

	// Retry: the failed task is pending again.
	if err := chromedp.Do(ctx, chromedp.Navigate(u+"/tasks/"+f.failed), chromedp.WaitVisible(chromedp.CSS("#retry-btn"))); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#task-state", "failed")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#retry-btn"))); err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "#task-state", "pending")

	// The live tail: the log page receives a new submit without a reload.
	if err := chromedp.Do(ctx, chromedp.Navigate(u+"/log"), chromedp.WaitVisible(chromedp.CSS("#live"))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the EventSource connects
	tk, err := f.q.Session("tail").Submit(context.Background(), work.TaskRequest{Kind: "tail-kind"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#log-rows")))
		if strings.Contains(rows, tk.ID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live tail did not show %s", tk.ID)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Newest first, as the page: the live row is the top one.
	if top := text(t, ctx, "#log-rows tr:first-child"); !strings.Contains(top, tk.ID) {
		t.Errorf("the live tail's new row is not the top one: %q", top)
	}
	shoot(t, ctx, "log-live")

	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d dialog(s) opened: a script from the data ran", n)
	}
}

func TestBrowserInjectedScriptsNeverRun(t *testing.T) {
	ctx, dialogs := browser(t)
	// The detector works: a page that does run the script opens a dialog.
	raw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "<!DOCTYPE html><html><body>"+hostile+"</body></html>")
	}))
	defer raw.Close()
	if err := chromedp.Do(ctx, chromedp.Navigate(raw.URL), chromedp.WaitReady(chromedp.CSS("body"))); err != nil {
		t.Fatal(err)
	}
	for i := 0; dialogs.Load() == 0 && i < 100; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if dialogs.Load() != 1 {
		t.Fatalf("the control page's script opened %d dialogs, want 1: the detector is blind", dialogs.Load())
	}
	dialogs.Store(0)

	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	for _, p := range append(f.pages(), "/log?session="+esc(hostile)) {
		if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+p), chromedp.WaitReady(chromedp.CSS("body"))); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		// The hostile strings are visible, as text.
		if p == "/tasks/"+f.hx {
			if got := text(t, ctx, "#task-kind"); got != hostile {
				t.Errorf("kind shown as %q", got)
			}
			if got := text(t, ctx, "#task-failure"); got != hostile {
				t.Errorf("failure shown as %q", got)
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d alert(s) opened: a user's script ran", n)
	}
}

// TestBrowserDNSRebinding is the attack of issue 43 §2 in a real browser: chromium resolves
// evil.example to 127.0.0.1 (as an attacker's DNS does after the page has loaded), loads the
// console by that name, and the page's own script (same origin as far as the browser knows)
// asks for a task and posts a retry. The console, actions on and an Authorize that lets
// everyone through, answers 421 to both and the task stays failed; by 127.0.0.1 the same
// script reads the task and the retry acts (the control: the script and the browser work).
// Before the Host check the page loaded by evil.example read the task and retried it (200).
func TestBrowserDNSRebinding(t *testing.T) {
	ctx, _ := browser(t, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1"))
	f := newFixture(t)
	srv := newServer(t, f.q, withActions())
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	attack := `(async () => {
		const task = await fetch("/api/tasks/` + f.failed + `");
		const retry = await fetch("/api/tasks/` + f.failed + `/retry", {method: "POST"});
		return [task.status, retry.status, (await task.text()).includes("card declined")];
	})()`
	run := func(origin string) []any {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Navigate(origin+"/log"), chromedp.WaitReady(chromedp.CSS("body"))); err != nil {
			t.Fatalf("%s: %v", origin, err)
		}
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]any](attack, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("the script on %s: %v", origin, err)
		}
		return got
	}
	evil := "http://evil.example:" + port
	if err := chromedp.Do(ctx, chromedp.Navigate(evil+"/tasks/"+f.failed), chromedp.WaitReady(chromedp.CSS("body"))); err != nil {
		t.Fatal(err)
	}
	if body, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body"))); !strings.Contains(body, "does not answer to the host") || strings.Contains(body, "card declined") {
		t.Errorf("the task page by evil.example:\n%s", body)
	}
	if got := run(evil); fmt.Sprint(got) != "[421 421 false]" {
		t.Errorf("the rebinding page's script: task, retry, read = %v, want [421 421 false]", got)
	}
	if st := taskState(t, f.q, "checkout-1", f.failed); st != work.TaskFailed {
		t.Fatalf("the rebinding page retried the task: %v", st)
	}
	if got := run(srv.URL); fmt.Sprint(got) != "[200 200 true]" {
		t.Errorf("the console's own page's script: task, retry, read = %v, want [200 200 true]", got)
	}
	if st := taskState(t, f.q, "checkout-1", f.failed); st != work.TaskPending {
		t.Errorf("the console's own retry: %v", st)
	}
}
