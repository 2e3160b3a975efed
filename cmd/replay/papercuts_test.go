package main

import (
	"strings"
	"testing"
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
