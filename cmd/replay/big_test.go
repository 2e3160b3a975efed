package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestBigStore builds a store of more than a million events and runs the commands on it,
// reporting their time and the peak memory (max RSS) of each replay process. It takes
// minutes, so it only runs with WORKLOG_BIG=1:
//
//	WORKLOG_BIG=1 go test ./cmd/replay -run TestBigStore -v -timeout 30m
//
// WORKLOG_BIG_DIR=path keeps the store there (and reuses it when it exists).
func TestBigStore(t *testing.T) {
	if os.Getenv("WORKLOG_BIG") == "" {
		t.Skip("set WORKLOG_BIG=1 to build a store of a million events and check replay's memory on it")
	}
	dir := os.Getenv("WORKLOG_BIG_DIR")
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "big")
	}
	if _, err := os.Stat(filepath.Join(dir, "WORKLOG")); err != nil {
		start := time.Now()
		buildBigStore(t, dir, 265_000)
		t.Logf("built the store in %v", time.Since(start).Round(time.Millisecond))
	}
	var st statsJSON
	r := timed(t, "stats", dir, "--json")
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	last := st.LastSeq
	if last < 1_000_000 {
		t.Fatalf("the store has %d events, want a million", last)
	}
	t.Logf("store: %d events, %d tasks, %d wakes, %d sessions, %s on disk", last, st.Tasks.Total, st.Wakes.Total, st.Sessions, humanBytes(st.DiskBytes))

	cache := t.TempDir()
	deep := strconv.FormatUint(last-1000, 10)
	mid := strconv.FormatUint(last/2, 10)
	const bound = 256 << 20 // streaming commands: bounded, whatever the log's length
	for _, c := range []struct {
		args  []string
		limit int64
	}{
		{[]string{"log", dir}, bound},
		{[]string{"export", dir}, bound},
		{[]string{"log", dir, "--type", "task_settle_rejected", "--json"}, bound},
		{[]string{"verify", dir}, bound},
		{[]string{"stats", dir}, bound},
		{[]string{"log", dir, "--session", "sess-0042"}, bound},
		{[]string{"timeline", dir, "--session", "sess-0042"}, bound},
		{[]string{"state", dir, "--session", "sess-0042", "--at-seq", mid}, bound},
		// The full state holds every task and wake: it is bounded by the state, not the log.
		{[]string{"state", dir, "--at-seq", deep, "--no-cache", "--json"}, 2 << 30},
		{[]string{"state", dir, "--at-seq", deep, "--cache-dir", cache, "--cost", "--json"}, 2 << 30},
		{[]string{"state", dir, "--at-seq", deep, "--cache-dir", cache, "--cost", "--json"}, 2 << 30},
		{[]string{"state", dir, "--at-seq", mid, "--cache-dir", cache, "--cost", "--json"}, 2 << 30},
	} {
		r := timed(t, c.args...)
		if r.maxRSS > c.limit {
			t.Errorf("%v: peak memory %s, more than %s", c.args[0], humanBytes(uint64(r.maxRSS)), humanBytes(uint64(c.limit)))
		}
	}
}

type timedResult struct {
	stdout string
	maxRSS int64
}

// timed runs replay, discarding large output, and logs its wall time and peak memory.
func timed(t *testing.T, args ...string) timedResult {
	t.Helper()
	cmd := exec.Command(replayBin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cacheHome)
	var out limitedBuffer
	cmd.Stdout = &out
	var errb limitedBuffer
	cmd.Stderr = &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child's peak memory is VmHWM of its own address space, read while it runs:
	// rusage's max RSS would count the test process's memory, which the child shares between
	// fork and exec.
	var rss int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if v := vmHWM(cmd.Process.Pid); v > rss {
				rss = v
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	wg.Wait()
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, errb.String())
	}
	note := ""
	if errb.Len() > 0 {
		note = " — " + errb.String()
	}
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if i == 1 {
			shown[i] = "$BIG"
		}
	}
	t.Logf("replay %s: %v, peak RSS %s, %s of output%s", strings.Join(shown, " "), elapsed.Round(time.Millisecond),
		humanBytes(uint64(rss)), humanBytes(uint64(out.n)), strings.TrimSpace(note))
	return timedResult{stdout: out.String(), maxRSS: rss}
}

// vmHWM reads a process's peak resident set size from /proc, in bytes (0 when gone). Only
// the replay binary's own address space counts: it is read after exec.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	if !strings.Contains(string(b), "Name:\treplay\n") {
		return 0 // not yet exec'd (the test binary is replay.test)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// limitedBuffer keeps the first megabyte and counts the rest.
type limitedBuffer struct {
	buf []byte
	n   int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.n += len(p)
	if room := 1<<20 - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *limitedBuffer) Len() int       { return len(b.buf) }
func (b *limitedBuffer) String() string { return string(b.buf) }

var _ io.Writer = (*limitedBuffer)(nil)

// buildBigStore writes n tasks through work.Open with many concurrent callers (SyncNever):
// every task submitted, claimed and settled; a tenth crash and are redelivered after their
// lease expired (their first worker's late Finish then fenced off); a quarter wake their
// session on completion, and those wakes are claimed and acknowledged. About 3.9 events per
// task.
func buildBigStore(t *testing.T, dir string, n int) {
	ctx := context.Background()
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	t0 := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	const workers = 32
	parallel := func(count int, fn func(i int) error) {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := w; i < count; i += workers {
					if err := fn(i); err != nil {
						errs <- err
						return
					}
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	parallel(n, func(i int) error {
		r := work.TaskRequest{Kind: fmt.Sprintf("kind-%d", i%7), Input: json.RawMessage(fmt.Sprintf(`{"n":%d,"payload":"abcdefghijklmnopqrstuvwxyz"}`, i))}
		if i%4 == 0 {
			r.Wake = work.WakeOnCompletion
		}
		_, err := q.Session(fmt.Sprintf("sess-%04d", i%2000)).SubmitAt(ctx, r, t0.Add(time.Duration(i)*time.Millisecond))
		return err
	})
	claimAll := func(now time.Time) []work.TaskDelivery {
		var all []work.TaskDelivery
		for {
			ds, err := q.ClaimDueAt(ctx, now, 10*time.Minute, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 0 {
				return all
			}
			all = append(all, ds...)
		}
	}
	first := claimAll(t0.Add(time.Hour))
	var crashed []work.TaskDelivery
	var mu sync.Mutex
	parallel(len(first), func(i int) error {
		if i%10 == 3 {
			mu.Lock()
			crashed = append(crashed, first[i])
			mu.Unlock()
			return nil
		}
		_, err := q.FinishAt(ctx, first[i], work.Success(json.RawMessage(`{"ok":true}`)), t0.Add(time.Hour+time.Second))
		return err
	})
	second := claimAll(t0.Add(time.Hour + 20*time.Minute))
	parallel(len(second), func(i int) error {
		_, err := q.FinishAt(ctx, second[i], work.Failure("flaky upstream"), t0.Add(time.Hour+21*time.Minute))
		return err
	})
	parallel(len(crashed), func(i int) error {
		if i%5 != 0 {
			return nil
		}
		_, err := q.FinishAt(ctx, crashed[i], work.Success(nil), t0.Add(time.Hour+22*time.Minute))
		if err == nil {
			return fmt.Errorf("a stale finish was accepted")
		}
		return nil
	})
	for {
		ws, err := q.ClaimWakesAt(ctx, t0.Add(2*time.Hour), time.Minute, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) == 0 {
			break
		}
		parallel(len(ws), func(i int) error { return q.AckWakeAt(ctx, ws[i], t0.Add(2*time.Hour+time.Second)) })
	}
}
