package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// treeHash hashes every file of dir but the lock files, which a read-only open takes.
func treeHash(t *testing.T, dir string) [32]byte {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" || d.Name() == "WORKLOG.lock" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		io.WriteString(h, p)
		h.Write(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

func TestServeIsReadOnlyAndLocal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	var out, errb bytes.Buffer
	if code := runContext(context.Background(), []string{"demo", dir, "--seed", "1"}, &out, &errb); code != 0 {
		t.Fatalf("demo: %d %s", code, errb.String())
	}
	before := treeHash(t, dir)
	var sout bytes.Buffer
	a := &app{out: bufio.NewWriter(&sout), stdout: &sout, stderr: &errb, progress: "never"}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- a.serve(ctx, dir, "127.0.0.1:0", ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("listening on %s", addr)
	}
	base := "http://" + addr
	for _, p := range []string{"/", "/sessions", "/sessions/checkout-4821", "/log", "/stats", "/verify?run=1", "/api/stats"} {
		r, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Errorf("GET %s: %d %s", p, r.StatusCode, b)
		}
		if p == "/verify?run=1" && !strings.Contains(string(b), "OK: the stored projection") {
			t.Errorf("verify over the read-only store: %s", b)
		}
	}
	// Every action is refused, and the store is unchanged.
	r, err := http.Get(base + "/log?type=task_submitted&from=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	i := strings.Index(string(b), "tasks/task_")
	if i < 0 {
		t.Fatal("no task link in the log page")
	}
	id := string(b[i+6 : i+6+len("task_")+32])
	pr, err := http.Post(base+"/api/tasks/"+id+"/cancel", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	pr.Body.Close()
	if pr.StatusCode != http.StatusForbidden {
		t.Errorf("cancel on replay serve: %d", pr.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a.out.Flush()
	if !strings.Contains(sout.String(), "read-only") || !strings.Contains(sout.String(), "this machine only") {
		t.Errorf("serve did not say where it listens: %q", sout.String())
	}
	if treeHash(t, dir) != before {
		t.Error("replay serve changed the store")
	}
}

func TestServeRefusesWhatItCannotOpen(t *testing.T) {
	var out, errb bytes.Buffer
	code := runContext(context.Background(), []string{"serve", filepath.Join(t.TempDir(), "nothing")}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "no such directory") {
		t.Fatalf("%d %q", code, errb.String())
	}
	code = runContext(context.Background(), []string{"serve"}, &out, &errb)
	if code == 0 {
		t.Fatal("serve without DIR succeeded")
	}
}
