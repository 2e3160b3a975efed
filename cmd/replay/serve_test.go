package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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
	go func() { done <- a.serve(ctx, dir, "127.0.0.1:0", nil, ready) }()
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

// TestServeRefusesForeignHosts (issue 43 §2): replay serve answers only to the Host names it
// listens on — localhost and the loopback addresses for 127.0.0.1, and the names of
// --allow-host — so a page of another site cannot read the store through a DNS name of its
// own that points at 127.0.0.1 (DNS rebinding): every page, the JSON API and the live tail
// are 421 for any other Host, and show nothing of the store. Before, GET /log with a foreign
// Host was 200 with every task.
func TestServeRefusesForeignHosts(t *testing.T) {
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
	go func() { done <- a.serve(ctx, dir, "127.0.0.1:0", []string{"ops-box.internal"}, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(addr, ":")
	get := func(path, host string) (int, string) {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+addr+path, nil)
		req.Host = host
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		if r.Header.Get("Content-Type") == "text/event-stream" {
			return r.StatusCode, "(a live tail)"
		}
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		return r.StatusCode, string(b)
	}
	// A task of the store, to look for in the refusals.
	code, logPage := get("/log?type=task_submitted&from=1", addr)
	i := strings.Index(logPage, "tasks/task_")
	if code != 200 || i < 0 {
		t.Fatalf("the log page on its own address: %d", code)
	}
	id := logPage[i+6 : i+6+len("task_")+32]
	for _, host := range []string{"evil.example:" + port, "evil.example", "127.0.0.1.nip.io:" + port, "ops-box.internal.evil.example:" + port} {
		for _, p := range []string{"/", "/log", "/log?type=task_submitted&from=1", "/sessions", "/sessions/checkout-4821", "/tasks/" + id,
			"/api/tasks/" + id, "/api/stats", "/log/stream?from=1", "/stats", "/verify?run=1"} {
			code, body := get(p, host)
			if code != http.StatusMisdirectedRequest || strings.Contains(body, id) || strings.Contains(body, "checkout-4821") {
				t.Errorf("GET %s with Host %s: %d (want 421, and nothing of the store)", p, host, code)
			}
		}
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "ops-box.internal:" + port, "OPS-BOX.internal."} {
		if code, body := get("/tasks/"+id, host); code != 200 || !strings.Contains(body, id) {
			t.Errorf("GET /tasks/%s with Host %s: %d", id, host, code)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a.out.Flush()
	if !strings.Contains(sout.String(), "answers to the Host names localhost and the loopback addresses, ops-box.internal;") {
		t.Errorf("serve did not say which names it answers to: %q", sout.String())
	}
	if treeHash(t, dir) != before {
		t.Error("replay serve changed the store")
	}
}

// serveHosts: the address replay serve listens on is a name it answers to (each interface
// address for 0.0.0.0 and ::), a loopback one adds nothing (the console answers loopback
// names always), and --allow-host names follow.
func TestServeHosts(t *testing.T) {
	tcp := func(s string) net.Addr {
		a, err := net.ResolveTCPAddr("tcp", s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if got := serveHosts(tcp("127.0.0.1:8080"), []string{"a.example"}); !slices.Equal(got, []string{"a.example"}) {
		t.Errorf("loopback: %q", got)
	}
	if got := serveHosts(tcp("[::1]:8080"), nil); len(got) != 0 {
		t.Errorf("::1: %q", got)
	}
	if got := serveHosts(tcp("10.1.2.3:8080"), []string{"a.example"}); !slices.Equal(got, []string{"10.1.2.3", "a.example"}) {
		t.Errorf("10.1.2.3: %q", got)
	}
	all := serveHosts(tcp("0.0.0.0:8080"), []string{"a.example"})
	if all[len(all)-1] != "a.example" || slices.Contains(all, "0.0.0.0") || slices.Contains(all, "127.0.0.1") {
		t.Errorf("0.0.0.0: %q", all)
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() && !slices.Contains(all, n.IP.String()) {
			t.Errorf("0.0.0.0: %s is missing from %q", n.IP, all)
		}
	}
}

// A malformed --allow-host is a clear error naming the flag; serve listens on nothing.
func TestServeBadAllowHost(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	var out, errb bytes.Buffer
	if code := runContext(context.Background(), []string{"demo", dir, "--seed", "1"}, &out, &errb); code != 0 {
		t.Fatalf("demo: %d %s", code, errb.String())
	}
	errb.Reset()
	code := runContext(context.Background(), []string{"serve", dir, "--addr", "127.0.0.1:0", "--allow-host", "https://ops.example.com"}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "--allow-host") || !strings.Contains(errb.String(), "https://ops.example.com") {
		t.Fatalf("%d %q", code, errb.String())
	}
}
