package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgServerStats measures the PostgreSQL server's processes, which the child's rusage does not
// cover: CPU time (the postmaster's own and its reaped children's, plus every live child's) and
// peak memory as the sum of proportional set sizes (shared buffers counted once). It needs the
// server on this machine, readable /proc entries, and a superuser to tell the data directory.
type pgServerStats struct {
	pid     int
	cpu0    float64
	stopCh  chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	peakPSS int64
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
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			s.samplePSS()
			select {
			case <-t.C:
			case <-s.stopCh:
				return
			}
		}
	}()
}

// stop returns the server's CPU seconds since start and its peak PSS in KiB.
func (s *pgServerStats) stop() (float64, int64) {
	close(s.stopCh)
	s.wg.Wait()
	s.samplePSS()
	return s.cpu() - s.cpu0, s.peakPSS
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

func (s *pgServerStats) cpu() float64 {
	f := statFields(s.pid)
	if len(f) < 17 {
		return 0
	}
	ticks := atoi(f[13]) + atoi(f[14]) + atoi(f[15]) + atoi(f[16]) // utime stime cutime cstime
	for _, c := range children(s.pid) {
		if cf := statFields(c); len(cf) >= 15 {
			ticks += atoi(cf[13]) + atoi(cf[14])
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

func children(ppid int) []int {
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
