package work_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

const (
	largeValueDirEnv    = "WORKLOG_LARGEVALUE_DIR"
	largeValueInputEnv  = "WORKLOG_LARGEVALUE_INPUT"
	largeValueOutputEnv = "WORKLOG_LARGEVALUE_OUTPUT"
	// largeValueVerboseEnv, set, makes the child log its RSS after every step.
	largeValueVerboseEnv = "WORKLOG_LARGEVALUE_VERBOSE"
)

// TestLargeValueMemory is the memory bound of issue 11 item 8: one task with a value of the
// documented maximum (64 MiB: work.Options.MaxValueBytes) must not drive the process to many
// times its size. Each case runs the whole life of one task in a child process (the test
// binary again: peak RSS is a property of a process) and compares the child's peak RSS with a
// child that runs the same life with tiny values, in multiples of the value bytes (input +
// output).
//
// The issue asks for at most 4x, and this test holds it. Format 1 reached 27-29x for a
// 64 MiB input (1.9 GB; every claim and finish rewrote the task record with its input) and
// 41x for a 64 MiB output; format 2 with its memory work 7.9-9.8x and 12.3-13.1x, most of it
// Pebble's (a large batch is a flushable batch of twice its size, flushed at once with ~3
// more copies of the value). Format 4 keeps values of pebblelog.BlobMin bytes or more out of
// Pebble, in blob files written before the command is queued (pebblelog/blob.go), and a
// staged value is not copied by the work package (ownValue): ~2.0x for both. What is left is
// a read's decode (the value is handed out) and the garbage collector's headroom.
func TestLargeValueMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three child processes that move 64 MiB values")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS meaningless")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads the peak RSS from /proc")
	}
	const big = 64 << 20
	base := largeValueChild(t, 16, 16)
	for _, c := range []struct {
		name          string
		input, output int
		bound         float64
	}{
		{"input", big, 16, 4},
		{"output", 16, big, 4}, // the completion wake's event refers to the output's blob
	} {
		peak := largeValueChild(t, c.input, c.output)
		values := int64(c.input + c.output)
		grew := peak - base
		t.Logf("%s: peak RSS %d MiB, baseline %d MiB: %.2fx the %d MiB of values", c.name,
			peak>>20, base>>20, float64(grew)/float64(values), values>>20)
		if float64(grew) > c.bound*float64(values) {
			t.Errorf("%s: peak RSS grew by %d MiB for %d MiB of values (%.2fx); the bound is %gx",
				c.name, grew>>20, values>>20, float64(grew)/float64(values), c.bound)
		}
	}
}

// largeValueChild runs TestLargeValueHelperProcess with the given value sizes and returns
// its peak RSS in bytes.
func largeValueChild(t *testing.T, input, output int) int64 {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLargeValueHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), largeValueDirEnv+"="+dir,
		largeValueInputEnv+"="+strconv.Itoa(input), largeValueOutputEnv+"="+strconv.Itoa(output))
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestLargeValueHelperProcess")) {
		t.Fatalf("child (input %d, output %d): %v\n%s", input, output, err, out)
	}
	// The child's own high-water mark, not the parent's rusage of it: Linux starts a child's
	// ru_maxrss at the RSS of the process it was forked from (the mm it shared until exec),
	// so the baseline would be this test binary's size after every test before it.
	m := regexp.MustCompile(`peak-rss (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("child (input %d, output %d) reported no peak RSS:\n%s", input, output, out)
	}
	peak, _ := strconv.ParseInt(string(m[1]), 10, 64)
	if testing.Verbose() {
		t.Logf("child (input %d, output %d):\n%s", input, output, out)
	}
	// The store the child left verifies (here, outside the measured process).
	q, err := work.Open(dir, &work.Options{MaxValueBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Verify(context.Background()); err != nil {
		t.Fatalf("child (input %d, output %d): %v", input, output, err)
	}
	return peak
}

// randomJSONString is a JSON string value of exactly n bytes (n >= 2) of random letters: random,
// so that compression in Pebble does not hide what a copy costs.
func randomJSONString(rng *rand.Rand, n int) json.RawMessage {
	b := make([]byte, n)
	b[0], b[n-1] = '"', '"'
	for i := 1; i < n-1; i++ {
		b[i] = 'a' + byte(rng.IntN(26))
	}
	return b
}

// TestLargeValueHelperProcess is not a test: it is the child of TestLargeValueMemory. It takes
// one task through submit, a claim whose lease expires, a re-claim, finish, the completion
// wake's claim and ack, and reads the task back, checking the values at every step. The
// caller's own copies are dropped as soon as it has checked them, as a real caller would.
func TestLargeValueHelperProcess(t *testing.T) {
	dir := os.Getenv(largeValueDirEnv)
	if dir == "" {
		t.Skip("child process of TestLargeValueMemory")
	}
	inSize, _ := strconv.Atoi(os.Getenv(largeValueInputEnv))
	outSize, _ := strconv.Atoi(os.Getenv(largeValueOutputEnv))
	ctx := context.Background()
	// SyncNever: the memory is the point. The 64 MiB blob files are fsynced anyway (every
	// sync mode fsyncs a blob before its batch commits: about 1 s more in all here, 4-5 s
	// against 4 s); SyncNever still spares the WAL's fsyncs.
	q, err := work.Open(dir, &work.Options{MaxValueBytes: 64 << 20, Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	verbose := os.Getenv(largeValueVerboseEnv) != ""
	check := func(what string, got []byte, want [32]byte) {
		t.Helper()
		if sha256.Sum256(got) != want {
			t.Fatalf("%s: %d bytes, not the value stored", what, len(got))
		}
		if verbose {
			t.Logf("%-20s %s", what, memStatus())
		}
	}

	input := randomJSONString(rng, inSize)
	inSum := sha256.Sum256(input)
	s := q.Session("s")
	task, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "big", Input: input, Wake: work.WakeOnCompletion}, at(0))
	if err != nil {
		t.Fatal(err)
	}
	input = nil
	check("submit", task.Input, inSum)
	task = work.Task{}

	claim := func(now int, lease time.Duration) work.TaskDelivery {
		t.Helper()
		ds, err := q.ClaimDueAt(ctx, at(now), lease, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 1 {
			t.Fatalf("claim at %d: %d deliveries", now, len(ds))
		}
		check(fmt.Sprintf("claim at %d", now), ds[0].Task.Input, inSum)
		ds[0].Task.Input = nil
		return ds[0]
	}
	claim(1, time.Second) // never finished: its lease expires
	d := claim(5, time.Minute)
	if d.Attempt != 2 {
		t.Fatalf("re-claim: attempt %d, want 2", d.Attempt)
	}

	output := randomJSONString(rng, outSize)
	outSum := sha256.Sum256(output)
	done, err := q.FinishAt(ctx, d, work.Success(output), at(6))
	if err != nil {
		t.Fatal(err)
	}
	output = nil
	check("finish: input", done.Input, inSum)
	check("finish: output", done.Outcome.Output, outSum)
	done = work.Task{}

	wds, err := q.ClaimWakesAt(ctx, at(7), time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(wds) != 1 || wds[0].Wake.Reason.Outcome == nil {
		t.Fatalf("wake claim: %d deliveries", len(wds))
	}
	check("completion wake", wds[0].Wake.Reason.Outcome.Output, outSum)
	wds[0].Wake.Reason.Outcome.Output = nil
	if err := q.AckWakeAt(ctx, wds[0], at(8)); err != nil {
		t.Fatal(err)
	}
	wds = nil

	got, ok, err := s.Task(ctx, d.Task.ID)
	if err != nil || !ok {
		t.Fatalf("reading the task back: %v, %v", ok, err)
	}
	check("read back: input", got.Input, inSum)
	check("read back: output", got.Outcome.Output, outSum)
	if got.State != work.TaskSucceeded || got.Attempts != 2 {
		t.Fatalf("read back: %s after %d attempts", got.State, got.Attempts)
	}
	fmt.Printf("peak-rss %d\n", peakRSS(t))
	if verbose {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		t.Logf("heap sys %d MiB, total alloc %d MiB, GCs %d", ms.HeapSys>>20, ms.TotalAlloc>>20, ms.NumGC)
	}
}

// peakRSS is the process's peak resident set in bytes (VmHWM).
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmHWM in /proc/self/status")
	}
	kib, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kib << 10
}

// memStatus is the process's peak and current RSS, from /proc/self/status.
func memStatus() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") || strings.HasPrefix(line, "VmRSS:") {
			out = append(out, strings.Join(strings.Fields(line), " "))
		}
	}
	return strings.Join(out, ", ")
}

// TestLargeValueSnapshotsOwned: a durable queue hands large values to the caller without
// copying them again (pebblelog.OwnedValueMin), so each one must be the caller's alone: a
// caller that overwrites the input or output it got changes nothing that the store or any
// later caller sees. A value of pebblelog.BlobMin bytes or more is stored in a blob file
// before its command runs and not copied at all: the snapshot Submit or Finish returns shares
// the caller's own request bytes, so there the caller overwrites both at once, and still
// nothing else changes.
func TestLargeValueSnapshotsOwned(t *testing.T) {
	for _, size := range []int{64 << 10, pebblelog.BlobMin + 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) { testSnapshotsOwned(t, size) })
	}
}

func testSnapshotsOwned(t *testing.T, size int) {
	ctx := context.Background()
	q, err := work.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	input, output := randomJSONString(rng, size), randomJSONString(rng, size)
	inSum, outSum := sha256.Sum256(input), sha256.Sum256(output)
	scribble := func(b []byte) {
		for i := 1; i < len(b)-1; i++ {
			b[i] = 'X'
		}
	}
	same := func(what string, got []byte, want [32]byte) {
		t.Helper()
		if sha256.Sum256(got) != want {
			t.Fatalf("%s: %.20q..., not the value stored", what, got)
		}
	}
	staged := size >= pebblelog.BlobMin
	s := q.Session("s")
	task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: input, Wake: work.WakeOnCompletion})
	if err != nil {
		t.Fatal(err)
	}
	if staged {
		same("submit", task.Input, inSum)
		scribble(input) // the snapshot shares these bytes: the store keeps them in a blob
	} else {
		scribble(input) // the caller's own bytes: the store copied them
		same("submit", task.Input, inSum)
		scribble(task.Input)
	}
	ds, err := q.ClaimDue(ctx, time.Minute, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %d deliveries, %v", len(ds), err)
	}
	same("claim", ds[0].Task.Input, inSum)
	scribble(ds[0].Task.Input)
	done, err := q.Finish(ctx, ds[0], work.Success(output))
	if err != nil {
		t.Fatal(err)
	}
	outAgain := bytes.Clone(output)
	if !staged {
		scribble(output)
	}
	same("finish: input", done.Input, inSum)
	same("finish: output", done.Outcome.Output, outSum)
	scribble(done.Input)
	scribble(done.Outcome.Output)
	// A repeated finish reads the task through the writer (and its record cache), not View.
	if done, err = q.Finish(ctx, ds[0], work.Success(outAgain)); err != nil {
		t.Fatalf("repeated finish: %v", err)
	}
	same("repeated finish: input", done.Input, inSum)
	same("repeated finish: output", done.Outcome.Output, outSum)
	scribble(done.Input)
	scribble(done.Outcome.Output)
	wds, err := q.ClaimWakes(ctx, time.Minute, 10)
	if err != nil || len(wds) != 1 {
		t.Fatalf("wake claim: %d deliveries, %v", len(wds), err)
	}
	same("completion wake", wds[0].Wake.Reason.Outcome.Output, outSum)
	scribble(wds[0].Wake.Reason.Outcome.Output)
	for i := 0; i < 2; i++ {
		got, ok, err := s.Task(ctx, task.ID)
		if err != nil || !ok {
			t.Fatalf("read back: %v, %v", ok, err)
		}
		same("read back: input", got.Input, inSum)
		same("read back: output", got.Outcome.Output, outSum)
		scribble(got.Input)
		scribble(got.Outcome.Output)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

// SettleAndClaim stages a large output as Finish does: it is stored in one blob file, shared
// by the settle and the completion wake, read back whole, and the snapshot it returns is the
// caller's own bytes; an invalid settle beside it stages nothing that stays.
func TestLargeValueSettleAndClaim(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	s := q.Session("s")
	task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(`1`), Wake: work.WakeOnCompletion})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDue(ctx, time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	out := randomJSONString(rand.New(rand.NewPCG(5, 6)), pebblelog.BlobMin+1)
	sum := sha256.Sum256(out)
	bad := work.Outcome{State: work.TaskSucceeded, Output: randomJSONString(rand.New(rand.NewPCG(7, 8)), pebblelog.BlobMin)}
	bad.Output[1] = '{' // not JSON: refused by its own validation
	res, _, err := q.SettleAndClaim(ctx, []work.Settle{
		{Delivery: ds[0], Outcome: new(work.Success(out))},
		{Delivery: work.TaskDelivery{}, Outcome: &bad},
	}, nil, time.Minute, 0)
	if err != nil || len(res) != 2 || res[0].Err != nil || res[1].Err == nil {
		t.Fatalf("SettleAndClaim: %+v, %v", res, err)
	}
	if sha256.Sum256(res[0].Task.Outcome.Output) != sum || &res[0].Task.Outcome.Output[0] != &out[0] {
		t.Error("the settle's snapshot is not the caller's own output")
	}
	blobs, err := os.ReadDir(dir + "/" + pebblelog.BlobDir)
	if err != nil || len(blobs) != 1 {
		t.Fatalf("blob files: %d, %v; want the output's only", len(blobs), err)
	}
	got, ok, err := s.Task(ctx, task.ID)
	if err != nil || !ok || sha256.Sum256(got.Outcome.Output) != sum {
		t.Fatalf("read back: %v, %v", ok, err)
	}
	wds, err := q.ClaimWakes(ctx, time.Minute, 1)
	if err != nil || len(wds) != 1 || sha256.Sum256(wds[0].Wake.Reason.Outcome.Output) != sum {
		t.Fatalf("completion wake: %d, %v", len(wds), err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
