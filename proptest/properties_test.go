package proptest

import (
	"fmt"
	"math/rand"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
)

// TestQueueProperties runs random histories on the in-memory queue and checks every property
// after every step (see doc.go).
func TestQueueProperties(t *testing.T) {
	checkHistories(t, &harness{backends: []backendSpec{memoryBackend}}, runsFor(defaultRuns))
}

// TestQueuePropertiesDurable is TestQueueProperties on the durable store, with Reopen and
// Crash ops. It skips until work.Open is plugged in (backends_test.go).
func TestQueuePropertiesDurable(t *testing.T) {
	b, ok := durableBackend()
	if !ok {
		t.Skip("work.Open is not plugged in yet: see the PLUG-IN POINT in backends_test.go")
	}
	checkHistories(t, &harness{backends: []backendSpec{b}}, runsFor(durableRuns))
}

// TestDifferentialMemory applies each history to two independent in-memory queues and
// compares every result, with ids replaced by model handles (plus all model checks on both).
func TestDifferentialMemory(t *testing.T) {
	second := memoryBackend
	second.name = "memory-2"
	checkHistories(t, &harness{backends: []backendSpec{memoryBackend, second}}, runsFor(diffMemRuns))
}

// TestDifferentialDurable compares the in-memory queue with the durable one. It skips until
// work.Open is plugged in.
func TestDifferentialDurable(t *testing.T) {
	b, ok := durableBackend()
	if !ok {
		t.Skip("work.Open is not plugged in yet: see the PLUG-IN POINT in backends_test.go")
	}
	checkHistories(t, &harness{backends: []backendSpec{memoryBackend, b}}, runsFor(durableRuns))
}

func allBackends() []backendSpec {
	bs := []backendSpec{memoryBackend}
	if b, ok := durableBackend(); ok {
		bs = append(bs, b)
	}
	return bs
}

// TestRegressions replays every saved history in testdata/regress on every backend. A file
// with "skip" documents a known bug and is skipped with that reason.
func TestRegressions(t *testing.T) {
	files := loadHistories(t, filepath.Join("testdata", "regress"))
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		f, ops, err := decodeHistory(files[name])
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, b := range allBackends() {
			t.Run(name+"/"+b.name, func(t *testing.T) {
				if f.Skip != "" {
					t.Skip(f.Skip)
				}
				if !b.restartable && hasRestart(ops) {
					t.Skip("the history restarts the store; " + b.name + " cannot")
				}
				replay(t, b, f.Sessions, ops)
			})
		}
	}
}

func hasRestart(ops []op) bool {
	for _, o := range ops {
		switch o.(type) {
		case ReopenOp, CrashOp:
			return true
		}
	}
	return false
}

// TestScenarios are hand-written histories for the rules a reader looks for first; they run
// with every check on every backend, like the random ones.
func TestScenarios(t *testing.T) {
	const (
		s1, s2         = 0, 1
		thumb, index   = 0, 1
		ab, ba, one, f = 0, 1, 2, 3 // {"a":1,"b":2}, { "b": 2, "a": 1 }, 1, 1.0
		k1, k2         = 0, 1
		none           = -1
	)
	sec := time.Second
	scenarios := []struct {
		name string
		ops  []op
	}{
		{"main flow with completion wake", []op{
			SubmitOp{S: s1, Kind: thumb, Input: ab, Key: k1, Wake: true},
			ClaimOp{Lease: sec, Limit: 10},
			AdvanceOp{D: sec / 2},
			FinishOp{T: 0, Attempt: 1, Outcome: 0},
			ClaimWakesOp{Lease: sec, Limit: 10},
			AckOp{W: 0, Attempt: 1},
			AckOp{W: 0, Attempt: 1},
			AdvanceOp{D: time.Hour},
			ClaimWakesOp{Lease: sec, Limit: 10},
		}},
		{"idempotency compares JSON values, numbers by text", []op{
			SubmitOp{S: s1, Kind: thumb, Input: ab, Key: k1},
			SubmitOp{S: s1, Kind: thumb, Input: ba, Key: k1}, // same value, other key order
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: k2},
			SubmitOp{S: s1, Kind: thumb, Input: f, Key: k2}, // 1.0 is not 1: conflict
			SubmitOp{S: s1, Kind: index, Input: ab, Key: k1},
			SubmitOp{S: s1, Kind: thumb, Input: ab, Key: k1, HasRunAt: true, RunAt: 0}, // explicit now differs from immediate
			SubmitOp{S: s2, Kind: index, Input: one, Key: k1},                          // keys are per session
			WakeOp{S: s1, Key: k1, Payload: ba},                                        // wake keys are a separate namespace
			WakeOp{S: s1, Key: k1, Payload: ab},
			WakeOp{S: s1, Key: k1, Payload: one},
		}},
		{"lease expiry is exact and fences the old delivery", []op{
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none},
			ClaimOp{Lease: sec, Limit: 100},
			AdvanceOp{D: sec - 1},
			ClaimOp{Lease: sec, Limit: 100}, // one nanosecond early: nothing
			AdvanceOp{D: 1},
			ClaimOp{Lease: 2 * sec, Limit: 100}, // exactly at expiry: attempt 2
			FinishOp{T: 0, Attempt: 1, Outcome: 2},
			FinishOp{T: 0, Attempt: 2, Outcome: 2, Forged: true},
			FinishOp{T: 0, Attempt: 2, Outcome: 3},
			FinishOp{T: 0, Attempt: 2, Outcome: 3},
			FinishOp{T: 0, Attempt: 2, Outcome: 6}, // another outcome: invalid transition
			FinishOp{T: 0, Attempt: 1, Outcome: 3},
			AdvanceOp{D: time.Hour},
			ClaimOp{Lease: sec, Limit: 100},
		}},
		{"cancel: pending at once, running cooperatively, completion wake either way", []op{
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none, Wake: true, HasRunAt: true, RunAt: int64(5 * sec)},
			SubmitOp{S: s1, Kind: index, Input: one, Key: none, Wake: true},
			CancelOp{S: s1, T: 0}, // scheduled in the future, still pending: canceled now
			ClaimOp{Lease: sec, Limit: 100},
			CancelOp{S: s2, T: 1}, // foreign: not found
			CancelOp{S: s1, T: 1},
			AdvanceOp{D: sec},
			CancelOp{S: s1, T: 1},           // the first request time is kept
			ClaimOp{Lease: sec, Limit: 100}, // redelivered with the cancel request
			FinishOp{T: 1, Attempt: 2, Outcome: cancelOutcome},
			CancelOp{S: s1, T: 1},
			ClaimWakesOp{Lease: sec, Limit: 100},
		}},
		{"claim order: eligible first, ties by submission", []op{
			SubmitOp{S: s1, Kind: thumb, Input: ab, Key: none, HasRunAt: true, RunAt: int64(2 * sec)},
			SubmitOp{S: s2, Kind: thumb, Input: ab, Key: none, HasRunAt: true, RunAt: int64(sec)},
			SubmitOp{S: s1, Kind: thumb, Input: ab, Key: none},
			ClaimOp{Lease: 3 * sec, Limit: 1},
			AdvanceOp{D: 2 * sec},
			SubmitOp{S: s1, Kind: index, Input: one, Key: none},
			ClaimOp{Lease: sec, Limit: 100},
			AdvanceOp{D: 2 * sec},
			ClaimOp{Lease: sec, Limit: 2},
		}},
		{"session isolation of reads, cancels and keys", []op{
			SubmitOp{S: s1, Kind: thumb, Input: ab, Key: k1},
			SubmitOp{S: s2, Kind: thumb, Input: ab, Key: k1},
			ReadOp{S: s2, T: 0},
			ReadOp{S: s1, T: 0},
			ReadOp{S: s1, T: -1},
			CancelOp{S: s2, T: 0},
			CancelOp{S: s1, T: -1},
		}},
		{"wake leases and acknowledgment", []op{
			WakeOp{S: s1, Key: k1, Payload: one},
			WakeOp{S: s2, Key: none, Payload: 4},
			ClaimWakesOp{Lease: sec, Limit: 1},
			AdvanceOp{D: sec},
			ClaimWakesOp{Lease: sec, Limit: 100},
			AckOp{W: 0, Attempt: 1},
			AckOp{W: 0, Attempt: 2, Forged: true},
			AckOp{W: 0, Attempt: 2},
			AckOp{W: 0, Attempt: 2},
			AckOp{W: -1},
			AdvanceOp{D: 5 * sec},
			ClaimWakesOp{Lease: sec, Limit: 100},
		}},
	}
	for _, sc := range scenarios {
		for _, b := range allBackends() {
			t.Run(sc.name+"/"+b.name, func(t *testing.T) { replay(t, b, 2, sc.ops) })
		}
	}
}

// TestHistoryRoundTrip: the JSON printed with a failure loads back to the same history.
func TestHistoryRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	m := newModel(3, true)
	var ops []op
	for range 200 {
		o := genOp(r, m)
		ops = append(ops, o)
		c := cmd{o}
		m = c.NextState(m).(*model)
	}
	text := encodeHistory(historyFile{Comment: "round trip", Sessions: 3}, ops)
	f, got, err := decodeHistory([]byte(text))
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if f.Sessions != 3 || f.Comment != "round trip" || len(got) != len(ops) {
		t.Fatalf("loaded %d ops, sessions %d", len(got), f.Sessions)
	}
	for i := range ops {
		if fmt.Sprintf("%#v", got[i]) != fmt.Sprintf("%#v", ops[i]) {
			t.Fatalf("op %d: %#v, want %#v", i+1, got[i], ops[i])
		}
	}
}

// TestGeneratorCoverage runs the generator against the model alone and checks that random
// histories reach every case the properties are about, so that a passing property test is
// not passing for want of trying.
func TestGeneratorCoverage(t *testing.T) {
	r := rand.New(rand.NewSource(*seedFlag + 7))
	seen := map[string]int{}
	for range 400 {
		m := newModel(2+r.Intn(2), true)
		for range defaultMaxLen {
			o := genOp(r, m)
			n := cmd{o}.NextState(m).(*model)
			for _, c := range classify(o, m, n) {
				seen[c]++
			}
			m = n
		}
	}
	var missing, report []string
	for _, c := range coverageCases {
		if seen[c] == 0 {
			missing = append(missing, c)
		}
		report = append(report, fmt.Sprintf("%6d  %s", seen[c], c))
	}
	t.Logf("cases reached in 400 random histories:\n%s", strings.Join(report, "\n"))
	if len(missing) > 0 {
		t.Errorf("the generator never reached: %s", strings.Join(missing, "; "))
	}
	for _, ty := range events.AllTypes() {
		c, ok := caseAppending[ty]
		switch {
		case !ok:
			t.Errorf("no coverage case appends a %s event: give the model its rule and an op that issues it, and name the case in caseAppending (docs/design.md §8, step 7)", ty)
		case !slices.Contains(coverageCases, c):
			t.Errorf("caseAppending names %q for %s, which is not a coverage case", c, ty)
		}
	}
}

// caseAppending names, for every event type, a coverage case whose command appends it: a
// new type without one fails TestGeneratorCoverage, so the properties never hold for a type
// simply because no history contains it.
var caseAppending = map[events.Type]string{
	events.TypeTaskSubmitted:       "submit new",
	events.TypeTaskClaimed:         "claim redelivery after lease expiry",
	events.TypeTaskSettled:         "finish current",
	events.TypeTaskCancelRequested: "cancel running",
	events.TypeWakeRecorded:        "wake new",
	events.TypeWakeClaimed:         "claim wakes redelivery",
	events.TypeWakeAcked:           "ack current",
	events.TypeTaskSettleRejected:  "finish stale (superseded)",
	events.TypeWakeAckRejected:     "ack stale",
}

var coverageCases = []string{
	"submit new", "submit immediate", "submit scheduled", "submit repeat (same intent)",
	"submit repeat (other spelling of the input)", "submit conflict", "submit same key in another session",
	"read own", "read foreign", "read unknown",
	"cancel pending", "cancel scheduled pending", "cancel running", "cancel running again", "cancel terminal",
	"cancel foreign", "cancel unknown",
	"claim empty", "claim cut by limit", "claim redelivery after lease expiry", "claim exactly at eligibility",
	"claim with a cancel request pending",
	"finish current", "finish stale (superseded)", "finish after settlement by another attempt", "finish forged",
	"finish repeat same outcome", "finish repeat other spelling", "finish repeat different outcome", "finish unknown",
	"wake new", "wake repeat", "wake conflict", "wake same key in another session",
	"claim wakes redelivery", "claim wakes exactly at expiry",
	"ack current", "ack after lease expiry", "ack stale", "ack repeat", "ack forged", "ack unknown",
	"advance onto a mark", "advance 1ns before a mark", "advance 1ns after a mark",
	"completion wake succeeded", "completion wake failed", "completion wake canceled running",
	"completion wake canceled pending",
	"invalid", "reopen", "crash",
}

// classify names the cases op o exercises when applied to m (giving n).
func classify(o op, m, n *model) []string {
	e := n.exp
	var c []string
	add := func(s ...string) { c = append(c, s...) }
	switch o := o.(type) {
	case SubmitOp:
		switch {
		case e.newRec:
			add("submit new")
			if o.HasRunAt {
				add("submit scheduled")
			} else {
				add("submit immediate")
			}
			if o.Key >= 0 {
				for _, t := range m.tasks {
					if t.key == o.Key && t.sess != o.S {
						add("submit same key in another session")
						break
					}
				}
			}
		case e.err == errConflict:
			add("submit conflict")
		default:
			add("submit repeat (same intent)")
			if m.tasks[e.task].input != o.Input {
				add("submit repeat (other spelling of the input)")
			}
		}
	case ReadOp:
		switch {
		case o.T < 0:
			add("read unknown")
		case e.found:
			add("read own")
		default:
			add("read foreign")
		}
	case CancelOp:
		switch {
		case o.T < 0:
			add("cancel unknown")
		case e.err == errNotFound:
			add("cancel foreign")
		case m.tasks[o.T].state == mPending:
			add("cancel pending")
			if m.tasks[o.T].scheduled > m.now {
				add("cancel scheduled pending")
			}
		case m.tasks[o.T].state == mRunning && m.tasks[o.T].cancelReq:
			add("cancel running again")
		case m.tasks[o.T].state == mRunning:
			add("cancel running")
		default:
			add("cancel terminal")
		}
	case ClaimOp:
		if len(e.claims) == 0 {
			add("claim empty")
		}
		if len(e.claims) == o.Limit && len(m.eligibleTasks()) > o.Limit {
			add("claim cut by limit")
		}
		for _, cl := range e.claims {
			if cl.expired {
				add("claim redelivery after lease expiry")
			}
			if cl.since == m.now {
				add("claim exactly at eligibility")
			}
			if m.tasks[cl.h].cancelReq {
				add("claim with a cancel request pending")
			}
		}
	case FinishOp:
		switch {
		case e.err == errNotFound:
			add("finish unknown")
		case e.err == errStale && o.Forged:
			add("finish forged")
		case e.err == errStale && m.tasks[o.T].state.terminal():
			add("finish after settlement by another attempt")
		case e.err == errStale:
			add("finish stale (superseded)")
		case e.err == errTransition:
			add("finish repeat different outcome")
		case e.events == 0:
			add("finish repeat same outcome")
			if m.tasks[o.T].outcome != o.Outcome {
				add("finish repeat other spelling")
			}
		default:
			add("finish current")
		}
	case WakeOp:
		switch {
		case e.newRec:
			add("wake new")
			for _, w := range m.wakes {
				if w.direct && o.Key >= 0 && w.key == o.Key && w.sess != o.S {
					add("wake same key in another session")
					break
				}
			}
		case e.err == errConflict:
			add("wake conflict")
		default:
			add("wake repeat")
		}
	case ClaimWakesOp:
		for _, cl := range e.claims {
			if cl.expired {
				add("claim wakes redelivery")
				if cl.since == m.now {
					add("claim wakes exactly at expiry")
				}
			}
		}
	case AckOp:
		switch {
		case o.W < 0:
			add("ack unknown")
		case e.err == errStale && o.Forged:
			add("ack forged")
		case e.err == errStale:
			add("ack stale")
		case e.events == 0:
			add("ack repeat")
		default:
			add("ack current")
			if m.wakes[o.W].leaseExp <= m.now {
				add("ack after lease expiry")
			}
		}
	case AdvanceOp:
		to := n.now
		for _, t := range m.tasks {
			for _, mark := range []int64{t.leaseExp, t.scheduled} {
				if mark > m.now {
					switch to - mark {
					case 0:
						add("advance onto a mark")
					case -1:
						add("advance 1ns before a mark")
					case 1:
						add("advance 1ns after a mark")
					}
				}
			}
		}
	case InvalidOp:
		add("invalid")
	case ReopenOp:
		add("reopen")
	case CrashOp:
		add("crash")
	}
	for _, w := range e.newCW {
		t := m.tasks[n.wakes[w].task]
		switch st := outcomePool[n.wakes[w].outcome].state; {
		case st == mCanceled && t.state == mPending:
			add("completion wake canceled pending")
		case st == mCanceled:
			add("completion wake canceled running")
		default:
			add("completion wake " + st.String())
		}
	}
	return c
}
