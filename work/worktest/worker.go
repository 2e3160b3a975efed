package worktest

import (
	"fmt"
	"strings"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// workerScenarios check the worker identity every claim records (part 3: WithWorker).
func workerScenarios() []scenario {
	return []scenario{
		{"worker/every_claim_records_its_worker", workerRecorded},
		{"worker/default_is_host_and_process", workerDefault},
		{"worker/out_of_range_is_invalid_and_claims_nothing", workerInvalid},
	}
}

// claimWorker returns the worker of a claim event, failing on any other event.
func (e *env) claimWorker(ev events.Event) string {
	e.t.Helper()
	switch c := ev.(type) {
	case *events.TaskClaimed:
		return c.Worker
	case *events.WakeClaimed:
		return c.Worker
	}
	e.t.Fatalf("event %s is not a claim", ev.Type())
	return ""
}

func workerRecorded(e *env) {
	const s = "session_worker"
	base := e.ctx
	defer func() { e.ctx = base }()
	for i := 0; i < 4; i++ {
		e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
	}
	e.wake(s, work.WakeRequest{}, at(100))

	check := func(what, worker string, n int, gotWorker string) {
		e.t.Helper()
		if gotWorker != worker {
			e.t.Errorf("%s: delivery says worker %q, want %q", what, gotWorker, worker)
		}
		evs := e.since(n)
		if len(evs) == 0 {
			e.t.Fatalf("%s appended nothing", what)
		}
		for _, ev := range evs {
			if ev.Type() != events.TypeTaskClaimed && ev.Type() != events.TypeWakeClaimed {
				continue
			}
			if got := e.claimWorker(ev); got != worker {
				e.t.Errorf("%s: %s records worker %q, want %q", what, ev.Type(), got, worker)
			}
		}
	}

	e.ctx = work.WithWorker(base, "worker-a")
	n := e.logLen()
	d := e.claimOne(at(101))
	check("ClaimDueAt", "worker-a", n, d.Worker)

	long := strings.Repeat("w", events.MaxWorker) // the longest accepted, not ASCII-only below
	e.ctx = work.WithWorker(base, long)
	n = e.logLen()
	ks := e.claimKinds([]string{"k"}, at(102), lease, 1)
	if len(ks) != 1 {
		e.t.Fatalf("ClaimKindsAt claimed %d, want 1", len(ks))
	}
	check("ClaimKindsAt", long, n, ks[0].Worker)

	e.ctx = work.WithWorker(base, "wörker b")
	n = e.logLen()
	_, ds, err := e.q.SettleAndClaimAt(e.ctx, []work.Settle{{Delivery: d, Outcome: &work.Outcome{State: work.TaskSucceeded}}}, nil, at(103), lease, 1)
	e.ok("SettleAndClaimAt", err)
	if len(ds) != 1 {
		e.t.Fatalf("SettleAndClaimAt claimed %d, want 1", len(ds))
	}
	check("SettleAndClaimAt", "wörker b", n, ds[0].Worker)

	e.ctx = work.WithWorker(base, "waker")
	n = e.logLen()
	ws := e.claimWakes(at(104), lease, 10)
	if len(ws) == 0 {
		e.t.Fatal("ClaimWakesAt claimed nothing")
	}
	for _, w := range ws {
		check("ClaimWakesAt", "waker", n, w.Worker)
	}
}

func workerDefault(e *env) {
	const s = "session_worker_default"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	n := e.logLen()
	d := e.claimOne(at(101))
	want := work.DefaultWorker()
	if want == "" || !strings.Contains(want, ":") || len(want) > events.MaxWorker {
		e.t.Errorf("DefaultWorker() = %q, want <host>:<pid> within %d bytes", want, events.MaxWorker)
	}
	if d.Worker != want {
		e.t.Errorf("delivery worker %q, want the default %q", d.Worker, want)
	}
	evs := e.appended("a claim", n, events.TypeTaskClaimed)
	if got := e.claimWorker(evs[0]); got != want {
		e.t.Errorf("claim event records worker %q, want the default %q", got, want)
	}
}

func workerInvalid(e *env) {
	const s = "session_worker_invalid"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	e.wake(s, work.WakeRequest{}, at(100))
	for _, bad := range []string{"", strings.Repeat("w", events.MaxWorker+1)} {
		ctx := work.WithWorker(e.ctx, bad)
		n := e.logLen()
		_, err := e.q.ClaimDueAt(ctx, at(101), lease, 1)
		e.wantInvalid(fmt.Sprintf("ClaimDueAt with a worker of %d bytes", len(bad)), err, "worker")
		_, err = e.q.ClaimKindsAt(ctx, []string{"k"}, at(101), lease, 1)
		e.wantInvalid("ClaimKindsAt with a bad worker", err, "worker")
		_, err = e.q.ClaimWakesAt(ctx, at(101), lease, 1)
		e.wantInvalid("ClaimWakesAt with a bad worker", err, "worker")
		_, _, err = e.q.SettleAndClaimAt(ctx, nil, nil, at(101), lease, 1)
		e.wantInvalid("SettleAndClaimAt with a bad worker", err, "worker")
		e.nothingAppended("claims with a bad worker", n)
	}
}
