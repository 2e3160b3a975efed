package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
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
			t.Fatalf("replay %v: exit %d\n%s", args, r.code, r.stderr)
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
