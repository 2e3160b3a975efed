package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// settle waits, before a child starts, until the work the previous child left behind is
// done, so that it is not charged to the next system: PostgreSQL's dirty shared buffers
// (CHECKPOINT, on the server pgDSN names, if any) and the kernel's dirty page cache (sync,
// then Dirty + Writeback in /proc/meminfo below settleDirtyMax). Without it, a system that
// ran after River on PostgreSQL ran while the kernel wrote back River's tens of megabytes
// of table pages, and its commits' fsyncs waited behind that writeback. Every system gets
// the same treatment; it returns what it found, for the log. It gives up waiting after
// settleWait (the run goes on; the log says so).
func settle(pgDSN string) (string, float64) {
	start := time.Now()
	before := dirtyKiB()
	if pgDSN != "" {
		ctx, cancel := context.WithTimeout(context.Background(), settleWait)
		if conn, err := pgx.Connect(ctx, pgDSN); err == nil {
			_, err = conn.Exec(ctx, "CHECKPOINT")
			conn.Close(ctx)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: settle: CHECKPOINT: %v\n", err)
			}
		}
		cancel()
	}
	syscall.Sync()
	left := dirtyKiB()
	for left > settleDirtyMax && time.Since(start) < settleWait {
		time.Sleep(50 * time.Millisecond)
		left = dirtyKiB()
	}
	note := ""
	if left > settleDirtyMax {
		note = " (gave up waiting)"
	}
	probe := cpuProbe()
	return fmt.Sprintf("settled in %.1f s: %d KiB dirty before, %d after%s; CPU probe %.0f MB/s",
		time.Since(start).Seconds(), before, left, note, probe), probe
}

// cpuProbe is how fast one core hashes (SHA-256, MB/s, the median of five passes over
// 16 MiB), taken just before a child starts: a figure that falls from one child to the next
// says the machine got slower (a busy neighbour on the host takes the core's cycles without
// steal time), not the system measured. The code and the data it runs are the same every
// time.
func cpuProbe() float64 {
	buf := make([]byte, 1<<20)
	rates := make([]float64, 5)
	for i := range rates {
		t := time.Now()
		for range 16 {
			sha256.Sum256(buf)
		}
		rates[i] = 16 / time.Since(t).Seconds() * (1 << 20) / 1e6
	}
	slices.Sort(rates)
	return rates[2]
}

const (
	settleDirtyMax = 4 << 10 // KiB
	settleWait     = 60 * time.Second
)

// dirtyKiB is the kernel's Dirty + Writeback, in KiB (-1 if /proc/meminfo cannot be read).
func dirtyKiB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "Dirty:" || f[0] == "Writeback:") {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			n += v
		}
	}
	return n
}
