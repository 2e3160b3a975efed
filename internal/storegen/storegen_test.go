package storegen_test

import (
	"context"
	"os"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/storegen"
	"github.com/worklog/worklog/work"
)

// TestBuild builds a small store and checks its shape: the events a task's life appends,
// a mix of states, and a store that verifies.
func TestBuild(t *testing.T) {
	ctx := context.Background()
	q, err := work.Open(t.TempDir(), &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const n = 2000
	res, err := storegen.Build(ctx, q, n, storegen.Options{Round: 300})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tasks != n {
		t.Fatalf("Tasks = %d, want %d", res.Tasks, n)
	}
	types := map[events.Type]int{}
	var events_ int
	if err := q.ReadLog(ctx, 0, func(ev events.Event) error {
		types[ev.Type()]++
		events_++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if events_ < 3*n || events_ > 4*n {
		t.Errorf("%d events for %d tasks, want about 3.1 a task (%v)", events_, n, types)
	}
	st, err := q.StatsAt(ctx, res.LastTime)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events: %v; stats %+v", events_, types, st.Total)
	// Every state a past seq can show: about one in twenty pending and running, one in ten
	// failed (which tasks are left depends on the claim order).
	if c := st.Total; c.Pending != n/20 || c.Running < n/25 || c.Failed < n/12 || c.Succeeded < n*3/4 {
		t.Errorf("states %+v, want %d pending, about %d running and %d failed, the rest succeeded", c, n/20, n/20, n/10)
	}
	if w, settled := types[events.TypeWakeRecorded], types[events.TypeTaskSettled]; w < settled/5 || w > settled/3 {
		t.Errorf("%d wakes recorded, want one for each settled task in four", types[events.TypeWakeRecorded])
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDir builds the store of $WORKLOG_BENCH_TASKS tasks into $WORKLOG_STORE_CACHE ahead of
// the benchmarks (it takes minutes for 300k tasks):
//
//	WORKLOG_STORE_CACHE=/var/tmp/worklog-stores WORKLOG_BENCH_TASKS=300000 go test ./internal/storegen -run TestDir -v -timeout 1h
func TestDir(t *testing.T) {
	if os.Getenv("WORKLOG_STORE_CACHE") == "" || os.Getenv("WORKLOG_BENCH_TASKS") == "" {
		t.Skip("set WORKLOG_STORE_CACHE and WORKLOG_BENCH_TASKS to build a benchmark store")
	}
	t.Log(storegen.Dir(t, storegen.TasksFromEnv(t, 0)))
}
