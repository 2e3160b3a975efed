package pgtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A test binary killed by its -timeout (or SIGKILL) never runs Main's Stop: its servers
// would run on, each with its port, shared memory and processes, until someone stops them
// by hand. So every server directory records its owner — the process that made it, by pid
// and start time (a pid alone may be reused) — and Start first stops the servers whose owner
// is gone and removes their directories. A server whose owner is alive, or whose directory
// has no owner file (made before this rule), is left alone.

// ownerFile, in a server's directory, names the process that owns the server.
const ownerFile = "owner"

// dirPrefix is the name of every server directory (the standby's too) under os.TempDir.
const dirPrefix = "worklog-pgtest-"

// writeOwner records this process as the owner of the server in dir.
func writeOwner(dir string) error {
	start, err := startTime(os.Getpid())
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), fmt.Appendf(nil, "%d %d\n", os.Getpid(), start), 0o644)
}

// startTime is pid's start time (clock ticks since boot, /proc/PID/stat field 22).
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])) // state is field 3
	if len(fields) < 20 {
		return 0, fmt.Errorf("pgtest: /proc/%d/stat: %d fields", pid, len(fields))
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// ownerGone reports whether the owner recorded in dir has exited (false when dir has no
// owner file, or it cannot be read).
func ownerGone(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil || pid <= 0 {
		return false
	}
	now, err := startTime(pid)
	return err != nil || now != start || stateOf(pid) == 'Z'
}

// ReapOrphans stops every server under os.TempDir whose owner is gone (SIGKILL of its
// processes: the data is thrown away) and removes its directory. Start calls it; the
// directories are claimed by a rename first, so two binaries starting at once do not both
// stop one server. It returns the directories it removed.
func ReapOrphans() []string {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	var reaped []string
	for _, dir := range dirs {
		if !ownerGone(dir) {
			continue
		}
		claimed := filepath.Join(filepath.Dir(dir), "worklog-orphan-"+strings.TrimPrefix(filepath.Base(dir), dirPrefix))
		if os.Rename(dir, claimed) != nil {
			continue // another binary claimed it
		}
		if pm := postmasterOf(claimed, dir); pm > 0 {
			killServer(pm)
		}
		os.RemoveAll(claimed)
		reaped = append(reaped, dir)
	}
	return reaped
}

// postmasterOf is the pid of the postmaster running on the data directory of dir (now at
// claimed), 0 when none runs: postmaster.pid's first line, if that process's command line
// still names dir's data directory (the pid may have been reused).
func postmasterOf(claimed, dir string) int {
	b, err := os.ReadFile(filepath.Join(claimed, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pm <= 1 {
		return 0
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pm))
	if err != nil || !bytes.Contains(cmd, []byte(filepath.Join(dir, "data"))) {
		return 0
	}
	return pm
}

// killServer kills the postmaster pm and every child of it with SIGKILL, and returns once
// all are gone (or after 30 s, false). The postmaster is stopped (SIGSTOP) and its stop
// waited for first, as Freezer.Freeze does: a fork in progress when a signal arrives
// completes, so its child is in /proc, and in the list, only once the postmaster has
// stopped; a child listed before that, or after the postmaster died (it is then reparented),
// could run on.
func killServer(pm int) bool {
	deadline := time.Now().Add(30 * time.Second)
	syscall.Kill(pm, syscall.SIGSTOP)
	for !gone(pm) && stateOf(pm) != 'T' && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	procs := append(childrenOf(pm), pm)
	for _, pid := range procs {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range procs {
		for !gone(pid) {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return true
}

// gone reports whether pid has exited (a zombie has: it only waits to be reaped).
func gone(pid int) bool {
	switch stateOf(pid) {
	case 0, 'Z', 'X':
		return true
	}
	return false
}
