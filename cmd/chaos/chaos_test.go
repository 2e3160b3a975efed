package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestChaosChild is the body of the processes a run starts (the test binary re-executes
// itself, as the command does).
func TestChaosChild(t *testing.T) {
	switch os.Getenv(envRole) {
	case "client":
		os.Exit(clientMain())
	case "owner":
		os.Exit(ownerMain())
	}
	t.Skip("a child process of TestChaos only")
}

// TestChaos runs a short chaos run on each backend, every nemesis on: no anomaly.
func TestChaos(t *testing.T) {
	for _, backend := range []string{"pebble", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			if backend == "postgres" {
				if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) == 0 {
					t.Skip("SKIPPING the PostgreSQL chaos run: no server binaries in /usr/lib/postgresql/*/bin; install Debian's postgresql package")
				}
			}
			cfg := config{duration: 30 * time.Second, nemeses: allNemeses, backend: backend, seed: 1,
				clients: 4, maxOps: 1_000_000, out: t.TempDir(), skew: 200 * time.Millisecond,
				margin: 250 * time.Millisecond}
			res := runBackend(context.Background(), cfg, backend, cfg.out)
			t.Log(res.summary())
			if res.err != nil {
				t.Fatal(res.err)
			}
			if res.ops == 0 {
				t.Fatal("no operations ran")
			}
			if res.anomalies > 0 {
				b, _ := os.ReadFile(cfg.out + "/anomalies.txt")
				t.Fatalf("%s\n%s", res.summary(), b)
			}
		})
	}
}

// TestCheckerRuns feeds the checker handler runs by hand, on an empty Pebble store: two
// runs of one task that overlap by more than the margin are one anomaly, by less none, and
// none when the first one's process was stopped (SIGSTOP) across the second's run.
func TestCheckerRuns(t *testing.T) {
	ms := int64(time.Millisecond)
	base := time.Now().UnixNano()
	for _, c := range []struct {
		name    string
		b0, b1  int64 // the second run, ms after base; the first is [0, 1000]
		stopped bool  // the first's process was stopped 100..1000, SIGCONT at 1000 (one more step)
		want    int
	}{
		{"overlap 400ms", 600, 1500, false, 1},
		{"overlap 100ms", 900, 1500, false, 0},
		{"second inside the first", 300, 700, false, 1},
		{"short second inside the first", 300, 500, false, 0},
		{"first stopped meanwhile", 200, 990, true, 0},
		{"first stopped, steps on after SIGCONT", 200, 1500, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			h, err := newHist(dir+"/g0.0.jsonl", "g0.0")
			if err != nil {
				t.Fatal(err)
			}
			firstEnd := int64(1000)
			if c.stopped && c.b1 > 1000 {
				firstEnd = 1600 // it stepped on after SIGCONT, while the second ran
			}
			h.write(rec{T: "hstart", Task: "task_x", Kind: kindRun, Attempt: 1, At: base})
			h.write(rec{T: "hstart", Task: "task_x", Kind: kindRun, Attempt: 2, At: base + c.b0*ms})
			h.write(rec{T: "hend", Task: "task_x", Kind: kindRun, Attempt: 2, At: base + c.b1*ms})
			h.write(rec{T: "hend", Task: "task_x", Kind: kindRun, Attempt: 1, At: base + firstEnd*ms})
			h.close()
			n, err := newHist(dir+"/nemesis.jsonl", "nemesis")
			if err != nil {
				t.Fatal(err)
			}
			if c.stopped {
				n.write(rec{T: "nemesis", F: "stop", Target: "c0.0", At: base + 100*ms})
				n.write(rec{T: "nemesis", F: "cont", Target: "c0.0", At: base + 1000*ms})
			}
			n.close()
			cl := &cluster{cfg: config{margin: 250 * time.Millisecond}, backend: "pebble", dir: dir, store: dir + "/store"}
			res := cl.check(context.Background(), result{})
			if res.err != nil {
				t.Fatal(res.err)
			}
			if res.anomalies != c.want {
				b, _ := os.ReadFile(dir + "/anomalies.txt")
				t.Fatalf("%d anomalies, want %d\n%s", res.anomalies, c.want, b)
			}
		})
	}
}

// TestKeyModel: porcupine's verdict on a key's submits.
func TestKeyModel(t *testing.T) {
	op := func(call, ret int64, intent int, out keyOut) porcupine.Operation {
		return porcupine.Operation{Input: keyIn{key: "s/k", intent: intent}, Call: call, Output: out, Return: ret}
	}
	for _, c := range []struct {
		name string
		h    []porcupine.Operation
		ok   bool
	}{
		{"repeats return the first", []porcupine.Operation{op(0, 1, 1, keyOut{task: "a"}), op(2, 3, 1, keyOut{task: "a"}),
			op(4, 5, 2, keyOut{task: "a", conflict: true})}, true},
		{"a repeat returns another task", []porcupine.Operation{op(0, 1, 1, keyOut{task: "a"}), op(2, 3, 1, keyOut{task: "b"})}, false},
		{"another intent is not a conflict", []porcupine.Operation{op(0, 1, 1, keyOut{task: "a"}), op(2, 3, 2, keyOut{task: "a"})}, false},
		{"an unknown outcome wrote it", []porcupine.Operation{op(0, 100, 2, keyOut{unknown: true}), op(2, 3, 2, keyOut{task: "a"}),
			op(4, 5, 1, keyOut{task: "a", conflict: true})}, true},
		{"concurrent firsts, one wins", []porcupine.Operation{op(0, 10, 1, keyOut{task: "a"}), op(1, 11, 2, keyOut{task: "a", conflict: true})}, true},
		{"a conflict before any task", []porcupine.Operation{op(0, 1, 1, keyOut{task: "a", conflict: true}), op(2, 3, 2, keyOut{task: "a"})}, false},
	} {
		if got := porcupine.CheckOperations(keyModelOf(), c.h); got != c.ok {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.ok)
		}
	}
}
