package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
		{"export", dir},
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

// TestHeldStoreFollowAndServe: log --follow on a held store prints the events the holder
// commits after it started; replay serve on a held store serves its live pages, a task
// submitted while it serves included, and refuses every action.
func TestHeldStoreFollowAndServe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "held")
	h := startHolder(t, dir)
	first := h.do(t, "submit 2")
	f := startFollowing(t, "log", dir, "--follow")
	if got := f.read(t, "history", 2); !strings.Contains(got[1], first) {
		t.Fatalf("log --follow: history %q lacks %s", got, first)
	}
	next := h.do(t, "submit 1")
	if got := f.read(t, "a new event", 1); !strings.Contains(got[0], next) || !strings.Contains(got[0], "task_submitted") {
		t.Fatalf("log --follow printed %q, want the submission of %s", got, next)
	}
	failed := h.do(t, "claim")
	if got := f.read(t, "a claim and a failure", 2); !strings.Contains(got[1], failed) || !strings.Contains(got[1], "outcome=failed") {
		t.Fatalf("log --follow printed %q, want the failure of %s", got, failed)
	}

	var sout, errb bytes.Buffer
	a := &app{out: bufio.NewWriter(&sout), stdout: &sout, stderr: &errb, progress: "never"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- a.serve(ctx, dir, "127.0.0.1:0", nil, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	get := func(p string) string {
		t.Helper()
		r, err := http.Get("http://" + addr + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", p, r.StatusCode, b)
		}
		return string(b)
	}
	if b := get("/tasks/" + failed); !strings.Contains(b, "boom") {
		t.Errorf("the task page of %s lacks its failure:\n%s", failed, b)
	}
	live := h.do(t, "submit 1") // while serve runs: the next page shows it
	if b := get("/sessions/s1"); !strings.Contains(b, live) {
		t.Errorf("the session page lacks %s, submitted while serve ran", live)
	}
	if b := get("/verify?run=1"); !strings.Contains(b, "OK: the stored projection") {
		t.Errorf("verify through serve: %s", b)
	}
	pr, err := http.Post("http://"+addr+"/api/tasks/"+live+"/cancel", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	pr.Body.Close()
	if pr.StatusCode != http.StatusForbidden {
		t.Errorf("cancel through replay serve of a held store: %d", pr.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out := mustReplay(t, "task", dir, live); !strings.Contains(out, "pending") {
		t.Errorf("the cancel reached the store:\n%s", out)
	}
}

// TestHeldStoreKilled: a holder killed with SIGKILL leaves its socket file; replay then
// opens the store itself, and the next work.Open removes the stale socket and serves anew.
func TestHeldStoreKilled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "held")
	h := startHolder(t, dir)
	id := h.do(t, "submit 2")
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.cmd.Wait()
	sock := filepath.Join(dir, "WORKLOG.sock")
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("no stale socket after SIGKILL (the test needs one): %v", err)
	}
	if out := mustReplay(t, "log", dir); !strings.Contains(out, id) {
		t.Errorf("log of the store the killed process held:\n%s", out)
	}
	h2 := startHolder(t, dir)
	id2 := h2.do(t, "submit 1")
	if out := mustReplay(t, "log", dir); !strings.Contains(out, id) || !strings.Contains(out, id2) {
		t.Errorf("log through the new endpoint:\n%s", out)
	}
	h2.do(t, "close")
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket after Close: %v", err)
	}
}

// TestHeldStoreLongPath: a store whose DIR/WORKLOG.sock is too long for a socket address
// (108 bytes on Linux) is served from the runtime directory, which DIR/WORKLOG.sock-path
// names, and replay finds it.
func TestHeldStoreLongPath(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 130 {
		dir = filepath.Join(dir, "a-rather-long-directory-name")
	}
	h := startHolder(t, dir)
	id := h.do(t, "submit 1")
	if _, err := os.Lstat(filepath.Join(dir, "WORKLOG.sock")); !os.IsNotExist(err) {
		t.Errorf("a socket at a path of %d bytes: %v", len(dir)+13, err)
	}
	ptr, err := os.ReadFile(filepath.Join(dir, "WORKLOG.sock-path"))
	if err != nil {
		t.Fatal(err)
	}
	if p := strings.TrimSpace(string(ptr)); !strings.HasPrefix(p, "@") {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("the socket %s: %v %v", p, fi, err)
		}
	}
	if out := mustReplay(t, "log", dir); !strings.Contains(out, id) {
		t.Errorf("log through the endpoint of a long path:\n%s", out)
	}
	h.do(t, "close")
	if _, err := os.Lstat(filepath.Join(dir, "WORKLOG.sock-path")); !os.IsNotExist(err) {
		t.Errorf("the pointer file after Close: %v", err)
	}
}
