package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Freezer stops and resumes every process of the test server (SIGSTOP, SIGCONT): the
// postmaster first, so that it forks no new backend, then its children. A frozen server's
// kernel still accepts connections and data, and nothing answers: what a hung host or a
// network that drops every packet looks like to a client.
type Freezer struct {
	t      testing.TB
	mu     sync.Mutex
	pids   []int // the postmaster, then the children stopped
	frozen bool
}

// NewFreezer finds the postmaster of the server behind dsn (the parent of the backend that
// serves a new connection). It skips t when the server is not this binary's own (Owned) or
// its processes cannot be signalled, and thaws the server when t ends: a test never leaves the
// binary's server stopped.
func NewFreezer(t testing.TB, dsn string) *Freezer {
	t.Helper()
	if !Need(t).Owned() {
		t.Skip("the server was not started by this test binary")
	}
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var backend int
	err = c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend)
	c.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	postmaster := parentOf(backend)
	if postmaster <= 1 {
		t.Skipf("cannot find the postmaster of backend %d", backend)
	}
	if err := syscall.Kill(postmaster, 0); err != nil {
		t.Skipf("cannot signal the server's processes: %v", err)
	}
	f := &Freezer{t: t, pids: []int{postmaster}}
	t.Cleanup(f.Thaw)
	return f
}

// Freeze stops the postmaster, then every child it has, and returns when each is stopped.
// SIGSTOP takes effect when a process next leaves the kernel, and a fork in progress when it
// arrives completes (a signal sent to one process does not restart a fork): so the children
// are listed only once the postmaster is stopped, when every fork it made has its child in
// /proc. Listing them at once let a backend forked meanwhile run on, and answer statements on
// the "frozen" server (TestFreezeWhileConnecting).
func (f *Freezer) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	postmaster := f.pids[0]
	if err := syscall.Kill(postmaster, syscall.SIGSTOP); err != nil {
		f.t.Errorf("SIGSTOP of the postmaster %d: %v", postmaster, err)
	}
	f.frozen = true
	f.pids = f.pids[:1]
	if !f.waitStopped(postmaster) {
		return
	}
	for _, pid := range childrenOf(postmaster) {
		if syscall.Kill(pid, syscall.SIGSTOP) == nil {
			f.pids = append(f.pids, pid)
		}
	}
	for _, pid := range f.pids[1:] {
		f.waitStopped(pid)
	}
}

// stopWait bounds how long Freeze waits for a process to stop (one in uninterruptible sleep,
// an fsync say, stops when the call returns).
const stopWait = 30 * time.Second

// waitStopped waits until pid is stopped, or gone (a backend that exited needs no stopping);
// false, and an error of the test, when it is still running after stopWait.
func (f *Freezer) waitStopped(pid int) bool {
	deadline := time.Now().Add(stopWait)
	for {
		switch s := stateOf(pid); s {
		case 0, 'T', 'Z', 'X':
			return true
		default:
			if time.Now().After(deadline) {
				f.t.Errorf("pgtest: process %d of the server is still in state %c %v after SIGSTOP", pid, s, stopWait)
				return false
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// Thaw resumes what Freeze stopped, children first; it may be called any number of times.
func (f *Freezer) Thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen {
		return
	}
	for _, pid := range append(f.pids[1:], f.pids[0]) {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	f.frozen = false
}

// parentOf is pid's parent pid from /proc (0 when it is gone).
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces, so read after its last ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// childrenOf lists the processes whose parent is parent.
func childrenOf(parent int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && parentOf(pid) == parent {
			out = append(out, pid)
		}
	}
	return out
}

// stateOf is pid's state letter from /proc (R, S, D, T, Z, ...; 0 when it is gone).
func stateOf(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 1 || len(fields[0]) == 0 {
		return 0
	}
	return fields[0][0]
}
