package work_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/work"
)

// BenchmarkSubmitInspect is BenchmarkSubmit's worklog case with the inspection endpoint
// (Options.NoInspect) off, on and idle, and on with a `replay log --follow` process attached
// (the real binary, built once, printing every event to a pipe the benchmark drains). The
// targets (issue 44; docs/design.md §1, "A store held by a running process"): idle within
// noise of off, a follower within 5%. Compare the modes with scripts/inspect-rounds.sh:
// each in a process of its own, their order rotated from round to round (in one process
// the later cases run on a warmer heap and page cache than the first).
func BenchmarkSubmitInspect(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d/inspect=off", n), func(b *testing.B) { benchSubmitInspect(b, n, "off") })
		b.Run(fmt.Sprintf("callers=%d/inspect=idle", n), func(b *testing.B) { benchSubmitInspect(b, n, "idle") })
		b.Run(fmt.Sprintf("callers=%d/inspect=follow", n), func(b *testing.B) { benchSubmitInspect(b, n, "follow") })
	}
}

var replayBinForBench string

func buildReplayForBench(b *testing.B) string {
	if replayBinForBench != "" {
		return replayBinForBench
	}
	bin := filepath.Join(b.TempDir(), "replay")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/worklog/worklog/cmd/replay").CombinedOutput(); err != nil {
		b.Fatalf("building replay: %v\n%s", err, out)
	}
	replayBinForBench = bin
	return bin
}

func benchSubmitInspect(b *testing.B, callers int, mode string) {
	var bin string
	if mode == "follow" {
		bin = buildReplayForBench(b)
		// The binary lives in the first sub-benchmark's TempDir: copy the path's life.
		replayBinForBench = ""
	}
	var replayPid int
	fs := &syncCountFS{FS: vfs.Default}
	dir := b.TempDir()
	q, err := work.Open(dir, &work.Options{FS: fs, NoInspect: mode == "off"})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	sessions := make([]*work.Session, callers)
	for i := range sessions {
		sessions[i] = q.Session(fmt.Sprintf("session-%03d", i))
	}
	if mode == "follow" {
		if _, err := sessions[0].SubmitAt(ctx, benchRequest, time.Now()); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(bin, "log", dir, "--follow", "--progress", "never")
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		br := bufio.NewReader(out)
		l, err := br.ReadString('\n') // the history: the follower is attached
		if err != nil || !strings.Contains(l, "task_submitted") {
			b.Fatalf("replay log --follow: %q %v", l, err)
		}
		go io.Copy(io.Discard, br)
		replayPid = cmd.Process.Pid
	}
	replay0 := procCPU(replayPid)
	wal0 := fs.stats()
	closedLoop(b, callers, func(w int) error {
		_, err := sessions[w].SubmitAt(ctx, benchRequest, time.Now())
		return err
	})
	fs.stats().since(wal0).report(b, b.N)
	if replayPid != 0 {
		// The follower's own CPU (user+system) per submitted event: it holds under load, where
		// ops/s does not.
		b.ReportMetric(float64((procCPU(replayPid)-replay0).Microseconds())/float64(b.N), "replay-cpu-µs/op")
	}
}

// procCPU is the CPU time (user+system) process pid has used so far, from /proc (Linux; 0
// elsewhere, and for pid 0), in clock ticks of 10ms.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name (which may hold spaces) in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}
