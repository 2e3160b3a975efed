package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// replayGuarded is replay with a guard: a run that has not ended after a generous minute is
// killed and fails the test, so that a regression to blocking fails instead of hanging.
func replayGuarded(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, replayBin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cacheHome, "HOME="+cacheHome)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("replay %v blocked (killed after a minute)", args)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// TestFIFORefused: a FIFO where replay expects a file (a store's WORKLOG marker, an archive
// segment) is refused, naming it, instead of blocking replay until something writes into it.
func TestFIFORefused(t *testing.T) {
	t.Parallel()
	marker := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(marker, "WORKLOG"), 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	arch := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(arch, "seg-000001.wla"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"verify", marker}, "WORKLOG is not a regular file"},
		{[]string{"log", marker}, "WORKLOG is not a regular file"},
		{[]string{"log", demoStore(t), "--archive", arch}, "seg-000001.wla: not a regular file"},
		{[]string{"verify", demoStore(t), "--archive", arch}, "seg-000001.wla: not a regular file"},
	} {
		r := replayGuarded(t, tc.args...)
		if r.code != exitError || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("replay %v: exit %d, stderr %q: want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func TestRedactDSN(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:pw@h/db?search_path=q", "postgres://u:xxxxx@h/db?search_path=q"},
		{"postgres://u@h/db?search_path=q&password=pw", "postgres://u@h/db?search_path=q&password=xxxxx"},
		{"postgresql://h/db?sslpassword=pw&password=pw2&x=1", "postgresql://h/db?sslpassword=xxxxx&password=xxxxx&x=1"},
		{"postgres://h/db?pass%77ord=pw", "postgres://h/db?pass%77ord=xxxxx"},
		{"postgres://h/db?%20password=pw", "postgres://h/db?%20password=xxxxx"},
		{"postgres://u:p@ss/w@h/db?search_path=q", "postgres://u:xxxxx@h/db?search_path=q"},
		{"postgres://u:pa?ss@h/db?search_path=q&password=pw", "postgres://u:xxxxx@h/db?search_path=q&password=xxxxx"},
		{"postgres://h:5432/db?application_name=a@b", "postgres://h:5432/db?application_name=a@b"},
		{"postgres://u@h/db?search_path=q&sslkey=/k.pem&passfile=/p", "postgres://u@h/db?search_path=q&sslkey=/k.pem&passfile=/p"},
		{"host=h password=pw dbname=d", "host=h password=xxxxx dbname=d"},
		{"host=h password = 'p w\\'x' sslpassword=s", "host=h password=xxxxx sslpassword=xxxxx"},
		{"./store", "./store"},
	} {
		if got := redactDSN(tc.in); got != tc.want {
			t.Errorf("redactDSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestDSNSecretsMasked: no secret of a PostgreSQL URL (the userinfo password, the password
// and sslpassword query parameters) reaches any output: stats (text and JSON), the other
// commands, the HTML page, connection errors, a key=value DSN taken for a directory.
func TestDSNSecretsMasked(t *testing.T) {
	t.Parallel()
	const secret = "s3cret"
	bad := []string{
		"postgres://127.0.0.1:1/jobs?search_path=q&connect_timeout=5&password=" + secret + "-1",
		"postgres://127.0.0.1:1/jobs?search_path=q&connect_timeout=5&sslpassword=" + secret + "-2",
		"host=127.0.0.1 port=1 password=" + secret + "-3",
	}
	for _, dsn := range bad {
		for _, cmd := range []string{"stats", "log", "verify"} {
			r := replayGuarded(t, cmd, dsn)
			if r.code != exitError || strings.Contains(r.stdout+r.stderr, secret) {
				t.Errorf("replay %s %s: exit %d, output shows the secret:\n%s%s", cmd, dsn, r.code, r.stdout, r.stderr)
			}
		}
	}
	pgtest.Need(t)
	dsn := postgresDemo(t) + "&password=" + secret + "-4&sslpassword=" + secret + "-5"
	html := filepath.Join(t.TempDir(), "t.html")
	for _, args := range [][]string{
		{"stats", dsn}, {"stats", dsn, "--json"}, {"verify", dsn}, {"log", dsn}, {"state", dsn},
		{"timeline", dsn, "--session", "checkout-4821", "--html", html},
	} {
		r := replayGuarded(t, args...)
		if r.code != exitOK {
			t.Fatalf("replay %v: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
		if strings.Contains(r.stdout+r.stderr, secret) {
			t.Errorf("replay %v shows the secret:\n%s%s", args, r.stdout, r.stderr)
		}
	}
	b, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secret) || !strings.Contains(string(b), "password=xxxxx") {
		t.Errorf("the HTML page shows the secret or not the masked DSN")
	}
}

// hostileStore builds a store whose every user-controlled string (session, kind, idempotency
// key, release reason, error, payloads, worker) carries terminal escapes, BEL and line breaks, and
// returns it with a task's id and the session.
func hostileStore(t *testing.T) (dir, taskID, session string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "store")
	ctx := context.Background()
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const evil = "\x1b]0;owned\x07\x1b[2J\r\n2026-03-02T09:00:00.000Z  forged\x7f\u0085\u202e\x9b[31m"
	session = "sess" + evil
	s := q.Session(session)
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	input := json.RawMessage(`{"k":"\u001b[31mred\r\n"}`)
	task, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "kind" + evil, IdempotencyKey: "key" + evil, Input: input, Wake: work.WakeOnCompletion}, t0)
	if err != nil {
		t.Fatal(err)
	}
	taskID = task.ID
	if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "other" + evil, Input: input}, t0); err != nil {
		t.Fatal(err)
	}
	// Invalid UTF-8 alone (no other control byte to make it quoted): 0x9B is CSI to an 8-bit
	// terminal, and ranging over it yields the printable U+FFFD.
	if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "bare\x9b[31m", Input: input}, t0); err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(work.WithWorker(ctx, "worker"+evil), t0.Add(time.Second), time.Minute, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claim: %v %d", err, len(ds))
	}
	for _, d := range ds {
		if d.Task.ID == taskID {
			if _, err := q.ReleaseAt(ctx, d, work.ReleaseRequest{RunAt: t0.Add(2 * time.Second), Reason: "reason" + evil}, t0.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		} else if _, err := q.FinishAt(ctx, d, work.Failure("error"+evil), t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	ds, err = q.ClaimDueAt(ctx, t0.Add(3*time.Second), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v %d", err, len(ds))
	}
	if _, err := q.FinishAt(ctx, ds[0], work.Success(input), t0.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WakeAt(ctx, work.WakeRequest{IdempotencyKey: "wake" + evil, Payload: input}, t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, taskID, session
}

// controlBytes lists the control characters in s other than the line breaks between lines
// and the tabs of tab-separated output: C0, DEL, C1 and the bidirectional overrides, which
// move the cursor, set a terminal's title, forge lines or reorder what a reader sees.
func controlBytes(s string) []string {
	var bad []string
	for i, r := range s {
		if r == '\n' || r == '\t' {
			continue
		}
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				bad = append(bad, fmt.Sprintf("invalid UTF-8 byte %#x at byte %d", s[i], i))
				continue
			}
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
			bad = append(bad, fmt.Sprintf("%U at byte %d", r, i))
		}
	}
	return bad
}

// TestHostileStringsEscaped: every command's text output shows user-controlled strings
// quoted or escaped: no escape sequence, BEL or carriage return reaches the terminal, and no
// string breaks a line.
func TestHostileStringsEscaped(t *testing.T) {
	t.Parallel()
	dir, id, session := hostileStore(t)
	html := filepath.Join(t.TempDir(), "t.html")
	for _, args := range [][]string{
		{"log", dir},
		{"log", dir, "--session", session},
		{"log", dir, "--task", id},
		{"state", dir},
		{"state", dir, "--at-seq", "3"},
		{"state", dir, "--session", session},
		{"timeline", dir, "--session", session, "--html", html},
		{"timeline", dir},
		{"task", dir, id},
		{"verify", dir},
		{"stats", dir},
		{"log", dir, "--session", "nope" + session},
	} {
		r := replayGuarded(t, args...)
		for name, out := range map[string]string{"stdout": r.stdout, "stderr": r.stderr} {
			if bad := controlBytes(out); len(bad) > 0 {
				t.Errorf("replay %q: %s holds control characters (%s):\n%s", args[:1], name, strings.Join(bad, ", "), out)
			}
		}
	}
}
