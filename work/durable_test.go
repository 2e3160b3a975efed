package work_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// durableHarness runs the conformance suite against work.Open on a fresh store per queue:
// a directory from t.TempDir, or, with memFS, a directory on a new in-memory filesystem.
// Reopen closes the queue and opens its store again. After every test, once the suite has
// closed its queues, each store is opened once more and verified: the store as it was left,
// not only the live queue, must be consistent (the bbolt habit).
func durableHarness(base *work.Options, memFS bool) worktest.Harness {
	type store struct {
		dir  string
		opts *work.Options
	}
	var mu sync.Mutex
	stores := map[*work.Queue]store{}
	opened := map[store][]*work.Queue{}
	open := func(t *testing.T, st store) *work.Queue {
		t.Helper()
		q, err := work.Open(st.dir, st.opts)
		if err != nil {
			t.Fatalf("Open(%s): %v", st.dir, err)
		}
		mu.Lock()
		stores[q] = st
		opened[st] = append(opened[st], q)
		mu.Unlock()
		return q
	}
	h := worktest.Harness{
		New: func(t *testing.T) *work.Queue {
			st := store{dir: t.TempDir(), opts: base}
			if memFS {
				o := work.Options{}
				if base != nil {
					o = *base
				}
				o.FS = vfs.NewMem()
				st = store{dir: "/queue", opts: &o}
			}
			t.Cleanup(func() {
				// The suite has closed its queues, unless it made this one after its own
				// cleanup was registered: close them all (closing twice is fine).
				mu.Lock()
				qs := opened[st]
				delete(opened, st)
				mu.Unlock()
				for _, q := range qs {
					q.Close()
				}
				q, err := work.Open(st.dir, st.opts)
				if err != nil {
					t.Errorf("reopening %s after the test: %v", st.dir, err)
					return
				}
				defer q.Close()
				if err := q.Verify(context.Background()); err != nil {
					t.Errorf("Verify of the reopened store after the test: %v", err)
				}
			})
			return open(t, st)
		},
		Reopen: func(t *testing.T, q *work.Queue) *work.Queue {
			mu.Lock()
			st, ok := stores[q]
			mu.Unlock()
			if !ok {
				t.Fatal("Reopen of a queue the harness did not open")
			}
			if err := q.Close(); err != nil {
				t.Fatalf("Close before reopening: %v", err)
			}
			return open(t, st)
		},
	}
	if base != nil {
		h.MaxValueBytes = base.MaxValueBytes
	}
	return h
}

// TestConformanceDurable runs the suite against stores on disk with the default options.
func TestConformanceDurable(t *testing.T) {
	worktest.Run(t, durableHarness(nil, false))
}

// TestConformanceDurableOptions runs the suite again with every option that changes
// behaviour set otherwise: another filesystem (in memory, which also keeps it quick), a small
// value limit and no fsync.
func TestConformanceDurableOptions(t *testing.T) {
	worktest.Run(t, durableHarness(&work.Options{MaxValueBytes: 4096, Sync: work.SyncNever, MaxBatchCommands: 3}, true))
}

// --- helpers ---

func openQueue(t *testing.T, dir string, opts *work.Options) *work.Queue {
	t.Helper()
	q, err := work.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

var durEpoch = time.Date(2032, time.February, 1, 9, 0, 0, 0, time.UTC)

func dat(sec int) time.Time { return durEpoch.Add(time.Duration(sec) * time.Second) }

func logLen(t *testing.T, q *work.Queue) int {
	t.Helper()
	n := 0
	if err := q.ReadLog(context.Background(), 0, func(events.Event) error { n++; return nil }); err != nil {
		t.Fatalf("ReadLog: %v", err)
	}
	return n
}

// kinds lists the kind sentinels err matches; a well-formed error matches exactly one.
func kinds(err error) []string {
	var out []string
	for name, k := range map[string]error{
		"ErrInvalidRequest": work.ErrInvalidRequest, "ErrTaskNotFound": work.ErrTaskNotFound,
		"ErrIdempotencyConflict": work.ErrIdempotencyConflict, "ErrStaleDelivery": work.ErrStaleDelivery,
		"ErrInvalidTransition": work.ErrInvalidTransition, "ErrBackend": work.ErrBackend,
	} {
		if errors.Is(err, k) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// wantKind checks that err matches kind and no other sentinel, and returns its detail.
func wantKind(t *testing.T, what string, err, kind error) *work.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded, want %v", what, kind)
	}
	if !errors.Is(err, kind) || len(kinds(err)) != 1 {
		t.Fatalf("%s = %v, matching %v; want exactly %v", what, err, kinds(err), kind)
	}
	var we *work.Error
	if !errors.As(err, &we) {
		t.Fatalf("%s = %v: no *work.Error", what, err)
	}
	return we
}

func wantField(t *testing.T, what string, err error, field string) {
	t.Helper()
	if we := wantKind(t, what, err, work.ErrInvalidRequest); we.Field != field {
		t.Fatalf("%s: field %q, want %q (error %v)", what, we.Field, field, err)
	}
}

// wantOption fails t unless err is an *OptionError naming options.field and matching
// ErrInvalidOptions (and no kind of *work.Error).
func wantOption(t *testing.T, what string, err error, options, field string) {
	t.Helper()
	var oe *work.OptionError
	if !errors.As(err, &oe) || !errors.Is(err, work.ErrInvalidOptions) || oe.Options != options || oe.Field != field {
		t.Fatalf("%s: %v, want an OptionError naming %s.%s", what, err, options, field)
	}
	if errors.Is(err, work.ErrInvalidRequest) || errors.Is(err, work.ErrBackend) {
		t.Fatalf("%s: %v also matches a request kind", what, err)
	}
}

// --- Open and its options ---

func TestOpenOptionsValidation(t *testing.T) {
	for _, c := range []struct {
		opts  work.Options
		field string
	}{
		{work.Options{Sync: work.SyncMode(7)}, "Sync"},
		{work.Options{Sync: -1}, "Sync"},
		{work.Options{MaxValueBytes: -1}, "MaxValueBytes"},
		{work.Options{MaxValueBytes: 64<<20 + 1}, "MaxValueBytes"},
		{work.Options{CacheSize: -1}, "CacheSize"},
		{work.Options{MemTableSize: 1<<30 + 1}, "MemTableSize"},
		{work.Options{MemTableSize: 1000}, "MemTableSize"}, // below Pebble's minimum: it panicked in Open
		{work.Options{MaxBatchCommands: -1}, "MaxBatchCommands"},
	} {
		dir := filepath.Join(t.TempDir(), "store")
		q, err := work.Open(dir, &c.opts)
		if err == nil {
			q.Close()
		}
		wantOption(t, fmt.Sprintf("Open with %+v", c.opts), err, "work.Options", c.field)
		if !strings.Contains(err.Error(), "work.Options."+c.field) {
			t.Errorf("error %q does not name %s", err, c.field)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("Open with invalid options created %s", dir)
		}
	}
	for _, dir := range []string{"", "  ", "\t\n"} {
		_, err := work.Open(dir, nil)
		wantField(t, fmt.Sprintf("Open(%q)", dir), err, "dir")
	}
	// The edges are fine.
	for _, o := range []work.Options{{MaxValueBytes: 64 << 20}, {MaxValueBytes: 1}, {MemTableSize: 1 << 30}, {Sync: work.SyncNever}} {
		q, err := work.Open(t.TempDir(), &o)
		if err != nil {
			t.Errorf("Open with %+v: %v", o, err)
			continue
		}
		q.Close()
	}
}

func jsonString(n int) json.RawMessage { // a JSON string of exactly n bytes, n >= 2
	return json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`)
}

func TestOpenMaxValueBytes(t *testing.T) {
	ctx := context.Background()
	const limit = 64
	dir := t.TempDir()
	q := openQueue(t, dir, &work.Options{MaxValueBytes: limit})
	s := q.Session("sess")

	tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: jsonString(limit), Wake: work.WakeOnCompletion}, dat(0))
	if err != nil {
		t.Fatalf("submit of exactly %d bytes: %v", limit, err)
	}
	n := logLen(t, q)
	_, err = s.SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: jsonString(limit + 1)}, dat(1))
	wantField(t, "submit one byte over", err, "input")
	_, err = s.WakeAt(ctx, work.WakeRequest{Payload: jsonString(limit + 1)}, dat(1))
	wantField(t, "wake one byte over", err, "payload")
	if _, err := s.WakeAt(ctx, work.WakeRequest{Payload: jsonString(limit)}, dat(1)); err != nil {
		t.Fatalf("wake of exactly %d bytes: %v", limit, err)
	}
	n++
	ds, err := q.ClaimDueAt(ctx, dat(2), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	n++
	_, err = q.FinishAt(ctx, ds[0], work.Success(jsonString(limit+1)), dat(3))
	wantField(t, "finish with an output one byte over", err, "output")
	if got := logLen(t, q); got != n {
		t.Fatalf("refused requests appended %d events", got-n)
	}
	if got, _, _ := s.Task(ctx, tk.ID); got.State != work.TaskRunning {
		t.Fatalf("task is %s after a refused finish", got.State)
	}
	if _, err := q.FinishAt(ctx, ds[0], work.Success(jsonString(limit)), dat(3)); err != nil {
		t.Fatalf("finish with exactly %d bytes: %v", limit, err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}

	// The limit belongs to the open queue, not to the store: a larger one reads the same data
	// and takes larger values.
	q.Close()
	q = openQueue(t, dir, &work.Options{MaxValueBytes: 2 << 20})
	big := jsonString(3 << 19) // 1.5 MiB, over the default limit
	tk, err = q.Session("sess").SubmitAt(ctx, work.TaskRequest{Kind: "big", Input: big}, dat(4))
	if err != nil {
		t.Fatalf("submit of 1.5 MiB under a 2 MiB limit: %v", err)
	}
	q.Close()
	q = openQueue(t, dir, nil)
	got, ok, err := q.Session("sess").Task(ctx, tk.ID)
	if err != nil || !ok || string(got.Input) != string(big) {
		t.Fatalf("the 1.5 MiB input did not survive reopening: found %v, %v, %d bytes", ok, err, len(got.Input))
	}
	_, err = q.Session("sess").SubmitAt(ctx, work.TaskRequest{Kind: "big", Input: big}, dat(5))
	wantField(t, "1.5 MiB under the default limit", err, "input")
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusals(t *testing.T) {
	check := func(t *testing.T, what string, err, sentinel error, dir string) {
		t.Helper()
		wantKind(t, what, err, work.ErrBackend)
		if !errors.Is(err, sentinel) {
			t.Errorf("%s = %v, does not wrap %v", what, err, sentinel)
		}
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("%s = %q, does not name %s", what, err, dir)
		}
	}
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "a-file")
		if err := os.WriteFile(path, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := work.Open(path, nil)
		check(t, "Open on a file", err, pebblelog.ErrNotAStore, path)
	})
	t.Run("foreign directory", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "thesis.tex"), []byte(`\documentclass{article}`), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := work.Open(dir, nil)
		check(t, "Open on a foreign directory", err, pebblelog.ErrNotAStore, dir)
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Errorf("a refused Open left %d entries in the directory, want 1", len(entries))
		}
	})
	t.Run("newer format", func(t *testing.T) {
		dir := t.TempDir()
		q := openQueue(t, dir, nil)
		q.Close()
		if err := os.WriteFile(filepath.Join(dir, pebblelog.MarkerFile), []byte(fmt.Sprintf("worklog store format %d\n", pebblelog.FormatVersion+1)), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := work.Open(dir, nil)
		check(t, "Open of a newer store", err, pebblelog.ErrFormatTooNew, dir)
	})
	t.Run("locked", func(t *testing.T) {
		dir := t.TempDir()
		q := openQueue(t, dir, nil)
		if _, err := q.Session("s").SubmitAt(context.Background(), work.TaskRequest{Kind: "k"}, dat(0)); err != nil {
			t.Fatal(err)
		}
		_, err := work.Open(dir, nil)
		check(t, "second Open of a live store", err, pebblelog.ErrLocked, dir)
		if !strings.Contains(err.Error(), "checkpoint") {
			t.Errorf("lock error %q does not point to Checkpoint", err)
		}
		// The holder is unharmed and, once closed, the store opens again.
		if err := q.Verify(context.Background()); err != nil {
			t.Fatal(err)
		}
		q.Close()
		q = openQueue(t, dir, nil)
		if n := logLen(t, q); n != 1 {
			t.Fatalf("store holds %d events, want 1", n)
		}
	})
}

func TestClosedDurableQueue(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	q := openQueue(t, dir, nil)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for name, err := range map[string]error{
		"Verify":     q.Verify(ctx),
		"ReadLog":    q.ReadLog(ctx, 0, func(events.Event) error { return nil }),
		"Checkpoint": q.Checkpoint(filepath.Join(t.TempDir(), "cp")),
	} {
		wantKind(t, name+" after Close", err, work.ErrBackend)
		if !errors.Is(err, work.ErrClosed) {
			t.Errorf("%s after Close = %v, does not wrap ErrClosed", name, err)
		}
	}
	// Closing released the store.
	openQueue(t, dir, nil)
}

// --- Checkpoint ---

func TestCheckpointWhileWriting(t *testing.T) {
	ctx := context.Background()
	q := openQueue(t, t.TempDir(), nil)
	type acked struct{ session, id string }
	var (
		mu    sync.Mutex
		done  []acked
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	stop := make(chan struct{})
	progress := make(chan struct{}, 4096)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			session := fmt.Sprintf("writer-%d", w)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tk, err := q.Session(session).SubmitAt(ctx, work.TaskRequest{
					Kind: "cp", IdempotencyKey: fmt.Sprintf("k%d", i), Wake: work.WakeOnCompletion,
				}, dat(i))
				if err == nil && i%2 == 1 {
					var ds []work.TaskDelivery
					if ds, err = q.ClaimDueAt(ctx, dat(i), time.Hour, 1); err == nil && len(ds) == 1 {
						_, err = q.FinishAt(ctx, ds[0], work.Failure("nope"), dat(i))
					}
				}
				if err != nil {
					errMu.Lock()
					first = errors.Join(first, err)
					errMu.Unlock()
					return
				}
				mu.Lock()
				done = append(done, acked{session, tk.ID})
				mu.Unlock()
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	for range 60 {
		<-progress
	}
	mu.Lock()
	before := slices.Clone(done)
	mu.Unlock()
	cp := filepath.Join(t.TempDir(), "nested", "checkpoint")
	cpErr := q.Checkpoint(cp)
	for range 30 {
		<-progress
	}
	close(stop)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
	if cpErr != nil {
		t.Fatalf("Checkpoint: %v", cpErr)
	}
	wantKind(t, "Checkpoint into an existing directory", q.Checkpoint(cp), work.ErrBackend)

	c := openQueue(t, cp, nil)
	if err := c.Verify(ctx); err != nil {
		t.Fatalf("Verify of the checkpoint: %v", err)
	}
	for _, a := range before {
		if _, ok, err := c.Session(a.session).Task(ctx, a.id); err != nil || !ok {
			t.Fatalf("task %s, acknowledged before Checkpoint was called, is not in the checkpoint: %v, %v", a.id, ok, err)
		}
	}
	nc, nq := logLen(t, c), logLen(t, q)
	if nc > nq {
		t.Fatalf("the checkpoint has %d events, the live store only %d", nc, nq)
	}
	t.Logf("checkpoint: %d events of %d; %d tasks acknowledged before it", nc, nq, len(before))
	// The checkpoint is independent: writing to it leaves the live store alone.
	if _, err := c.Session("other").SubmitAt(ctx, work.TaskRequest{Kind: "after"}, dat(0)); err != nil {
		t.Fatal(err)
	}
	if logLen(t, q) != nq {
		t.Fatal("writing to the checkpoint changed the live store")
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointNeedsDurableQueue(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	dir := filepath.Join(t.TempDir(), "cp")
	wantKind(t, "Checkpoint of an in-memory queue", q.Checkpoint(dir), work.ErrBackend)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Checkpoint of an in-memory queue created %s", dir)
	}
}

// --- SyncNever ---

// syncNeverLoad runs a little of everything and returns the task ids, all settled.
func syncNeverLoad(t *testing.T, q *work.Queue, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		tk, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{
			Kind: "nosync", Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)),
			IdempotencyKey: fmt.Sprintf("k%d", i), Wake: work.WakeOnCompletion,
		}, dat(i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tk.ID)
		ds, err := q.ClaimDueAt(ctx, dat(i), time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %v, %v", ds, err)
		}
		if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), dat(i)); err != nil {
			t.Fatal(err)
		}
		ws, err := q.ClaimWakesAt(ctx, dat(i), time.Minute, 1)
		if err != nil || len(ws) != 1 {
			t.Fatalf("claim wakes: %v, %v", ws, err)
		}
		if err := q.AckWakeAt(ctx, ws[0], dat(i)); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func checkSettled(t *testing.T, q *work.Queue, ids []string) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		tk, ok, err := q.Session("s").Task(ctx, id)
		if err != nil || !ok || tk.State != work.TaskSucceeded {
			t.Fatalf("task %s: %v found %v, %v; want succeeded", id, tk.State, ok, err)
		}
	}
	if ws, err := q.ClaimWakesAt(ctx, dat(1e6), time.Minute, 10); err != nil || len(ws) != 0 {
		t.Fatalf("%d wakes claimable after every one was acknowledged (%v)", len(ws), err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSyncNever(t *testing.T) {
	t.Run("disk", func(t *testing.T) {
		dir := t.TempDir()
		q := openQueue(t, dir, &work.Options{Sync: work.SyncNever})
		ids := syncNeverLoad(t, q, 50)
		checkSettled(t, q, ids)
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		checkSettled(t, openQueue(t, dir, nil), ids)
	})
	t.Run("machine crash", func(t *testing.T) {
		fs := vfs.NewCrashableMem()
		q := openQueue(t, "/nosync", &work.Options{FS: fs, Sync: work.SyncNever})
		ids := syncNeverLoad(t, q, 50)
		live := logLen(t, q)

		// A crash before Close may lose acknowledged calls, whole, and leaves a consistent store.
		early := openQueue(t, "/nosync", &work.Options{FS: fs.CrashClone(vfs.CrashCloneCfg{})})
		if err := early.Verify(context.Background()); err != nil {
			t.Fatalf("Verify after a crash without Close: %v", err)
		}
		t.Logf("a crash before Close kept %d of %d events", logLen(t, early), live)

		// Close syncs: a crash after it loses nothing.
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		after := openQueue(t, "/nosync", &work.Options{FS: fs.CrashClone(vfs.CrashCloneCfg{})})
		if n := logLen(t, after); n != live {
			t.Fatalf("a crash after Close kept %d of %d events", n, live)
		}
		checkSettled(t, after, ids)
	})
}

// The same load with SyncAlways survives the same crash without Close.
func TestSyncAlwaysMachineCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	q := openQueue(t, "/always", &work.Options{FS: fs})
	ids := syncNeverLoad(t, q, 50)
	live := logLen(t, q)
	c := openQueue(t, "/always", &work.Options{FS: fs.CrashClone(vfs.CrashCloneCfg{})})
	if n := logLen(t, c); n != live {
		t.Fatalf("a crash kept %d of %d acknowledged events", n, live)
	}
	checkSettled(t, c, ids)
}
