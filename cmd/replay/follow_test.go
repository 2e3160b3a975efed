package main

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// following is a replay log --follow process, its stdout read line by line.
type following struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *syncBuffer
}

// syncBuffer is a bytes.Buffer the test reads while the process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startFollowing(t *testing.T, args ...string) *following {
	t.Helper()
	cmd := exec.Command(replayBin, args...)
	cmd.Env = append(cmd.Environ(), "XDG_CACHE_HOME="+cacheHome, "HOME="+cacheHome)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f := &following{cmd: cmd, lines: make(chan string, 1024), stderr: &syncBuffer{}}
	cmd.Stderr = f.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f.lines <- sc.Text()
		}
		close(f.lines)
	}()
	return f
}

// read returns the next n lines.
func (f *following) read(t *testing.T, what string, n int) []string {
	t.Helper()
	var got []string
	deadline := time.After(30 * time.Second)
	for len(got) < n {
		select {
		case l, ok := <-f.lines:
			if !ok {
				t.Fatalf("%s: replay ended after %d of %d lines; stderr:\n%s", what, len(got), n, f.stderr)
			}
			got = append(got, l)
		case <-deadline:
			t.Fatalf("%s: %d of %d lines in 30 s", what, len(got), n)
		}
	}
	return got
}

// interrupt sends SIGINT, as Ctrl-C does, and requires a clean end: status 0, nothing on
// stderr but what is allowed.
func (f *following) interrupt(t *testing.T, allowed string) {
	t.Helper()
	if err := f.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("replay log --follow after Ctrl-C: %v (want status 0); stderr:\n%s", err, f.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("replay log --follow still runs 30 s after Ctrl-C")
	}
	rest := strings.TrimSpace(strings.ReplaceAll(f.stderr.String(), allowed, ""))
	if rest != "" {
		t.Errorf("replay log --follow wrote to stderr:\n%s", rest)
	}
}

func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }

// On a PostgreSQL queue, log --follow prints what log prints, then each event another process
// commits, in the same format, at once (the queue's LISTEN channel), until Ctrl-C.
func TestLogFollowPostgres(t *testing.T) {
	dsn := postgresDemo(t)
	for _, format := range [][]string{nil, {"--json"}} {
		args := append([]string{"log", dsn}, format...)
		history := lines(mustReplay(t, args...))
		f := startFollowing(t, append(args, "--follow")...)
		if got := f.read(t, "history", len(history)); strings.Join(got, "\n") != strings.Join(history, "\n") {
			t.Fatalf("log --follow %v printed\n%s\nwant what log prints:\n%s", format, strings.Join(got, "\n"), strings.Join(history, "\n"))
		}
		ctx := context.Background()
		ro, err := postgres.OpenReadOnly(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		last, err := ro.LastSeq(ctx)
		ro.Close()
		if err != nil {
			t.Fatal(err)
		}
		q, err := postgres.Open(ctx, dsn, nil) // another process's queue, as far as replay knows
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := q.Session("checkout-4821").Submit(ctx, work.TaskRequest{Kind: "email"}); err != nil {
				t.Fatal(err)
			}
		}
		q.Close()
		live := f.read(t, "live", 2)
		// The same lines log prints for those events afterwards.
		want := lines(mustReplay(t, append(args, "--from", strconv.FormatUint(last+1, 10))...))
		if strings.Join(live, "\n") != strings.Join(want, "\n") {
			t.Errorf("log --follow %v printed the new events as\n%s\nwant\n%s", format, strings.Join(live, "\n"), strings.Join(want, "\n"))
		}
		f.interrupt(t, "")
	}
}

// On a store directory no other process holds, log --follow prints what log prints, says on
// stderr that nothing can come (replay's lock keeps writers out), and ends cleanly on Ctrl-C.
// A store held by another process without an inspection endpoint is refused with the usual
// message, --follow or not.
func TestLogFollowDirectory(t *testing.T) {
	dir := demoStore(t)
	history := lines(mustReplay(t, "log", dir))
	f := startFollowing(t, "log", dir, "--follow")
	if got := f.read(t, "history", len(history)); strings.Join(got, "\n") != strings.Join(history, "\n") {
		t.Fatalf("log --follow printed\n%s\nwant what log prints:\n%s", strings.Join(got, "\n"), strings.Join(history, "\n"))
	}
	note := "replay: following " + dir + ": no process can write it while replay holds its lock, so no event will come; Ctrl-C ends"
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(f.stderr.String(), note); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no note on stderr after 30 s; stderr:\n%s", f.stderr)
		}
	}
	f.interrupt(t, note)

	q, err := work.Open(dir, &work.Options{NoInspect: true}) // a held store with its endpoint: inspect_test.go
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r := replay(t, "log", dir, "--follow")
	if r.code != 2 || !strings.Contains(r.stderr, dir+" is open in a running process") {
		t.Errorf("log --follow on a held store: exit %d, stderr:\n%s\nwant exit 2 and the held-store message", r.code, r.stderr)
	}
}

// --follow prints what is to come: a --to ends the log before it, which is a usage error.
func TestLogFollowUsage(t *testing.T) {
	r := replay(t, "log", demoStore(t), "--follow", "--to", "3")
	if r.code != 2 || !strings.Contains(r.stderr, "--follow prints the events to come: it takes no --to") {
		t.Errorf("log --follow --to: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}
