package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// demoIDs finds the ids the golden commands need in the demo store, by kind, so that the
// test does not hard-code them (the golden files do, and -update refreshes them).
func demoIDs(t *testing.T, dir string) map[string]string {
	t.Helper()
	ids := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(mustReplay(t, "export", dir)))
	for sc.Scan() {
		var e eventJSON
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		switch {
		case e.Event == "task_submitted" && ids[e.Kind] == "":
			ids[e.Kind] = e.TaskID
		case e.Event == "wake_ack_rejected":
			ids["redelivered-wake"] = e.WakeID
		}
	}
	return ids
}

var diskBytes = regexp.MustCompile(`"disk_bytes":\d+`)

func TestGolden(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	ids := demoIDs(t, dir)
	charge := ids["charge-card"]
	cases := []struct {
		name string
		args []string
	}{
		{"log.txt", []string{"log", dir}},
		{"log-json.txt", []string{"log", dir, "--json"}},
		{"log-session.txt", []string{"log", dir, "--session", "checkout-4821"}},
		{"log-kind.txt", []string{"log", dir, "--type", "task_claimed,task_settle_rejected", "--type", "wake_ack_rejected"}},
		{"log-range.txt", []string{"log", dir, "--from", "5", "--to", "9"}},
		{"log-since-until.txt", []string{"log", dir, "--since", "2026-03-02T09:00:40Z", "--until", "2026-03-02T09:00:45Z"}},
		{"log-task.txt", []string{"log", dir, "--task", charge}},
		{"log-wake.txt", []string{"log", dir, "--wake", ids["redelivered-wake"]}},
		{"log-task-kind.txt", []string{"log", dir, "--task-kind", "summarize"}},
		{"log-session-range-limit.txt", []string{"log", dir, "--session", "chat-7f3a", "--from", "10", "--to", "40", "--limit", "3"}},
		{"state-seq0.txt", []string{"state", dir, "--at-seq", "0"}},
		{"state-seq22.txt", []string{"state", dir, "--at-seq", "22", "--no-cache"}},
		{"state-seq22-json.txt", []string{"state", dir, "--at-seq", "22", "--json", "--no-cache"}},
		{"state-at.txt", []string{"state", dir, "--at", "2026-03-02T09:00:35Z", "--no-cache"}},
		{"state-end.txt", []string{"state", dir, "--no-cache"}},
		{"state-session.txt", []string{"state", dir, "--session", "checkout-4821", "--at-seq", "30"}},
		{"state-session-at-json.txt", []string{"state", dir, "--session", "checkout-4821", "--at", "2026-03-02T09:00:35Z", "--json"}},
		{"timeline-checkout.txt", []string{"timeline", dir, "--session", "checkout-4821"}},
		{"timeline-report.txt", []string{"timeline", dir, "--session", "nightly-report-0302"}},
		{"timeline-chat.txt", []string{"timeline", dir, "--session", "chat-7f3a"}},
		{"task-charge.txt", []string{"task", dir, charge}},
		{"task-charge-json.txt", []string{"task", dir, charge, "--json"}},
		{"task-receipt-released.txt", []string{"task", dir, ids["send-receipt"]}},
		{"task-export-canceled-running.txt", []string{"task", dir, ids["export-csv"]}},
		{"task-report-canceled-pending.txt", []string{"task", dir, ids["build-report"]}},
		{"task-wake-redelivered.txt", []string{"task", dir, ids["redelivered-wake"]}},
		{"verify.txt", []string{"verify", dir}},
		{"verify-json.txt", []string{"verify", dir, "--json"}},
		{"stats.txt", []string{"stats", dir}},
		{"stats-json.txt", []string{"stats", dir, "--json"}},
	}
	for _, c := range cases {
		got := mustReplay(t, c.args...)
		got = diskBytes.ReplaceAllString(normalize(got, dir), `"disk_bytes":0`)
		golden(t, c.name, got)
	}

	// export is log --json, byte for byte.
	if a, b := mustReplay(t, "export", dir), mustReplay(t, "log", dir, "--json"); a != b {
		t.Errorf("export and log --json differ")
	}

	// The HTML page is deterministic too, and self-contained.
	page := filepath.Join(t.TempDir(), "checkout.html")
	mustReplay(t, "timeline", dir, "--session", "checkout-4821", "--html", page)
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	html := normalize(string(b), dir)
	for _, external := range []string{"<script", "<link", "src=", "@import", "url(http", "href="} {
		if strings.Contains(html, external) {
			t.Errorf("the timeline page refers to something outside itself: %q", external)
		}
	}
	golden(t, "timeline-checkout.html", html)
}

func TestDemoGolden(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "demo")
	golden(t, "demo.txt", normalize(mustReplay(t, "demo", dir, "--seed", "1"), dir))

	// The same seed gives the same store, event for event.
	if a, b := mustReplay(t, "export", dir, "--show-tokens"), mustReplay(t, "export", demoStore(t), "--show-tokens"); a != b {
		t.Error("two demo stores built with --seed 1 differ")
	}
	// demo never writes into a directory that has files.
	r := replay(t, "demo", dir)
	if r.code != 2 || !strings.Contains(r.stderr, "is not empty") {
		t.Errorf("demo into an existing store: exit %d, stderr %q", r.code, r.stderr)
	}
}

var (
	demoTempName = regexp.MustCompile(`worklog-demo-\d+`)
	demoKeptSize = regexp.MustCompile(`\([0-9.]+ [KMG]?i?B on disk\)`)
)

// TestDemoTempDir: with no DIR the store goes to a new temporary directory, which demo names
// and removes when it is done, unless --keep, which names it and its size.
func TestDemoTempDir(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		tmp := t.TempDir() // the child's TMPDIR: what demo leaves behind is all in here
		args := []string{"demo", "--seed", "1"}
		name := "demo-temp.txt"
		if keep {
			args, name = append(args, "--keep"), "demo-keep.txt"
		}
		r := replayEnv(t, []string{"TMPDIR=" + tmp}, args...)
		if r.code != 0 {
			t.Fatalf("replay %v: exit %d\n%s", args, r.code, r.stderr)
		}
		m := regexp.MustCompile(`Built a sample worklog store in (\S+) \(seed 1\)`).FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("demo does not say where the store is:\n%s", r.stdout)
		}
		store := m[1]
		if filepath.Dir(store) != tmp {
			t.Errorf("the temporary store %s is not in TMPDIR %s", store, tmp)
		}
		if !strings.Contains(r.stdout, "ok. The log has 47 events") {
			t.Errorf("demo output lacks the verify result:\n%s", r.stdout)
		}
		left, _ := os.ReadDir(tmp)
		if keep {
			if !strings.Contains(r.stdout, "Kept the store in "+store+" (") {
				t.Errorf("demo --keep does not say where it kept the store:\n%s", r.stdout)
			}
			mustReplay(t, "verify", store)
		} else if len(left) != 0 {
			t.Errorf("demo left %v in TMPDIR", left)
		}
		out := strings.ReplaceAll(r.stdout, tmp, "$TMPDIR")
		out = demoKeptSize.ReplaceAllString(demoTempName.ReplaceAllString(out, "worklog-demo-N"), "(SIZE on disk)")
		golden(t, name, out)
	}
	// A DIR given to demo is the caller's: always kept, so --keep with one is a mistake.
	r := replay(t, "demo", filepath.Join(t.TempDir(), "d"), "--keep")
	if r.code != exitError || !strings.Contains(r.stderr, "a DIR given to demo is always kept") {
		t.Errorf("demo DIR --keep: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"", "log", "state", "timeline", "task", "verify", "stats", "export", "import", "demo", "version"} {
		args := []string{"--help"}
		if cmd != "" {
			args = []string{cmd, "--help"}
		}
		out := mustReplay(t, args...)
		if !strings.Contains(out, "Example") {
			t.Errorf("replay %s --help has no example", cmd)
		}
		name := cmd
		if name == "" {
			name = "replay"
		}
		golden(t, "help/"+name+".txt", out)
	}
}
