package work_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
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
// noise of off, a follower within 5%. Run the three interleaved, several times (-count 1 in
// a loop), on a quiet machine.
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
	}
	wal0 := fs.stats()
	closedLoop(b, callers, func(w int) error {
		_, err := sessions[w].SubmitAt(ctx, benchRequest, time.Now())
		return err
	})
	fs.stats().since(wal0).report(b, b.N)
}
