package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgServerStats measures the PostgreSQL server's processes, which the child's rusage does not
// cover: CPU time (the postmaster's own and its reaped children's, plus every live child's) and
// peak memory as the sum of proportional set sizes (shared buffers counted once). It needs the
// server on this machine, readable /proc entries, and a superuser to tell the data directory.
//
// The sampling is the client's CPU (it reads the server's /proc files from this process):
// it runs on an OS thread of its own, whose CPU time stop reports, so that the client's
// figures leave it out (result.SamplerCPU).
type pgServerStats struct {
	pid        int
	cpu0       float64
	stopCh     chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	peakPSS    int64
	samplerCPU float64 // the sampling thread's CPU seconds, set when it ends
}

const clockTicks = 100 // USER_HZ on Linux

func newPGServerStats(ctx context.Context, dsn string) (*pgServerStats, error) {
	if dsn == "" {
		return nil, fmt.Errorf("no DSN")
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	var dataDir string
	if err := c.QueryRow(ctx, `SELECT setting FROM pg_settings WHERE name = 'data_directory'`).Scan(&dataDir); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return nil, err
	}
	return &pgServerStats{pid: pid}, nil
}

func (s *pgServerStats) start() {
	s.cpu0 = s.cpu()
	s.stopCh = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// The thread ends with the goroutine (it stays locked): no other goroutine runs on
		// it, so its CPU time is the sampling's.
		runtime.LockOSThread()
		t0 := threadCPU()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			s.samplePSS()
			select {
			case <-t.C:
			case <-s.stopCh:
				s.samplePSS() // the last sample, after the phases
				s.samplerCPU = threadCPU() - t0
				return
			}
		}
	}()
}

// stop returns the server's CPU seconds since start and its peak PSS in KiB; samplerCPU is
// then what sampling cost this process.
func (s *pgServerStats) stop() (float64, int64) {
	close(s.stopCh)
	s.wg.Wait()
	return s.cpu() - s.cpu0, s.peakPSS
}

// threadCPU is the calling thread's user+sys CPU seconds (RUSAGE_THREAD).
func threadCPU() float64 {
	const rusageThread = 1 // Linux's RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return tv(ru.Utime) + tv(ru.Stime)
}

func (s *pgServerStats) samplePSS() {
	var sum int64
	for _, pid := range append([]int{s.pid}, children(s.pid)...) {
		sum += pss(pid)
	}
	s.mu.Lock()
	s.peakPSS = max(s.peakPSS, sum)
	s.mu.Unlock()
}

// cpu is the server's CPU seconds so far: the postmaster's own, its reaped children's
// (cutime, cstime) and its live children's. A child reaped between the postmaster's figures
// and the children's would be missed (or counted twice, the other way round), and the
// children file of /proc lists what the kernel has at hand, not always every child: a W2
// phase once read -1.8 s of server CPU (2026-12-04). So the children are found by a scan of
// /proc, and the whole is read again while the postmaster's reaped figures move under it.
func (s *pgServerStats) cpu() float64 {
	var ticks int64
	for range 10 {
		f := statFields(s.pid)
		if len(f) < 17 {
			return 0
		}
		reaped := atoi(f[15]) + atoi(f[16])        // cutime cstime
		ticks = atoi(f[13]) + atoi(f[14]) + reaped // utime stime
		for _, c := range scanChildren(s.pid) {
			if cf := statFields(c); len(cf) >= 15 {
				ticks += atoi(cf[13]) + atoi(cf[14])
			}
		}
		if f := statFields(s.pid); len(f) < 17 || atoi(f[15])+atoi(f[16]) == reaped {
			break // no child reaped meanwhile
		}
	}
	return float64(ticks) / clockTicks
}

// statFields splits /proc/pid/stat into its fields, the command name (which may hold spaces)
// as one.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return append([]string{"pid", "comm"}, strings.Fields(s[i+1:])...)
}

// children lists ppid's child processes: from /proc/ppid/task/*/children, one small file for
// each of its threads (the postmaster has one), which the kernel keeps. Only without those
// files (a kernel built without CONFIG_PROC_CHILDREN) does it scan every process of the
// machine, as it did always before: on a busy machine that scan, every 250 ms, was most of
// the client's CPU profile.
func children(ppid int) []int {
	if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", ppid)); err == nil {
		var out []int
		read := false
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", ppid, t.Name()))
			if err != nil {
				continue
			}
			read = true
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					out = append(out, pid)
				}
			}
		}
		if read {
			return out
		}
	}
	return scanChildren(ppid)
}

// scanChildren finds ppid's children among every process in /proc.
func scanChildren(ppid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	want := strconv.Itoa(ppid)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(pid); len(f) > 3 && f[3] == want {
			out = append(out, pid)
		}
	}
	return out
}

func pss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			return atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return n
}

// phaseCounters are cumulative counters read at a phase's start and end, whose differences
// say what else the phase paid for (issue 24: one tree's W2 spread 1.7× between runs): the
// WAL written (the server's insert position: exact; full-page images from pg_stat_wal, which
// backends report at most once a second, so approximate), the checkpoints begun (after one,
// the first change to every page writes the whole page to the WAL again), the server's
// processes' CPU, this process's CPU, and the time the hypervisor gave the machine's CPUs to
// others (steal, /proc/stat).
type phaseCounters struct {
	walLSN      int64
	walFPI      int64
	checkpoints int64
	serverCPU   float64
	clientCPU   float64
	steal       float64
	ok          bool // the server's counters were read
}

// readPhaseCounters reads the counters; the server's only when srv is set (PostgreSQL rows).
func readPhaseCounters(ctx context.Context, dsn string, srv *pgServerStats) phaseCounters {
	c := phaseCounters{clientCPU: selfCPU(), steal: stealSeconds()}
	if srv == nil {
		return c
	}
	c.serverCPU = srv.cpu()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return c
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,
		(SELECT wal_fpi FROM pg_stat_wal), (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)`).
		Scan(&c.walLSN, &c.walFPI, &c.checkpoints)
	c.ok = err == nil
	return c
}

// stealSeconds is the machine's steal time so far, every CPU together (/proc/stat's first
// line, eighth value, in USER_HZ ticks).
func stealSeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	return float64(atoi(f[8])) / clockTicks
}

// w2Phase fills r's W2 figures from the counters read before and after the phase.
func (r *result) w2Phase(before, after phaseCounters, tasks int) {
	r.W2ClientCPU = after.clientCPU - before.clientCPU
	r.W2Steal = after.steal - before.steal
	if before.ok && after.ok {
		r.W2ServerCPU = after.serverCPU - before.serverCPU
		r.W2WALPerTask = float64(after.walLSN-before.walLSN) / float64(tasks)
		r.W2FPI = after.walFPI - before.walFPI
		r.W2Checkpoints = after.checkpoints - before.checkpoints
	}
}
