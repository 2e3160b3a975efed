package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// failoverLoad is what the submitters and workers of TestFailover had acknowledged: what the
// queue must still hold after the failover.
type failoverLoad struct {
	mu       sync.Mutex
	acked    map[string]string      // idempotency key → task id, for every submit that returned nil
	ackedAt  map[string]time.Time   // idempotency key → when the submit that returned nil began
	settled  map[string][]settleAck // task id → the Finish calls that returned nil
	errs     int                    // calls that failed (retried)
	lastOK   time.Time
	firstErr error
}

// settleAck is one acknowledged Finish: the delivery it settled, and when the call began.
type settleAck struct {
	attempt uint32
	token   string
	began   time.Time
}

func (l *failoverLoad) ok(f func()) {
	l.mu.Lock()
	f()
	l.lastOK = time.Now()
	l.mu.Unlock()
}

func (l *failoverLoad) fail(err error) {
	l.mu.Lock()
	l.errs++
	if l.firstErr == nil {
		l.firstErr = err
	}
	l.mu.Unlock()
}

func (l *failoverLoad) counts() (acked, settled int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked), len(l.settled)
}

// TestFailover (issue 24 §4): a queue on a primary with a streaming standby, under load
// (submitters and workers), the primary killed with SIGKILL and the standby promoted; the
// queue, given the pair's multi-host DSN with target_session_attrs=read-write, resumes by
// itself. With a synchronous standby every acknowledged submit and settle is present,
// nothing is settled twice and Verify is clean. With an asynchronous one the test reports
// what was lost (design §9 says what can be) and still requires a consistent queue: no task
// settled twice, Verify clean.
func TestFailover(t *testing.T) {
	pgtest.Need(t) // skips, saying why, without the server binaries
	for _, synchronous := range []bool{true, false} {
		name := "sync"
		if !synchronous {
			name = "async"
		}
		t.Run(name, func(t *testing.T) { testFailover(t, synchronous) })
	}
}

func testFailover(t *testing.T, synchronous bool) {
	pair, err := pgtest.StartPair(synchronous)
	if err != nil {
		t.Fatal(err)
	}
	defer pair.Stop()
	if err := pair.Primary.Exec("CREATE SCHEMA failover"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, err := Open(ctx, pair.DSN("failover"), &Options{WriteTimeout: 5 * time.Second, CommitResolveTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()

	load := &failoverLoad{acked: map[string]string{}, ackedAt: map[string]time.Time{}, settled: map[string][]settleAck{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const submitters, workers = 3, 2
	for g := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := q.Session(fmt.Sprintf("failover-%d", g))
			for i := 0; ; i++ {
				key := fmt.Sprintf("k-%d-%d", g, i)
				for { // the same key until acknowledged: a retried submit is idempotent
					select {
					case <-stop:
						return
					default:
					}
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					began := time.Now()
					task, err := s.Submit(cctx, work.TaskRequest{Kind: "fo", Input: json.RawMessage(`{"i":1}`), IdempotencyKey: key})
					cancel()
					if err == nil {
						load.ok(func() { load.acked[key], load.ackedAt[key] = task.ID, began })
						break
					}
					load.fail(err)
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	workerLoop := func(done <-chan struct{}) {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ds, err := q.ClaimDue(cctx, 2*time.Second, 8)
			cancel()
			if err != nil {
				load.fail(err)
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if len(ds) == 0 {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			for _, d := range ds {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				began := time.Now()
				_, err := q.Finish(cctx, d, work.Success(json.RawMessage(`"done"`)))
				cancel()
				switch {
				case err == nil:
					a := settleAck{attempt: d.Attempt, token: d.LeaseToken(), began: began}
					load.ok(func() { load.settled[d.Task.ID] = append(load.settled[d.Task.ID], a) })
				case errors.Is(err, work.ErrStaleDelivery):
					// Another worker holds it now (a lease expired during the failover).
				default:
					load.fail(err)
				}
			}
		}
	}
	workersDone := make(chan struct{})
	for range workers {
		wg.Add(1)
		go workerLoop(workersDone)
	}

	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				a, s := load.counts()
				t.Fatalf("%s: not within %v (acked %d, settled %d, errors %d, first %v)", what, d, a, s, load.errs, load.firstErr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("load before the failover", 60*time.Second, func() bool { a, s := load.counts(); return a >= 100 && s >= 50 })

	ackedBefore, _ := load.counts()
	killed := time.Now()
	if err := pair.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	// Every server process of the old primary is dead or has SIGKILL pending (it runs no more
	// code of its own): nothing a call begun from now on does can commit there.
	dead := time.Now()
	if err := pair.Promote(); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(killed)
	waitFor("the queue resumes on the promoted standby", 60*time.Second, func() bool {
		a, _ := load.counts()
		return a >= ackedBefore+100
	})
	load.mu.Lock()
	resumed := load.lastOK.Sub(killed)
	load.mu.Unlock()
	close(stop) // submitters end; workers go on until every acknowledged task is settled

	// A state, not a speed (the resume time is measured above): under the load of a whole
	// race-built test run the settling after a promotion took over a minute once.
	//
	// With an asynchronous standby an acknowledged submit may be lost by the failover (the
	// report below lists it): such a task is never settled, so the wait asks the promoted
	// server about a task still unsettled and passes over one it does not hold. Without that,
	// the wait could only time out (seen under load: 3 of 203 acknowledged submits lost).
	lostByFailover := map[string]bool{}
	waitFor("workers settle every acknowledged task", 3*time.Minute, func() bool {
		load.mu.Lock()
		unsettled := map[string]string{}
		for key, id := range load.acked {
			if len(load.settled[id]) == 0 && !lostByFailover[id] {
				unsettled[key] = id
			}
		}
		load.mu.Unlock()
		if synchronous || len(unsettled) == 0 {
			return len(unsettled) == 0
		}
		for key, id := range unsettled {
			_, ok, err := q.Session("failover-"+key[2:3]).Task(ctx, id)
			if err != nil || ok {
				return false
			}
			lostByFailover[id] = true
		}
		return true
	})
	close(workersDone)
	wg.Wait()
	t.Logf("%s standby: promoted %v after the kill; the queue acknowledged again within %v; %d submits and %d settles acknowledged, %d calls failed and were retried (first: %v)",
		map[bool]string{true: "synchronous", false: "asynchronous"}[synchronous], promoted.Round(time.Millisecond),
		resumed.Round(time.Millisecond), len(load.acked), len(load.settled), load.errs, load.firstErr)

	// What the promoted server holds. An acknowledged operation it lacks is lost by the
	// failover: an error with a synchronous standby, reported with an asynchronous one. A
	// settle is lost when the log's settle of its task is another delivery's (or there is
	// none): the task, its settle gone, was claimed again after its lease and settled again
	// (seen under load: "Finish acknowledged 2 times", one settle in the log). Either way, an
	// operation whose call began after the old primary was dead cannot have been lost with it.
	settledEvents := map[string][]*events.TaskSettled{}
	err = q.ReadLog(ctx, 0, func(e events.Event) error {
		if st, ok := e.(*events.TaskSettled); ok {
			settledEvents[st.TaskID] = append(settledEvents[st.TaskID], st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, evs := range settledEvents {
		if len(evs) > 1 {
			t.Errorf("task %s settled %d times in the log", id, len(evs))
		}
	}
	var lost []string
	lose := func(what string, began time.Time) {
		lost = append(lost, what)
		if began.After(dead) {
			t.Errorf("%s: lost, yet its call began %v after the old primary was killed", what, began.Sub(dead).Round(time.Millisecond))
		}
	}
	for key, id := range load.acked {
		_, ok, err := q.Session("failover-"+key[2:3]).Task(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			lose("submit "+key+" ("+id+")", load.ackedAt[key])
		}
	}
	for id, acks := range load.settled {
		inLog := "none"
		if evs := settledEvents[id]; len(evs) > 0 {
			inLog = fmt.Sprintf("attempt %d", evs[0].Attempt)
		}
		tokens := map[string]bool{}
		for _, a := range acks {
			if tokens[a.token] {
				t.Errorf("task %s: Finish of attempt %d acknowledged twice", id, a.attempt)
			}
			tokens[a.token] = true
			if evs := settledEvents[id]; len(evs) == 0 || evs[0].LeaseToken != a.token {
				lose(fmt.Sprintf("settle of %s attempt %d (the log's settle: %s)", id, a.attempt, inLog), a.began)
			}
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Errorf("Verify after the failover: %v", err)
	}
	sort.Strings(lost)
	if synchronous && len(lost) > 0 {
		t.Errorf("synchronous standby: %d acknowledged operations lost: %v", len(lost), lost)
	}
	if !synchronous {
		t.Logf("asynchronous standby: %d acknowledged operations lost by the failover: %v", len(lost), lost)
	}
}
