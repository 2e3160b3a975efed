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
func TestRegressions(t *testing.T) { replayRegressions(t, allBackends(), nil) }

// replayRegressions replays every saved history on each of backends (only those for which
// only(ops) holds, when only is set).
func replayRegressions(t *testing.T, backends []backendSpec, only func([]op) bool) {
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
		if only != nil && !only(ops) {
			continue
		}
		for _, b := range backends {
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
		{"heartbeats move the lease either way; stale ones change nothing", []op{
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none, Wake: true},
			ClaimOp{Lease: sec, Limit: 100},
			AdvanceOp{D: sec / 2},
			ExtendOp{T: 0, Attempt: 1, Lease: 3 * sec}, // until 3.5s, later than before
			AdvanceOp{D: sec},
			ClaimOp{Lease: sec, Limit: 100},            // 1.5s: nothing, the lease was extended
			ExtendOp{T: 0, Attempt: 1, Lease: sec / 2}, // until 2s, earlier than before
			AdvanceOp{D: sec/2 - 1},
			ClaimOp{Lease: sec, Limit: 100}, // 1ns early: nothing
			AdvanceOp{D: 1},
			ClaimOp{Lease: sec, Limit: 100},                           // exactly at the new expiry: attempt 2
			ExtendOp{T: 0, Attempt: 1, Lease: 10 * sec},               // superseded
			ExtendOp{T: 0, Attempt: 2, Lease: 10 * sec, Forged: true}, // forged
			ExtendOp{T: -1, Lease: sec},                               // unknown
			CancelOp{S: s1, T: 0},
			ExtendOp{T: 0, Attempt: 2, Lease: sec}, // sees the cancel request
			FinishOp{T: 0, Attempt: 2, Outcome: cancelOutcome},
			ExtendOp{T: 0, Attempt: 2, Lease: sec}, // settled
			AdvanceOp{D: time.Hour},
			ClaimOp{Lease: sec, Limit: 100},
		}},
		{"release: pending again with its attempts; a cancel-requested task is canceled", []op{
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: k1, Wake: true},
			SubmitOp{S: s1, Kind: index, Input: ab, Key: none, Wake: true},
			ClaimOp{Lease: sec, Limit: 100},
			ReleaseOp{T: 0, Attempt: 1, HasRunAt: true, RunAt: int64(2 * sec)},
			ReleaseOp{T: 0, Attempt: 1},                                   // repeated: stale
			FinishOp{T: 0, Attempt: 1, Outcome: 0},                        // the released delivery cannot settle
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: k1, Wake: true}, // the key still finds it
			CancelOp{S: s1, T: 1},
			ReleaseOp{T: 1, Attempt: 1, HasRunAt: true, RunAt: int64(5 * sec)}, // canceled, with its wake
			ClaimWakesOp{Lease: sec, Limit: 100},
			AdvanceOp{D: 2*sec - 1},
			ClaimOp{Lease: sec, Limit: 100}, // 1ns early
			AdvanceOp{D: 1},
			ClaimOp{Lease: sec, Limit: 100},                       // attempt 2
			ReleaseOp{T: 0, Attempt: 2, HasRunAt: true, RunAt: 0}, // RunAt in the past: due now
			ClaimOp{Lease: sec, Limit: 100},                       // attempt 3
			FinishOp{T: 0, Attempt: 3, Outcome: 6},
			ReleaseOp{T: 0, Attempt: 3}, // settled
			ReleaseOp{T: -1},
		}},
		{"claims by kind and a session's list", []op{
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none},
			SubmitOp{S: s1, Kind: index, Input: one, Key: none},
			SubmitOp{S: s2, Kind: thumb, Input: one, Key: none},
			ClaimKindsOp{Mask: 2, Lease: sec, Limit: 100},
			ClaimKindsOp{Mask: 4, Lease: sec, Limit: 100}, // a kind nobody submits
			TasksOp{S: s1, After: -1, Limit: 100},
			TasksOp{S: s1, States: 1 << mRunning, After: -1, Limit: 100},
			TasksOp{S: s1, Kinds: 1, After: -1, Limit: 100},
			TasksOp{S: s1, After: 0, Limit: 100},
			TasksOp{S: s1, After: 2, Limit: 100}, // another session's task
			TasksOp{S: s2, After: -2, Limit: 100},
			ClaimKindsOp{Mask: 1, Dup: true, Lease: sec, Limit: 1},
			ClaimKindsOp{Mask: 3, Lease: sec, Limit: 100},
			AdvanceOp{D: sec},
			ClaimKindsOp{Mask: 1, Lease: sec, Limit: 100}, // redeliveries of thumb only
			TasksOp{S: s1, After: -1, Limit: 1},
		}},
		{"claims see work due before what they last claimed", []op{
			AdvanceOp{D: 2 * sec},
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none},
			ClaimKindsOp{Mask: 1, Lease: sec, Limit: 100},                                          // T0, due at 2s
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none, HasRunAt: true, RunAt: int64(sec)}, // due at 1s
			ReleaseOp{T: 0, Attempt: 1},
			ClaimKindsOp{Mask: 1, Lease: sec, Limit: 100}, // T1 (1s) then T0 (2s)
			SubmitOp{S: s2, Kind: index, Input: one, Key: none},
			ClaimOp{Lease: sec, Limit: 100},
			SubmitOp{S: s2, Kind: index, Input: one, Key: none, HasRunAt: true, RunAt: int64(sec)},
			ClaimOp{Lease: sec, Limit: 100},
		}},
		{"settle and claim: each settle on its own, then the claims", []op{
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none, Wake: true},
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: none},
			SubmitOp{S: s2, Kind: index, Input: one, Key: none},
			ClaimOp{Lease: sec, Limit: 2},
			SettleAndClaimOp{Settles: []settleSpec{
				{T: 0, Attempt: 1, Outcome: 0},
				{T: 1, Attempt: 1, Release: true},
				{T: 1, Attempt: 1, Outcome: 0},               // released just before: stale
				{T: 0, Attempt: 1, Forged: true, Outcome: 6}, // forged
				{T: 0, Attempt: 1, Outcome: 1},               // the same outcome again: fine
			}, Lease: sec, Limit: 100},
			SettleAndClaimOp{Settles: []settleSpec{{T: 1, Attempt: 2, Release: true, HasRun: true, RunAt: int64(sec)}}, Mask: 1, Lease: sec, Limit: 100},
			AdvanceOp{D: sec},
			SettleAndClaimOp{Mask: 2, Lease: sec, Limit: 100},
			SettleAndClaimOp{Lease: 0, Limit: 0},
		}},
		{"prune: strictly before, a completion wake only once acknowledged, keys freed", []op{
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: k1},
			ClaimOp{Lease: sec, Limit: 100},
			FinishOp{T: 0, Attempt: 1, Outcome: 0},            // T0 finished at 0
			PruneOp{Before: 0},                                // exactly its FinishedAt: kept
			PruneOp{Before: 1},                                // 1ns after: pruned
			ReadOp{S: s1, T: 0},                               // absent
			FinishOp{T: 0, Attempt: 1, Outcome: 0},            // a late finish: ErrTaskNotFound
			SubmitOp{S: s1, Kind: thumb, Input: one, Key: k1}, // the key is free: T1, new
			SubmitOp{S: s1, Kind: index, Input: ab, Key: k2, Wake: true},
			ClaimKindsOp{Mask: 2, Lease: sec, Limit: 100}, // T2
			AdvanceOp{D: sec},
			FinishOp{T: 2, Attempt: 1, Outcome: 6}, // finished at 1s, completion wake W0
			WakeOp{S: s1, Key: k1, Payload: one},   // W1
			ClaimWakesOp{Lease: 10 * sec, Limit: 100},
			AckOp{W: 1, Attempt: 1}, // W1 acknowledged at 1s
			AdvanceOp{D: sec},
			PruneOp{Before: int64(2 * sec)},       // W1 goes; T2 stays, its completion wake is unacknowledged
			AckOp{W: 1, Attempt: 1},               // a pruned wake: ErrStaleDelivery
			WakeOp{S: s1, Key: k1, Payload: f},    // its key is free: W2, new
			AckOp{W: 0, Attempt: 1},               // acknowledged at 2s
			PruneOp{Before: int64(2 * sec)},       // exactly at the acknowledgment: T2 stays
			PruneOp{Before: int64(2*sec) + 1},     // T2 and W0 go together
			AckOp{W: 0, Attempt: 1},               // ErrStaleDelivery
			TasksOp{S: s1, After: -1, Limit: 100}, // T1 only
			TasksOp{S: s1, After: 2, Limit: 100},  // a pruned cursor: ErrTaskNotFound
			CancelOp{S: s1, T: 2},
			ExtendOp{T: 2, Attempt: 1, Lease: sec},
			ReleaseOp{T: 2, Attempt: 1},
			ClaimOp{Lease: sec, Limit: 100}, // T1: claims see the same work
		}},
	}
	for _, sc := range scenarios {
		for _, b := range allBackends() {
			t.Run(sc.name+"/"+b.name, func(t *testing.T) { replay(t, b, 2, sc.ops) })
		}
	}
}

// TestPruneLongRun prunes runs of more consecutive events than random histories make: on
// Pebble a run of at least 64 pruned events is one range deletion, not a point deletion
// each (pebblelog/prune.go). Then the store restarts (the durable backend) and takes more
// work; every check runs after every step, as for the random histories.
func TestPruneLongRun(t *testing.T) {
	const n = 40
	sec := time.Second
	// T0 is scheduled later and stays pending: kept, before the run.
	ops := []op{SubmitOp{S: 1, Kind: 0, Input: 0, Key: 0, HasRunAt: true, RunAt: int64(time.Hour)}}
	for i := range n { // T1..T40, half with a completion wake
		ops = append(ops, SubmitOp{S: i % 2, Kind: i % 2, Input: 2, Key: -1, Wake: i%2 == 0})
	}
	ops = append(ops, ClaimOp{Lease: sec, Limit: 100})
	var settles []settleSpec
	for h := 1; h <= n; h++ {
		settles = append(settles, settleSpec{T: h, Attempt: 1, Outcome: h % 7})
	}
	ops = append(ops, SettleAndClaimOp{Settles: settles, Lease: sec, Limit: 0}, // 20 completion wakes
		ClaimWakesOp{Lease: sec, Limit: 100})
	for w := range n / 2 {
		ops = append(ops, AckOp{W: w, Attempt: 1})
	}
	// One run of about 180 events (seq 2 on) goes; T0 and the new work stay.
	ops = append(ops, WakeOp{S: 0, Key: 1, Payload: 2}, AdvanceOp{D: sec}, PruneOp{Before: int64(sec)},
		ReadOp{S: 1, T: 0}, ReopenOp{},
		SubmitOp{S: 0, Kind: 0, Input: 2, Key: 0}, ClaimOp{Lease: sec, Limit: 100},
		ClaimWakesOp{Lease: sec, Limit: 100}, AckOp{W: 20, Attempt: 1}, AdvanceOp{D: sec},
		PruneOp{Before: int64(2 * sec)}, CrashOp{},
		TasksOp{S: 0, After: -1, Limit: 100}, AdvanceOp{D: time.Hour}, ClaimOp{Lease: sec, Limit: 100})
	for _, b := range allBackends() {
		t.Run(b.name, func(t *testing.T) {
			run := ops
			if !b.restartable {
				run = nil
				for _, o := range ops {
					switch o.(type) {
					case ReopenOp, CrashOp:
					default:
						run = append(run, o)
					}
				}
			}
			replay(t, b, 2, run)
		})
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
		m.inbox = true
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
	for _, c := range append(coverageCases[:len(coverageCases):len(coverageCases)], pruneCoverageCases...) {
		if seen[c] == 0 {
			missing = append(missing, c)
		}
		report = append(report, fmt.Sprintf("%6d  %s", seen[c], c))
	}
	t.Logf("cases reached in 400 random histories:\n%s", strings.Join(report, "\n"))
	if len(missing) > 0 {
		t.Errorf("the generator never reached: %s", strings.Join(missing, "; "))
	}
	// A Prune must remove something in a good share of the histories' prunes, or the
	// properties about what it removes and keeps would hold for want of trying. (About half
	// do; the others are the boundary draws that must remove nothing, also wanted.)
	if hit, all := seen["prune removes something"], seen["prune removes something"]+seen["prune nothing"]; all == 0 || hit*100 < all*35 {
		t.Errorf("only %d of %d prunes removed a subject, want at least 35%%", hit, all)
	}
	for _, ty := range events.AllTypes() {
		c, ok := caseAppending[ty]
		switch {
		case ty == events.TypeTaskSubmitRejected:
			// Appended only when an older build's undecided inbox row is taken in (today's
			// SubmitTx answers the conflict inside the transaction): no op of this build
			// issues it. postgres's TestSubmitTxUndecidedRowsOfAnOlderBuild and work's
			// TestConformanceAppendsEveryType hold its rule.
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
	events.TypeTaskExtended:        "extend current",
	events.TypeTaskReleased:        "release current",
	events.TypeTaskRetried:         "retry failed",
	events.TypeScheduleSet:         "set schedule new",
	events.TypeScheduleRemoved:     "remove schedule",
	events.TypeKindPolicySet:       "set kind policy",
}

var coverageCases = []string{
	"set schedule new", "set schedule replace", "remove schedule", "remove schedule unknown",
	"set schedule after its ticks", "claim submits a tick", "claim takes a tick it submitted",
	"claim submits several ticks of a schedule (catch-up all)", "claim submits the latest tick only (catch-up latest)",
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
	// part 2
	"extend current", "extend earlier than before", "extend after lease expiry", "extend with a cancel request",
	"extend stale (superseded)", "extend forged", "extend settled", "extend released", "extend unknown",
	"release current", "release into the future", "release with RunAt not after now", "release without RunAt",
	"release cancel-requested", "release stale (superseded)", "release forged", "release settled",
	"release repeated", "release unknown", "completion wake canceled by release",
	"claim after release", "claim after extension",
	"claim kinds", "claim kinds empty", "claim kinds skips other kinds", "claim kinds cut by limit",
	"claim kinds redelivery", "claim kinds of a kind nobody submits",
	"tasks listed", "tasks filtered", "tasks after a cursor", "tasks after a foreign task",
	"tasks after an unknown id", "tasks cut by limit",
	"settle and claim finish", "settle and claim release", "settle and claim stale settle",
	"settle and claim claims", "settle and claim mixed results", "settle and claim claims a task it released",
	// part 3
	"claim session wakes", "claim session wakes empty", "claim session wakes skips other sessions",
	"claim session wakes redelivery", "claim session wakes cut by limit", "claim session wakes of a session named twice",
	"retry failed", "retry canceled", "retry unfinished or succeeded", "retry with its completion wake unacknowledged",
	"retry foreign or pruned", "retry unknown", "retry again with an earlier wake still unacknowledged",
	"ack an earlier completion wake after its task's retry",
	// postgres.SubmitTx (generated only on a backend with one)
	"submit tx new", "submit tx repeat (same intent)", "submit tx conflict (other intent)", "submit tx rolled back",
	"submit tx keyless", "submit tx keyless rolled back",
	"submit many", "submit many with a key repeated in the batch", "submit many with a conflict",
	"set kind policy", "set kind policy zero", "set kind policy per session", "claim held back by a session's limit",
}

// classify names the cases op o exercises when applied to m (giving n).
func classify(o op, m, n *model) []string {
	e := n.exp
	var c []string
	add := func(s ...string) { c = append(c, s...) }
	switch o := o.(type) {
	case SetScheduleOp, RemoveScheduleOp:
		classifySchedule(add, o, m, e)
	case RetryOp:
		classifyRetry(add, o, m, e)
	case SubmitTxOp:
		classifySubmitTx(add, o, m, e)
	case SetPolicyOp:
		classifySetPolicy(add, o)
	case SubmitManyOp:
		classifySubmitMany(add, o, e)
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
		if m.heldBackBySession(o.Limit) {
			add("claim held back by a session's limit")
		}
		for _, cl := range e.claims {
			if cl.h >= len(m.tasks) {
				continue // a tick's task the claim submitted (classifyTicks)
			}
			if t := m.tasks[cl.h]; t.state == mPending && t.attempts > 0 {
				add("claim after release")
			}
			if cl.expired {
				add("claim redelivery after lease expiry")
				if m.tasks[cl.h].extended {
					add("claim after extension")
				}
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
			if m.wakes[o.W].detached {
				add("ack an earlier completion wake after its task's retry")
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
	case ExtendOp:
		switch {
		case o.T < 0:
			add("extend unknown")
		case e.err == errStale && o.Forged:
			add("extend forged")
		case e.err == errStale && m.tasks[o.T].state.terminal():
			add("extend settled")
		case e.err == errStale && m.tasks[o.T].state == mPending:
			add("extend released")
		case e.err == errStale:
			add("extend stale (superseded)")
		default:
			add("extend current")
			was := m.tasks[o.T]
			if n.tasks[o.T].leaseExp < was.leaseExp {
				add("extend earlier than before")
			}
			if was.leaseExp <= m.now {
				add("extend after lease expiry")
			}
			if was.cancelReq {
				add("extend with a cancel request")
			}
		}
	case ReleaseOp:
		classifyRelease(add, o.T, o.Forged, o.HasRunAt, o.RunAt, m, e)
	case ClaimSessionWakesOp:
		if len(e.claims) == 0 {
			add("claim session wakes empty")
		} else {
			add("claim session wakes")
		}
		if o.Dup {
			add("claim session wakes of a session named twice")
		}
		var mine int
		for _, c := range m.availableWakes() {
			if o.Mask&(1<<m.wakes[c.h].sess) != 0 {
				mine++
			} else {
				add("claim session wakes skips other sessions")
			}
		}
		if mine > o.Limit {
			add("claim session wakes cut by limit")
		}
		for _, cl := range e.claims {
			if cl.expired {
				add("claim session wakes redelivery")
				break
			}
		}
	case ClaimKindsOp:
		if len(e.claims) == 0 {
			add("claim kinds empty")
		} else {
			add("claim kinds")
		}
		if o.Mask&4 != 0 {
			add("claim kinds of a kind nobody submits")
		}
		var mine int
		for _, c := range m.eligibleTasks() {
			if o.Mask&(1<<m.tasks[c.h].kind) != 0 {
				mine++
			} else {
				add("claim kinds skips other kinds")
			}
		}
		if len(e.claims) == o.Limit && mine > o.Limit {
			add("claim kinds cut by limit")
		}
		for _, cl := range e.claims {
			if cl.expired {
				add("claim kinds redelivery")
			}
		}
	case TasksOp:
		switch {
		case e.err == errNotFound && o.After == -2:
			add("tasks after an unknown id")
		case e.err == errNotFound:
			add("tasks after a foreign task")
		default:
			if len(e.listed) > 0 {
				add("tasks listed")
				if o.States != 0 || o.Kinds != 0 {
					add("tasks filtered")
				}
			}
			if o.After >= 0 {
				add("tasks after a cursor")
			}
			if len(e.listed) == o.Limit {
				add("tasks cut by limit")
			}
		}
	case SettleAndClaimOp:
		ok, bad := false, false
		released := map[int]bool{}
		for i, st := range o.Settles {
			sub := e.settles[i]
			if sub.err != errNone {
				bad = true
				if sub.err == errStale {
					add("settle and claim stale settle")
				}
				continue
			}
			ok = true
			if st.Release {
				add("settle and claim release")
				released[st.T] = true
			} else {
				add("settle and claim finish")
			}
		}
		if ok && bad {
			add("settle and claim mixed results")
		}
		if len(e.claims) > 0 {
			add("settle and claim claims")
		}
		for _, cl := range e.claims {
			if released[cl.h] {
				add("settle and claim claims a task it released")
			}
		}
	case InvalidOp:
		add("invalid")
	case ReopenOp:
		add("reopen")
	case CrashOp:
		add("crash")
	case PruneOp:
		classifyPrune(add, o, m, n)
	}
	classifyAfterPrune(add, o, m, n)
	for _, w := range e.newCW {
		t := m.tasks[n.wakes[w].task]
		if _, ok := o.(ReleaseOp); ok {
			add("completion wake canceled by release")
		}
		switch st := outcomePool[n.wakes[w].outcome].state; {
		case st == mCanceled && t.state == mPending:
			add("completion wake canceled pending")
		case st == mCanceled:
			add("completion wake canceled running")
		default:
			add("completion wake " + st.String())
		}
	}
	classifyTicks(add, m, n)
	return c
}

// classifyRelease names the cases of a release of delivery (h, attempt) applied to m.
func classifyRelease(add func(...string), h int, forged, hasRunAt bool, runAt int64, m *model, e expect) {
	switch {
	case h < 0:
		add("release unknown")
	case e.err == errStale && forged:
		add("release forged")
	case e.err == errStale && m.tasks[h].state.terminal():
		add("release settled")
	case e.err == errStale && m.tasks[h].state == mPending:
		add("release repeated")
	case e.err == errStale:
		add("release stale (superseded)")
	case m.tasks[h].cancelReq:
		add("release cancel-requested")
	default:
		add("release current")
		switch {
		case !hasRunAt:
			add("release without RunAt")
		case runAt > m.now:
			add("release into the future")
		default:
			add("release with RunAt not after now")
		}
	}
}
