package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// A store held by a running process, read through its inspection endpoint (issue 44 §1):
// the holder is this test binary re-executed (holderMain), a real process with a real Pebble
// store that submits when told; replay is the real binary.

const holderEnv = "REPLAY_TEST_HOLDER"

// holderMain opens the store in dir with work.Open (the endpoint on) and serves commands on
// stdin, one a line, answering each on stdout:
//
//	submit N   submits N tasks of kind "k" in session "s1"; answers "ok <last task id>"
//	claim      claims one due task and fails it; answers "ok <task id>"
//	close      closes the queue; answers "ok <seconds Close took>"
func holderMain(dir string) int {
	q, err := work.Open(dir, nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer q.Close()
	ctx := context.Background()
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "submit":
			n, _ := strconv.Atoi(f[1])
			var id string
			for i := 0; i < n; i++ {
				r, err := q.Session("s1").Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(fmt.Sprintf(`{"n":%d}`, i))})
				if err != nil {
					fmt.Println("error", err)
					return 1
				}
				id = r.ID
			}
			fmt.Println("ok", id)
		case "claim":
			ds, err := q.ClaimDue(ctx, time.Minute, 1)
			if err != nil || len(ds) != 1 {
				fmt.Println("error", err, len(ds))
				return 1
			}
			if _, err := q.Finish(ctx, ds[0], work.Failure("boom")); err != nil {
				fmt.Println("error", err)
				return 1
			}
			fmt.Println("ok", ds[0].Task.ID)
		case "close":
			start := time.Now()
			err := q.Close()
			fmt.Println("ok", time.Since(start).Seconds(), err)
			return 0
		}
	}
	return 0
}

// holder is a running holderMain.
type holder struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startHolder(t *testing.T, dir string) *holder {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+dir)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	h := &holder{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	if got := h.line(t); got != "ready" {
		t.Fatalf("holder: %q", got)
	}
	return h
}

func (h *holder) line(t *testing.T) string {
	t.Helper()
	if !h.out.Scan() {
		t.Fatalf("holder ended: %v", h.out.Err())
	}
	return h.out.Text()
}

// do sends a command and returns the answer's argument.
func (h *holder) do(t *testing.T, cmd string) string {
	t.Helper()
	if _, err := fmt.Fprintln(h.in, cmd); err != nil {
		t.Fatal(err)
	}
	l := h.line(t)
	if !strings.HasPrefix(l, "ok") {
		t.Fatalf("holder %s: %s", cmd, l)
	}
	return strings.TrimSpace(strings.TrimPrefix(l, "ok"))
}

// TestHeldStoreReadLive: every read command works on a store a running process holds and
// shows its live state, the same as it prints once the process has closed the store.
func TestHeldStoreReadLive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "held")
	h := startHolder(t, dir)
	h.do(t, "submit 3")
	failed := h.do(t, "claim")
	last := h.do(t, "submit 2")

	fi, err := os.Stat(filepath.Join(dir, "WORKLOG.sock"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("WORKLOG.sock: mode %v, want a socket of mode 0600", fi.Mode())
	}

	cmds := [][]string{
		{"log", dir},
		{"state", dir},
		{"task", dir, failed},
		{"task", dir, last, "--json"},
		{"timeline", dir, "--session", "s1"},
		{"verify", dir},
		{"log", dir, "--json"},
	}
	live := map[int]string{}
	for i, args := range cmds {
		r := replay(t, args...)
		if r.code != 0 {
			t.Fatalf("replay %v on the held store: exit %d\n%s", args, r.code, r.stderr)
		}
		live[i] = r.stdout
	}
	if !strings.Contains(live[0], last) || !strings.Contains(live[0], "outcome=failed") {
		t.Errorf("log of the held store lacks the live events:\n%s", live[0])
	}
	if !strings.Contains(live[5], "ok. The log has 7 events") {
		t.Errorf("verify of the held store:\n%s", live[5])
	}
	st := mustReplay(t, "stats", dir)
	if !strings.Contains(st, "Log           7 events") || !strings.Contains(st, "by state  pending 4, running 0, succeeded 0, failed 1") {
		t.Errorf("stats of the held store:\n%s", st)
	}

	// Once the holder has closed the store, replay opens it itself: the same output.
	h.do(t, "close")
	if err := h.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "WORKLOG.sock")); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after Close: %v", err)
	}
	for i, args := range cmds {
		if got := mustReplay(t, args...); got != live[i] {
			t.Errorf("replay %v: through the endpoint it printed what it does not print on the closed store:\n%s",
				args, diffLines(got, live[i]))
		}
	}
}
