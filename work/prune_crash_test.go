package work_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/work"
)

// TestPruneCrashClone crashes a durable queue in the middle of a large prune that runs beside
// a submit load (Pebble's crashable filesystem, dropping a random part of what was not
// synced: a machine crash). Each clone must open, pass Verify (a half-pruned subject, a
// record without its events or events without their record, a task without its completion
// wake, or a gap without its pruned range would each be a problem), keep every
// acknowledged submit, and read every unprunable task exactly as before the prune.
func TestPruneCrashClone(t *testing.T) {
	const dir = "/data/store"
	seed := crashSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	defer work.SetPruneGroup(16)() // many groups: the crash lands between two of them
	fs := vfs.NewCrashableMem()
	q, err := work.Open(dir, &work.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	base := crashEpoch
	clock := base
	tick := func() time.Time { clock = clock.Add(time.Millisecond); return clock }

	// Live work that no prune may touch: pending, running, finished with an unacknowledged
	// completion wake. Their snapshots are compared after every crash.
	var live []ref
	for i := range 30 {
		s := q.Session(crashSessions[i%3])
		tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "live", RunAt: base.Add(1000 * time.Hour), IdempotencyKey: fmt.Sprint("live-", i)}, tick())
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, ref{s.ID(), tk.ID})
	}
	for i := range 10 {
		s := q.Session(crashSessions[i%3])
		tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "held", Wake: work.WakeOnCompletion}, tick())
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, ref{s.ID(), tk.ID})
	}
	ds, err := q.ClaimKindsAt(ctx, []string{"held"}, tick(), 10000*time.Hour, 10)
	if err != nil || len(ds) != 10 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	for _, d := range ds[:5] { // finished, their completion wakes never acknowledged
		if _, err := q.FinishAt(ctx, d, work.Success(nil), tick()); err != nil {
			t.Fatal(err)
		}
	}

	// history adds n prunable subjects, all finished or acknowledged by the clock's time.
	keyN := 0
	history := func(n int) {
		t.Helper()
		for range n {
			keyN++
			s := q.Session(crashSessions[keyN%3])
			r := work.TaskRequest{Kind: "old", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: fmt.Sprint("old-", keyN)}
			if keyN%4 == 0 {
				r.Wake = work.WakeOnCompletion
			}
			if _, err := s.SubmitAt(ctx, r, tick()); err != nil {
				t.Fatal(err)
			}
			if keyN%5 == 0 {
				if _, err := s.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`1`), IdempotencyKey: fmt.Sprint("w-", keyN)}, tick()); err != nil {
					t.Fatal(err)
				}
			}
		}
		for {
			ds, err := q.ClaimKindsAt(ctx, []string{"old"}, tick(), time.Hour, 500)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				if _, err := q.FinishAt(ctx, d, work.Success(json.RawMessage(`{"ok":true}`)), tick()); err != nil {
					t.Fatal(err)
				}
			}
		}
		for {
			wds, err := q.ClaimWakesAt(ctx, tick(), time.Hour, 500)
			if err != nil {
				t.Fatal(err)
			}
			var n int
			for _, wd := range wds {
				if wd.Wake.Reason.Kind == work.WakeTaskFinished && wd.Wake.Reason.Outcome != nil && wd.Wake.Reason.TaskID != "" {
					if isLive(live, wd.Wake.Reason.TaskID) {
						continue // the live tasks' completion wakes stay unacknowledged
					}
				}
				if err := q.AckWakeAt(ctx, wd, tick()); err != nil {
					t.Fatal(err)
				}
				n++
			}
			if n == 0 {
				break
			}
		}
	}

	snapshot := func(q *work.Queue) map[string]work.Task {
		out := map[string]work.Task{}
		for _, r := range live {
			tk, found, err := q.Session(r.session).Task(ctx, r.id)
			if err != nil || !found {
				t.Fatalf("live task %s: found %v, %v", r.id, found, err)
			}
			out[r.id] = tk
		}
		return out
	}
	rounds := 3
	if raceBuild() {
		rounds = 2
	}
	for round := range rounds {
		history(600)
		horizon := tick()
		want := snapshot(q)

		var mu sync.Mutex
		var acked []ref
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // a submit load beside the prune
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s := q.Session(crashSessions[i%3])
				tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "new", RunAt: base.Add(2000 * time.Hour)}, horizon.Add(time.Duration(i+1)*time.Microsecond))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked = append(acked, ref{s.ID(), tk.ID})
				mu.Unlock()
			}
		}()
		var res work.PruneResult
		var pruneErr error
		go func() {
			defer wg.Done()
			res, pruneErr = q.Prune(ctx, horizon)
		}()
		// The crash: after a random part of the load, while the prune goes on.
		k := 1 + rng.IntN(60)
		var ackedNow []ref
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Microsecond) {
			mu.Lock()
			n := len(acked)
			if n >= k || time.Now().After(deadline) {
				ackedNow = append([]ref(nil), acked...)
			}
			mu.Unlock()
			if ackedNow != nil {
				break
			}
		}
		clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(rng.Uint64(), 1))})
		close(stop)
		wg.Wait()
		if pruneErr != nil {
			t.Fatal(pruneErr)
		}

		cq, err := work.Open(dir, &work.Options{FS: clone})
		if err != nil {
			t.Fatalf("round %d: opening the clone: %v", round, err)
		}
		if err := cq.Verify(ctx); err != nil {
			t.Fatalf("round %d: Verify of the clone: %v", round, err)
		}
		got := snapshot(cq)
		for id, w := range want {
			if !reflect.DeepEqual(got[id], w) {
				t.Errorf("round %d: live task %s changed:\n%+v\nwant\n%+v", round, id, got[id], w)
			}
		}
		for _, r := range ackedNow {
			if _, found, err := cq.Session(r.session).Task(ctx, r.id); err != nil || !found {
				t.Errorf("round %d: acknowledged submit %s lost in the crash (%v)", round, r.id, err)
			}
		}
		left, err := cq.Prune(ctx, horizon) // what the crash kept unpruned, prunable as before
		if err != nil {
			t.Fatal(err)
		}
		if err := cq.Verify(ctx); err != nil {
			t.Fatalf("round %d: Verify of the clone after finishing the prune: %v", round, err)
		}
		if err := cq.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: the live prune removed %d tasks, %d wakes, %d events; the clone kept %d tasks to prune again; %d submits acknowledged before the crash",
			round, res.Tasks, res.Wakes, res.Events, left.Tasks, len(ackedNow))
		if err := q.Verify(ctx); err != nil {
			t.Fatalf("round %d: Verify of the live queue: %v", round, err)
		}
	}
}

// ref names a task for the prune crash test.
type ref struct{ session, id string }

func isLive(live []ref, id string) bool {
	for _, r := range live {
		if r.id == id {
			return true
		}
	}
	return false
}
