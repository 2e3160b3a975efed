package work_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// The crash tests run a concurrent load against a durable queue, note every operation the
// queue acknowledged, crash the store at a random moment, reopen it and check that every
// acknowledged operation survived whole, that nothing is half-applied, and that Verify passes.
//
// TestCrashKill crashes a real process with SIGKILL: the test binary runs itself again as a
// child (TestCrashHelperProcess) that prints one line per acknowledged operation, right after
// the call returned. TestCrashKillSyncNever does the same without fsync, where only
// consistency is promised. The TestCrashClone tests crash Pebble's crashable in-memory
// filesystem instead, which also drops every write that was not synced (a machine crash).
//
// Time is explicit. Round r runs at crashBase(r), a day after round r-1, with a logical clock
// that moves a millisecond per call; leases last an hour. So no lease expires within a round,
// and every lease of round r has expired when round r+1 begins: what a killed child held is
// redelivered to the next one, deterministically.

var crashEpoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

func crashBase(round int) time.Time { return crashEpoch.Add(time.Duration(round) * 24 * time.Hour) }

// checkTime is when the checker acts in round r: after the round's load, before the next.
func checkTime(round int) time.Time { return crashBase(round).Add(12 * time.Hour) }

const crashLease = time.Hour

var crashSessions = []string{"alpha", "beta", "gamma"}

// A task's request is a function of its idempotency key, so the checker can repeat it:
// "r<round>.g<goroutine>.<n>.<w|n><i|d>": w wakes on completion, d is scheduled two days on.
//
// With crashLargeEnv=true (scripts/soak.sh) one task in eight has a 300 KiB input, stored in a
// blob file (pebblelog.BlobMin): the parent and the child build the same request from the key.
func crashTaskRequest(key string) work.TaskRequest {
	r := work.TaskRequest{Kind: "crash.job", Input: json.RawMessage(`{"key":"` + key + `","n":[1,2,3]}`), IdempotencyKey: key}
	if crashLarge && crc32.ChecksumIEEE([]byte(key))%8 == 0 {
		r.Input = json.RawMessage(`{"key":"` + key + `","pad":"` + strings.Repeat(key+"/", 300<<10/(len(key)+1)) + `"}`)
	}
	flags := key[strings.LastIndexByte(key, '.')+1:]
	if flags[0] == 'w' {
		r.Wake = work.WakeOnCompletion
	}
	if flags[1] == 'd' {
		round, _ := strconv.Atoi(key[1:strings.IndexByte(key, '.')])
		r.RunAt = crashBase(round + 2)
	}
	return r
}

func crashWakeRequest(key string) work.WakeRequest {
	return work.WakeRequest{Payload: json.RawMessage(`{"wake":"` + key + `"}`), IdempotencyKey: key}
}

// --- the load ---

type taskRef struct{ session, id string }

// load is the shared state of runLoad's goroutines.
type load struct {
	base  time.Time
	tick  atomic.Int64
	stop  chan struct{}
	gate  *sync.RWMutex
	once  sync.Once
	err   error
	errMu sync.Mutex

	taskKick, wakeKick, cancelKick, wakerKick chan struct{}

	mu     sync.Mutex
	recent []taskRef // recently submitted tasks, for the canceller
}

func (l *load) now() time.Time { return l.base.Add(time.Duration(l.tick.Add(1)) * time.Millisecond) }

// step runs one call and its report, under the gate; an error stops the load.
func (l *load) step(f func() error) bool {
	if l.gate != nil {
		l.gate.RLock()
		defer l.gate.RUnlock()
	}
	if err := f(); err != nil {
		l.fail(err)
		return false
	}
	return true
}

func (l *load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

func (l *load) fail(err error) {
	l.errMu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.errMu.Unlock()
	l.once.Do(func() { close(l.stop) })
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// wait blocks until c is kicked or the load stops; it reports whether to go on.
func (l *load) wait(c chan struct{}) bool {
	select {
	case <-c:
		return true
	case <-l.stop:
		return false
	}
}

func (l *load) remember(session, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.recent) >= 64 {
		l.recent = l.recent[1:]
	}
	l.recent = append(l.recent, taskRef{session, id})
}

func (l *load) pick(rng *rand.Rand) (taskRef, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.recent) == 0 {
		return taskRef{}, false
	}
	return l.recent[rng.IntN(len(l.recent))], true
}

func nanosOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// runLoad runs the workload until stop is closed (or forever) and returns the first
// unexpected error. Calls use a background context: a call in flight when the load stops
// completes normally. Each call and its report run under gate's read lock when gate is not
// nil, so a holder of its write lock pauses the load between calls.
//
// With p (the prune crash test; gate must not be nil), the load also prunes (pruneLoad).
func runLoad(q *work.Queue, round int, seed uint64, emit func(string), stop <-chan struct{}, gate *sync.RWMutex, p *pruneLoad) error {
	l := &load{
		base: crashBase(round), stop: make(chan struct{}), gate: gate,
		taskKick: make(chan struct{}, 1), wakeKick: make(chan struct{}, 1),
		cancelKick: make(chan struct{}, 1), wakerKick: make(chan struct{}, 1),
	}
	if stop != nil {
		go func() {
			select {
			case <-stop:
				l.once.Do(func() { close(l.stop) })
			case <-l.stop:
			}
		}()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	spawn := func(g int, fn func(rng *rand.Rand)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(rand.New(rand.NewPCG(seed, uint64(round)<<8|uint64(g))))
		}()
	}
	for g := range 2 { // submitters
		spawn(g, func(rng *rand.Rand) {
			for i := 0; !l.stopped(); i++ {
				flags := []byte("ni")
				if rng.IntN(2) == 0 {
					flags[0] = 'w'
				}
				if rng.IntN(10) == 0 {
					flags[1] = 'd'
				}
				key := fmt.Sprintf("r%d.g%d.%d.%s", round, g, i, flags)
				session := crashSessions[rng.IntN(len(crashSessions))]
				repeat := rng.IntN(5) == 0
				s := q.Session(session)
				ok := l.step(func() error {
					tk, err := s.SubmitAt(ctx, crashTaskRequest(key), l.now())
					if err != nil {
						return fmt.Errorf("submit %s: %w", key, err)
					}
					emit(fmt.Sprintf("submit %s %s %s", session, key, tk.ID))
					if repeat {
						again, err := s.SubmitAt(ctx, crashTaskRequest(key), l.now())
						if err != nil || again.ID != tk.ID {
							return fmt.Errorf("repeated submit %s: %s, %v; want %s", key, again.ID, err, tk.ID)
						}
					}
					l.remember(session, tk.ID)
					return nil
				})
				if !ok {
					return
				}
				kick(l.taskKick)
				if i%4 == 0 {
					kick(l.cancelKick)
				}
				if i%3 == 0 {
					kick(l.wakerKick)
				}
			}
		})
	}
	for g := 2; g < 4; g++ { // task workers
		spawn(g, func(rng *rand.Rand) {
			for !l.stopped() {
				var ds []work.TaskDelivery
				if !l.step(func() (err error) {
					if ds, err = q.ClaimDueAt(ctx, l.now(), crashLease, 3); err != nil {
						return fmt.Errorf("claim: %w", err)
					}
					return nil
				}) {
					return
				}
				if len(ds) == 0 {
					l.wait(l.taskKick)
					continue
				}
				for _, d := range ds {
					r := rng.IntN(100)
					var o work.Outcome
					switch {
					case r < 10:
						continue // the worker dies: the lease is held until the next round
					case !d.Task.CancelRequestedAt.IsZero():
						o = work.Cancellation()
					case r < 65:
						o = work.SuccessWithSummary("done", json.RawMessage(fmt.Sprintf(`{"attempt":%d}`, d.Attempt)))
					default:
						o = work.Failure(fmt.Sprintf("attempt %d failed", d.Attempt))
					}
					if !l.step(func() error {
						tk, err := q.FinishAt(ctx, d, o, l.now())
						if err != nil {
							return fmt.Errorf("finish %s: %w", d.Task.ID, err)
						}
						emit(fmt.Sprintf("finish %s %s %s %d", tk.SessionID, tk.ID, tk.State, nanosOf(tk.FinishedAt)))
						return nil
					}) {
						return
					}
					kick(l.wakeKick)
				}
			}
		})
	}
	spawn(4, func(rng *rand.Rand) { // canceller
		for l.wait(l.cancelKick) {
			ref, ok := l.pick(rng)
			if !ok {
				continue
			}
			if !l.step(func() error {
				tk, err := q.Session(ref.session).CancelAt(ctx, ref.id, l.now())
				if p != nil && errors.Is(err, work.ErrTaskNotFound) {
					return nil // pruned since it was submitted: the checker knows whether it could be
				}
				if err != nil {
					return fmt.Errorf("cancel %s: %w", ref.id, err)
				}
				emit(fmt.Sprintf("cancel %s %s %s %d %d", ref.session, tk.ID, tk.State, nanosOf(tk.CancelRequestedAt), nanosOf(tk.FinishedAt)))
				return nil
			}) {
				return
			}
			kick(l.wakeKick)
		}
	})
	spawn(5, func(rng *rand.Rand) { // direct wakes
		for i := 0; l.wait(l.wakerKick); i++ {
			key := fmt.Sprintf("r%d.w.%d", round, i)
			session := crashSessions[rng.IntN(len(crashSessions))]
			if !l.step(func() error {
				w, err := q.Session(session).WakeAt(ctx, crashWakeRequest(key), l.now())
				if err != nil {
					return fmt.Errorf("wake %s: %w", key, err)
				}
				emit(fmt.Sprintf("wake %s %s %s", session, key, w.ID))
				return nil
			}) {
				return
			}
			kick(l.wakeKick)
		}
	})
	spawn(6, func(rng *rand.Rand) { // wake consumer
		for !l.stopped() {
			var ds []work.WakeDelivery
			if !l.step(func() (err error) {
				if ds, err = q.ClaimWakesAt(ctx, l.now(), crashLease, 4); err != nil {
					return fmt.Errorf("claim wakes: %w", err)
				}
				return nil
			}) {
				return
			}
			if len(ds) == 0 {
				l.wait(l.wakeKick)
				continue
			}
			for _, d := range ds {
				if rng.IntN(100) < 15 {
					continue // dropped: redelivered in the next round
				}
				if !l.step(func() error {
					now := l.now()
					if err := q.AckWakeAt(ctx, d, now); err != nil {
						return fmt.Errorf("ack %s: %w", d.Wake.ID, err)
					}
					task := "-" // the task of a completion wake
					if d.Wake.Reason.Kind == work.WakeTaskFinished {
						task = d.Wake.Reason.TaskID
					}
					emit(fmt.Sprintf("ack %s %d %s", d.Wake.ID, now.UnixNano(), task))
					return nil
				}) {
					return
				}
			}
		}
	})
	if p != nil {
		p.start(l, q, emit, spawn)
	}
	wg.Wait()
	return l.err
}

// --- what was acknowledged ---

type submitRec struct{ session, key, id string }
type finishRec struct {
	session, id string
	state       string
	finishedAt  int64 // Unix nanoseconds
}
type cancelRec struct {
	session, id string
	state       string
	requestedAt int64
	finishedAt  int64 // 0: not terminal (a running task only records the request)
}
type ackRec struct {
	id     string
	at     int64  // the acknowledgment's time, Unix nanoseconds
	taskID string // a completion wake's task; "" for a direct wake
}
type wakeRec struct{ session, key, id string }

// ledger holds the operations a load reported as acknowledged.
type ledger struct {
	mu       sync.Mutex
	lines    int
	submits  []submitRec
	finishes []finishRec
	cancels  []cancelRec
	wakes    []wakeRec
	acks     []string
	ackRecs  []ackRec
	// The prune crash test's: each Prune's before when it started and when it returned
	// (Unix nanoseconds).
	pruneStarts, pruneEnds []int64
}

// record parses one line of the load's report.
func (l *ledger) record(line string) error {
	f := strings.Fields(line)
	l.mu.Lock()
	defer l.mu.Unlock()
	bad := func() error { return fmt.Errorf("unexpected report line %q", line) }
	if len(f) == 0 {
		return bad()
	}
	switch {
	case f[0] == "submit" && len(f) == 4:
		l.submits = append(l.submits, submitRec{f[1], f[2], f[3]})
	case f[0] == "finish" && len(f) == 5:
		n, err := strconv.ParseInt(f[4], 10, 64)
		if err != nil {
			return bad()
		}
		l.finishes = append(l.finishes, finishRec{f[1], f[2], f[3], n})
	case f[0] == "cancel" && len(f) == 6:
		n, err := strconv.ParseInt(f[4], 10, 64)
		m, err2 := strconv.ParseInt(f[5], 10, 64)
		if err != nil || err2 != nil {
			return bad()
		}
		l.cancels = append(l.cancels, cancelRec{f[1], f[2], f[3], n, m})
	case f[0] == "wake" && len(f) == 4:
		l.wakes = append(l.wakes, wakeRec{f[1], f[2], f[3]})
	case f[0] == "ack" && len(f) == 4:
		n, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return bad()
		}
		r := ackRec{f[1], n, f[3]}
		if r.taskID == "-" {
			r.taskID = ""
		}
		l.acks = append(l.acks, f[1])
		l.ackRecs = append(l.ackRecs, r)
	case (f[0] == "prune-start" && len(f) == 2) || (f[0] == "pruned" && len(f) == 5):
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return bad()
		}
		if f[0] == "prune-start" {
			l.pruneStarts = append(l.pruneStarts, n)
		} else {
			l.pruneEnds = append(l.pruneEnds, n)
		}
		return nil // not an operation on a task or a wake
	case f[0] == "bg-pruned":
		return nil // the background pruner's report: its before was announced by prune-start
	default:
		return bad()
	}
	l.lines++
	return nil
}

func (l *ledger) snapshot() *ledger {
	l.mu.Lock()
	defer l.mu.Unlock()
	return &ledger{
		lines:    l.lines,
		submits:  append([]submitRec(nil), l.submits...),
		finishes: append([]finishRec(nil), l.finishes...),
		cancels:  append([]cancelRec(nil), l.cancels...),
		wakes:    append([]wakeRec(nil), l.wakes...),
		acks:     append([]string(nil), l.acks...),
		ackRecs:  append([]ackRec(nil), l.ackRecs...),

		pruneStarts: append([]int64(nil), l.pruneStarts...),
		pruneEnds:   append([]int64(nil), l.pruneEnds...),
	}
}

func (l *ledger) merge(o *ledger) {
	l.lines += o.lines
	l.submits = append(l.submits, o.submits...)
	l.finishes = append(l.finishes, o.finishes...)
	l.cancels = append(l.cancels, o.cancels...)
	l.wakes = append(l.wakes, o.wakes...)
	l.acks = append(l.acks, o.acks...)
	l.ackRecs = append(l.ackRecs, o.ackRecs...)
	l.pruneStarts = append(l.pruneStarts, o.pruneStarts...)
	l.pruneEnds = append(l.pruneEnds, o.pruneEnds...)
}

func (l *ledger) String() string {
	return fmt.Sprintf("%d submits, %d finishes, %d cancels, %d wakes, %d acks",
		len(l.submits), len(l.finishes), len(l.cancels), len(l.wakes), len(l.acks))
}

// --- checks ---

// problems collects failures and stops the test after too many.
type problems struct {
	t    *testing.T
	what string
	n    int
}

func (p *problems) add(format string, args ...any) {
	p.t.Helper()
	p.n++
	p.t.Errorf("%s: "+format, append([]any{p.what}, args...)...)
	if p.n >= 20 {
		p.t.Fatalf("%s: too many problems", p.what)
	}
}

// logFacts is what a scan of the whole log says.
type logFacts struct {
	n           int
	taskSession map[string]string
	taskWakes   map[string]bool // task id -> WakeOnCompletion
	completions map[string][]events.TaskState
	acked       map[string]bool
	encoded     [][]byte
}

func scanLog(t *testing.T, q *work.Queue, keepBytes bool) logFacts {
	t.Helper()
	f := logFacts{
		taskSession: map[string]string{}, taskWakes: map[string]bool{},
		completions: map[string][]events.TaskState{}, acked: map[string]bool{},
	}
	err := q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		f.n++
		if ev.Head().Seq != uint64(f.n) {
			return fmt.Errorf("event %d has seq %d", f.n, ev.Head().Seq)
		}
		switch e := ev.(type) {
		case *events.TaskSubmitted:
			f.taskSession[e.TaskID] = e.SessionID
			f.taskWakes[e.TaskID] = e.WakeOnCompletion
		case *events.WakeRecorded:
			if e.Reason == events.WakeTaskFinished {
				f.completions[e.TaskID] = append(f.completions[e.TaskID], e.Outcome.State)
			}
		case *events.WakeAcked:
			f.acked[e.WakeID] = true
		}
		if keepBytes {
			b, err := events.Encode(ev)
			if err != nil {
				return err
			}
			f.encoded = append(f.encoded, b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ReadLog: %v", err)
	}
	return f
}

// checkConsistent checks what must hold of any store, crashed or not: no transition is
// half-applied (a settled task that wakes on completion has exactly one completion wake, with
// its outcome's state; any other task has none) and Verify passes.
func checkConsistent(t *testing.T, q *work.Queue, what string) logFacts {
	t.Helper()
	ctx := context.Background()
	p := &problems{t: t, what: what}
	f := scanLog(t, q, false)
	for id, session := range f.taskSession {
		tk, ok, err := q.Session(session).Task(ctx, id)
		if err != nil || !ok {
			p.add("task %s of the log: found %v, %v", id, ok, err)
			continue
		}
		c := f.completions[id]
		switch {
		case f.taskWakes[id] && tk.State.Terminal():
			if len(c) != 1 || int(c[0]) != int(tk.State) {
				p.add("task %s is %s and wakes on completion, but its completion wakes are %v", id, tk.State, c)
			}
		case len(c) != 0:
			p.add("task %s is %s (wake on completion %v) but has completion wakes %v", id, tk.State, f.taskWakes[id], c)
		}
	}
	for id := range f.completions {
		if _, ok := f.taskSession[id]; !ok {
			p.add("completion wake for unknown task %s", id)
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("%s: Verify: %v", what, err)
	}
	return f
}

// checkLedger checks that every operation of l survived in q: submitted tasks exist and
// their keys still name them (a repeated submit returns the same task and appends nothing),
// finished tasks have their state, cancel requests are kept, direct wakes' keys still name
// them, acknowledgments are in the log. Then checkConsistent.
func checkLedger(t *testing.T, q *work.Queue, l *ledger, at time.Time, what string) logFacts {
	t.Helper()
	ctx := context.Background()
	p := &problems{t: t, what: what}
	before := scanLog(t, q, false).n
	for _, r := range l.submits {
		s := q.Session(r.session)
		tk, ok, err := s.Task(ctx, r.id)
		if err != nil || !ok {
			p.add("acknowledged submit %s (task %s) is lost: found %v, %v", r.key, r.id, ok, err)
			continue
		}
		if tk.IdempotencyKey != r.key {
			p.add("task %s has key %q, want %q", r.id, tk.IdempotencyKey, r.key)
		}
		again, err := s.SubmitAt(ctx, crashTaskRequest(r.key), at)
		if err != nil || again.ID != r.id {
			p.add("repeating submit %s gives %s, %v; want task %s", r.key, again.ID, err, r.id)
		}
	}
	for _, r := range l.wakes {
		w, err := q.Session(r.session).WakeAt(ctx, crashWakeRequest(r.key), at)
		if err != nil || w.ID != r.id {
			p.add("repeating wake %s gives %s, %v; want wake %s", r.key, w.ID, err, r.id)
		}
	}
	if after := scanLog(t, q, false).n; after != before {
		p.add("repeating acknowledged submits and wakes appended %d events", after-before)
	}
	for _, r := range l.finishes {
		tk, ok, err := q.Session(r.session).Task(ctx, r.id)
		if err != nil || !ok || tk.State.String() != r.state {
			p.add("acknowledged finish of %s as %s: task is %s (found %v, %v)", r.id, r.state, tk.State, ok, err)
		}
	}
	for _, r := range l.cancels {
		tk, ok, err := q.Session(r.session).Task(ctx, r.id)
		if err != nil || !ok {
			p.add("cancelled task %s: found %v, %v", r.id, ok, err)
			continue
		}
		if r.requestedAt != 0 && nanosOf(tk.CancelRequestedAt) != r.requestedAt {
			p.add("task %s: acknowledged cancel request at %d, store has %v", r.id, r.requestedAt, tk.CancelRequestedAt)
		}
		if r.state == work.TaskCanceled.String() && tk.State != work.TaskCanceled {
			p.add("task %s was acknowledged canceled, store has %s", r.id, tk.State)
		}
	}
	f := checkConsistent(t, q, what)
	for _, id := range l.acks {
		if !f.acked[id] {
			p.add("acknowledged ack of wake %s is not in the log", id)
		}
	}
	return f
}

// checkAckedNeverClaimable claims every wake claimable at `at` and fails if one acknowledged
// in the store's log is among them (checkLedger has checked that every acknowledgment the
// load reported is in the log). It changes the store: the claimed wakes are leased for
// crashLease.
func checkAckedNeverClaimable(t *testing.T, q *work.Queue, acked map[string]bool, at time.Time, what string) {
	t.Helper()
	ds, err := q.ClaimWakesAt(context.Background(), at, crashLease, 1<<30)
	if err != nil {
		t.Fatalf("%s: claiming every wake: %v", what, err)
	}
	for _, d := range ds {
		if acked[d.Wake.ID] {
			t.Errorf("%s: acknowledged wake %s was delivered again (attempt %d)", what, d.Wake.ID, d.Attempt)
		}
	}
}

// --- crashing a real process ---

const (
	crashChildEnv  = "WORKLOG_CRASH_CHILD_DIR"
	crashRoundEnv  = "WORKLOG_CRASH_CHILD_ROUND"
	crashSeedEnv   = "WORKLOG_CRASH_SEED"
	crashRoundsEnv = "WORKLOG_CRASH_ROUNDS"
	crashSyncEnv   = "WORKLOG_CRASH_CHILD_SYNC_NEVER"
	crashPruneEnv  = "WORKLOG_CRASH_CHILD_PRUNE"
	crashLargeEnv  = "WORKLOG_CRASH_LARGE" // "true": large inputs (crashTaskRequest)
)

// TestCrashHelperProcess is not a test: it is the child of TestCrashKill, which runs the test
// binary again with crashChildEnv set. It runs the load on the store until it is killed.
func TestCrashHelperProcess(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		t.Skip("child process of TestCrashKill")
	}
	var mu sync.Mutex
	say := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		os.Stdout.WriteString(line + "\n")
	}
	round, _ := strconv.Atoi(os.Getenv(crashRoundEnv))
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	// If the parent dies instead of killing us, stdin closes: exit. Never outlive a minute.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	time.AfterFunc(time.Minute, func() { os.Exit(0) })
	var opts *work.Options
	if os.Getenv(crashSyncEnv) == "true" {
		opts = &work.Options{Sync: work.SyncNever}
	}
	if os.Getenv(crashPruneEnv) == "true" {
		opts = pruneChildOptions(say)
	}
	q, err := work.Open(dir, opts)
	if err != nil {
		say("error open: " + err.Error())
		os.Exit(2)
	}
	say("ready")
	if os.Getenv(crashPruneEnv) == "true" {
		err = runPruneChild(q, round, seed, say)
	} else {
		err = runLoad(q, round, seed, say, nil, nil, nil)
	}
	say(fmt.Sprintf("error %v", err))
	os.Exit(2)
}

var crashLarge = os.Getenv(crashLargeEnv) == "true"

func crashSeed(t *testing.T) uint64 {
	seed := uint64(1)
	if s := os.Getenv(crashSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", crashSeedEnv, s, err)
		}
		seed = n
	}
	return seed
}

// runCrashRound starts the child on dir, kills it with SIGKILL after delay (counted from its
// "ready"), and returns what it acknowledged.
func runCrashRound(t *testing.T, dir string, round int, seed uint64, delay time.Duration, syncNever bool, env ...string) *ledger {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		crashChildEnv+"="+dir, crashRoundEnv+"="+strconv.Itoa(round), crashSeedEnv+"="+strconv.FormatUint(seed, 10),
		crashSyncEnv+"="+strconv.FormatBool(syncNever))
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	l := &ledger{}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		r := bufio.NewReader(stdout)
		sawReady := false
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				// A line cut by the kill has no newline: it was not fully reported.
				done <- nil
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "ready" && !sawReady:
				sawReady = true
				close(ready)
			case strings.HasPrefix(line, "error"):
				done <- fmt.Errorf("child: %s", line)
				io.Copy(io.Discard, r)
				return
			case !sawReady:
				// Test framework chatter before the load: ignore.
			default:
				if err := l.record(line); err != nil {
					done <- err
					io.Copy(io.Discard, r)
					return
				}
			}
		}
	}()

	select {
	case <-ready:
	case err := <-done:
		cmd.Wait()
		killed = true
		t.Fatalf("round %d: child ended before it was ready: %v\nstderr:\n%s", round, err, stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("round %d: child not ready after a minute\nstderr:\n%s", round, stderr.String())
	}
	// The kill delay is the only sleep: a random moment of the load.
	time.Sleep(delay)
	cmd.Process.Signal(syscall.SIGKILL) // fails only if the child is gone: Wait tells why
	waitErr := cmd.Wait()
	killed = true
	if err := <-done; err != nil {
		t.Fatalf("round %d: %v\nstderr:\n%s", round, err, stderr.String())
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("round %d: child ended with %v before it was killed\nstderr:\n%s", round, waitErr, stderr.String())
	}
	return l
}

func TestCrashKill(t *testing.T) {
	rounds, budget := 15, 20*time.Second
	if testing.Short() {
		rounds = 3
	}
	if raceBuild() {
		budget = 10 * time.Second // Pebble checks its invariants under -race: fewer rounds
	}
	if s := os.Getenv(crashRoundsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", crashRoundsEnv, s)
		}
		rounds, budget = n, 0
	}
	testCrashKill(t, rounds, budget, false)
}

// With SyncNever a killed process may lose acknowledged calls (those still in Pebble's WAL
// buffer), but only whole: the store reopens consistent, with nothing half-applied.
func TestCrashKillSyncNever(t *testing.T) {
	if testing.Short() {
		t.Skip("TestCrashKill covers crashing a process")
	}
	testCrashKill(t, 3, 0, true)
}

func testCrashKill(t *testing.T, rounds int, budget time.Duration, syncNever bool) {
	seed := crashSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0xc4a54))
	t.Logf("seed %d (set %s to repeat the random choices), up to %d rounds", seed, crashSeedEnv, rounds)

	dir := t.TempDir()
	ctx := context.Background()
	all := &ledger{}
	start := time.Now()
	round := 0
	for round < rounds {
		if budget > 0 && round >= 3 && time.Since(start) > budget {
			t.Logf("stopping after %d rounds: the time budget of %v is spent", round, budget)
			break
		}
		delay := time.Duration(50+rng.IntN(351)) * time.Millisecond
		l := runCrashRound(t, dir, round, seed, delay, syncNever)

		q, err := work.Open(dir, nil)
		if err != nil {
			t.Fatalf("round %d: reopening after the kill: %v", round, err)
		}
		what := fmt.Sprintf("round %d (killed after %v; %v)", round, delay, l)
		var f logFacts
		if syncNever {
			f = checkConsistent(t, q, what)
			lost := 0
			for _, r := range l.submits {
				if _, ok, _ := q.Session(r.session).Task(ctx, r.id); !ok {
					lost++
				}
			}
			what += fmt.Sprintf(", %d acknowledged submits lost", lost)
		} else {
			f = checkLedger(t, q, l, checkTime(round), what)
		}
		checkAckedNeverClaimable(t, q, f.acked, checkTime(round), what)
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		all.merge(l)
		t.Logf("%s: %d events in the log", what, f.n)
		round++
	}
	if all.lines == 0 {
		t.Fatal("no child acknowledged anything: the load never ran")
	}

	// Last, everything every round acknowledged, and the store still works: drain it.
	var opts *work.Options
	if syncNever {
		opts = &work.Options{Sync: work.SyncNever} // many calls: no fsync each
	}
	q, err := work.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if !syncNever {
		checkLedger(t, q, all, checkTime(round), fmt.Sprintf("after %d rounds (%v)", round, all))
	}
	drainAt := crashBase(round + 3) // after every schedule and lease of every round
	ds, err := q.ClaimDueAt(ctx, drainAt, crashLease, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if _, err := q.FinishAt(ctx, d, work.Success(nil), drainAt); err != nil {
			t.Fatalf("draining: finish %s: %v", d.Task.ID, err)
		}
	}
	ws, err := q.ClaimWakesAt(ctx, drainAt, crashLease, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ws {
		if err := q.AckWakeAt(ctx, d, drainAt); err != nil {
			t.Fatalf("draining: ack %s: %v", d.Wake.ID, err)
		}
	}
	f := checkConsistent(t, q, "drained")
	for id, session := range f.taskSession {
		if tk, _, _ := q.Session(session).Task(ctx, id); !tk.State.Terminal() {
			t.Errorf("task %s is %s after draining", id, tk.State)
		}
	}
	if ws, _ := q.ClaimWakesAt(ctx, drainAt.Add(24*time.Hour), crashLease, 10); len(ws) != 0 {
		t.Errorf("%d wakes claimable after every wake was acknowledged", len(ws))
	}
	t.Logf("%d rounds in %v; drained %d tasks and %d wakes; %d events in the log",
		round, time.Since(start).Round(time.Millisecond), len(ds), len(ws), f.n)
}

// --- crashing Pebble's in-memory filesystem ---

func TestCrashClone(t *testing.T) {
	for _, c := range []struct {
		name     string
		sync     work.SyncMode
		unsynced int
	}{
		{"SyncAlways/unsynced=0", work.SyncAlways, 0},
		{"SyncAlways/unsynced=50", work.SyncAlways, 50},
		{"SyncNever/unsynced=0", work.SyncNever, 0},
		{"SyncNever/unsynced=50", work.SyncNever, 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			testCrashClone(t, c.sync, c.unsynced)
		})
	}
}

func testCrashClone(t *testing.T, mode work.SyncMode, unsynced int) {
	const dir = "/data/store"
	seed := crashSeed(t)
	rng := rand.New(rand.NewPCG(seed, uint64(unsynced)<<1|uint64(mode)))
	fs := vfs.NewCrashableMem()
	q, err := work.Open(dir, &work.Options{FS: fs, Sync: mode})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()

	l := &ledger{}
	progress := make(chan struct{}, 1<<14)
	var reportErr atomic.Value
	emit := func(line string) {
		if err := l.record(line); err != nil {
			reportErr.Store(err)
		}
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	stop := make(chan struct{})
	loadDone := make(chan error, 1)
	var gate sync.RWMutex
	go func() { loadDone <- runLoad(q, 0, seed, emit, stop, &gate, nil) }()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-loadDone
		}
	}()

	cloneCfg := func() vfs.CrashCloneCfg {
		cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced}
		if unsynced > 0 {
			cfg.RNG = rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		}
		return cfg
	}
	clones := 5
	if raceBuild() {
		clones = 2 // Pebble checks its invariants under -race: every check costs more
	}
	for i := range clones {
		for range 20 + rng.IntN(150) {
			select {
			case <-progress:
			case err := <-loadDone:
				t.Fatalf("the load stopped: %v", err)
			}
		}
		// The clone is taken with calls in flight: a crash in the middle of the load. The
		// load then pauses while the clone is checked, so the ledger stays small.
		acked := l.snapshot()
		clone := fs.CrashClone(cloneCfg())
		gate.Lock()
		what := fmt.Sprintf("clone %d (%v acknowledged before it)", i, acked)
		cq, err := work.Open(dir, &work.Options{FS: clone})
		if err != nil {
			t.Fatalf("%s: opening: %v", what, err)
		}
		var f logFacts
		if mode == work.SyncAlways {
			f = checkLedger(t, cq, acked, checkTime(0), what)
		} else {
			f = checkConsistent(t, cq, what)
		}
		checkPrefix(t, cq, q, what)
		checkAckedNeverClaimable(t, cq, f.acked, checkTime(0), what)
		if err := cq.Close(); err != nil {
			t.Fatal(err)
		}
		gate.Unlock()
		t.Logf("%s: the clone has %d events", what, f.n)
	}
	close(stop)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	if err, _ := reportErr.Load().(error); err != nil {
		t.Fatal(err)
	}

	// Close makes everything durable, whatever the sync mode: a crash after it loses nothing.
	acked := l.snapshot()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	clone := fs.CrashClone(cloneCfg())
	cq, err := work.Open(dir, &work.Options{FS: clone})
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	f := checkLedger(t, cq, acked, checkTime(0), fmt.Sprintf("after Close (%v)", acked))
	t.Logf("after Close: %v; %d events", acked, f.n)
}

// checkPrefix checks that the crashed store's log is a prefix of the live one, event for event
// and byte for byte: a crash loses a suffix of whole commands at most, never invents or
// changes one.
func checkPrefix(t *testing.T, crashed, live *work.Queue, what string) {
	t.Helper()
	got := scanLog(t, crashed, true).encoded
	i := 0
	errDone := errors.New("done")
	err := live.ReadLog(context.Background(), 0, func(ev events.Event) error {
		if i == len(got) {
			return errDone
		}
		b, err := events.Encode(ev)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, got[i]) {
			return fmt.Errorf("event %d differs from the live store's", i+1)
		}
		i++
		return nil
	})
	if err != nil && !errors.Is(err, errDone) {
		t.Fatalf("%s: %v", what, err)
	}
	if i != len(got) {
		t.Fatalf("%s: the crashed log has %d events, the live one only %d", what, len(got), i)
	}
}
