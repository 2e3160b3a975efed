package proptest

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leanovate/gopter"
	"github.com/leanovate/gopter/commands"
	"github.com/leanovate/gopter/gen"

	"github.com/worklog/worklog/work"
)

// --- knobs -------------------------------------------------------------------------------------

var seedFlag = flag.Int64("seed", 0, "seed of the property tests (0: take one from the clock); printed by every run")

const (
	// defaultRuns is the number of histories of TestQueueProperties: the budget knob, set
	// with WORKLOG_PROPTEST_RUNS. The other random tests run a fixed share of it. With the
	// defaults the whole package takes about 30-40 s on a 2-core machine.
	defaultRuns = 800
	// diffMemRuns and durableRuns are the histories of the in-memory differential test and
	// of each durable test (property and differential) at the default budget.
	diffMemRuns = 250
	durableRuns = 100
	// minLen and defaultMaxLen bound history lengths; gopter grows them from min to max
	// over a run. WORKLOG_PROPTEST_MAXLEN sets the max.
	minLen        = 5
	defaultMaxLen = 60
	// raceDivisor shrinks the budget under the race detector, which slows the queue ~10x.
	raceDivisor = 8
)

// envInt reads a positive integer from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// runsFor scales a test's default number of histories by WORKLOG_PROPTEST_RUNS (which is
// the number of TestQueueProperties histories; the others keep their proportion), and down
// under -race unless WORKLOG_PROPTEST_RUNS is set.
func runsFor(def int) int {
	n, set := envInt("WORKLOG_PROPTEST_RUNS", 0), true
	if n == 0 {
		n, set = defaultRuns, false
	}
	runs := def * n / defaultRuns
	if raceEnabled && !set {
		runs /= raceDivisor
	}
	return max(1, runs)
}

// skipVerify (WORKLOG_PROPTEST_SKIP_VERIFY=1) leaves out Queue.Verify after each step: only
// for the mutation check, to see whether the model's own properties catch a mutant that
// Verify would report first. Never set it otherwise: [replay] is one of the properties.
var skipVerify = os.Getenv("WORKLOG_PROPTEST_SKIP_VERIFY") != ""

func maxLen() int { return max(minLen+1, envInt("WORKLOG_PROPTEST_MAXLEN", defaultMaxLen)) }

// --- gopter glue -------------------------------------------------------------------------------

var commandType = reflect.TypeOf((*commands.Command)(nil)).Elem()

// cmd adapts an op to gopter's commands.Command. The system under test is a *system, or a
// *pair for differential tests.
type cmd struct{ op }

func (c cmd) String() string { return c.op.String() }

func (c cmd) PreCondition(st commands.State) bool { return c.op.valid(st.(*model)) }

func (c cmd) NextState(st commands.State) commands.State {
	m := st.(*model).clone()
	c.op.apply(m)
	return m
}

func (c cmd) Run(sut commands.SystemUnderTest) commands.Result {
	switch s := sut.(type) {
	case *system:
		s.tr.add(c.op, s.now)
		return s.execute(c.op)
	case *pair:
		s.tr.add(c.op, s.a.now)
		return &pairResult{a: s.a.execute(c.op), b: s.b.execute(c.op)}
	}
	panic(fmt.Sprintf("unknown system under test %T", sut))
}

func (c cmd) PostCondition(st commands.State, res commands.Result) *gopter.PropResult {
	m := st.(*model)
	var fails []string
	switch r := res.(type) {
	case *result:
		s := r.sys
		if !s.failed {
			fails = s.post(c.op, m, r)
		}
		s.tr.done(r.render(false), fails)
		s.failed = s.failed || len(fails) > 0
	case *pairResult:
		a, b := r.a.sys, r.b.sys
		if !a.failed {
			// The model checks run on both sides (they bind handles, which rendering needs);
			// the differential verdict is reported first.
			fa, fb := a.post(c.op, m, r.a), b.post(c.op, m, r.b)
			if oa, ob := r.a.render(true), r.b.render(true); oa != ob {
				fails = append(fails, fmt.Sprintf("[differential] the backends disagree:\n      %s: %s\n      %s: %s", a.name, oa, b.name, ob))
			}
			for _, f := range fa {
				fails = append(fails, f+" (on "+a.name+")")
			}
			for _, f := range fb {
				fails = append(fails, f+" (on "+b.name+")")
			}
		}
		out := r.a.render(false)
		if ob := r.b.render(false); ob != out {
			out = a.name + ": " + out + " | " + b.name + ": " + ob
		}
		a.tr.done(out, fails)
		a.failed = a.failed || len(fails) > 0
	}
	if len(fails) > 0 {
		return &gopter.PropResult{Status: gopter.PropFalse, Labels: fails}
	}
	return &gopter.PropResult{Status: gopter.PropTrue}
}

// pair runs every op on two backends, for the differential tests.
type pair struct {
	a, b *system
	tr   *trace
}

type pairResult struct{ a, b *result }

// trace is the record of one history as it ran, for the failure report.
type trace struct {
	backend string
	nSess   int
	steps   []traceStep
}

type traceStep struct {
	op    op
	at    int64
	out   string
	fails []string
}

func (t *trace) add(o op, now int64) { t.steps = append(t.steps, traceStep{op: o, at: now}) }

func (t *trace) done(out string, fails []string) {
	s := &t.steps[len(t.steps)-1]
	s.out, s.fails = out, fails
}

func (t *trace) failed() bool {
	for _, s := range t.steps {
		if len(s.fails) > 0 {
			return true
		}
	}
	return false
}

// harness implements commands.Commands over one backend, or two for a differential test.
type harness struct {
	backends []backendSpec
	// last is the trace of the last history that failed. gopter shrinks by re-running smaller
	// histories; the last one that failed is the shrunk, minimal one it reports.
	last *trace
}

func (h *harness) restartable() bool {
	for _, b := range h.backends {
		if b.restartable {
			return true
		}
	}
	return false
}

// inbox reports whether every backend of the harness takes SubmitTx submissions: only then
// are SubmitTxOps generated.
func (h *harness) inbox() bool {
	for _, b := range h.backends {
		if !b.inbox {
			return false
		}
	}
	return len(h.backends) > 0
}

func (h *harness) open(b backendSpec, tr *trace) *system {
	st, err := b.open()
	if err != nil {
		st = brokenStore{err}
	}
	return newSystem(b.name, st, tr)
}

func (h *harness) NewSystemUnderTest(initial commands.State) commands.SystemUnderTest {
	m := initial.(*model)
	tr := &trace{nSess: m.nSess}
	if len(h.backends) == 1 {
		tr.backend = h.backends[0].name
		return h.open(h.backends[0], tr)
	}
	tr.backend = h.backends[0].name + " vs " + h.backends[1].name
	return &pair{a: h.open(h.backends[0], tr), b: h.open(h.backends[1], tr), tr: tr}
}

func (h *harness) DestroySystemUnderTest(sut commands.SystemUnderTest) {
	var tr *trace
	switch s := sut.(type) {
	case *system:
		s.st.close()
		tr = s.tr
	case *pair:
		s.a.st.close()
		s.b.st.close()
		tr = s.tr
	}
	if tr.failed() {
		h.last = tr
	}
}

func (h *harness) GenInitialState() gopter.Gen {
	restartable, inbox := h.restartable(), h.inbox()
	return gen.IntRange(2, 3).Map(func(n int) *model {
		m := newModel(n, restartable)
		m.inbox = inbox
		return m
	})
}

func (h *harness) InitialPreCondition(commands.State) bool { return true }

func (h *harness) GenCommand(st commands.State) gopter.Gen {
	m := st.(*model)
	return func(p *gopter.GenParameters) *gopter.GenResult {
		return &gopter.GenResult{Result: cmd{genOp(p.Rng, m)}, ResultType: commandType, Shrinker: gopter.NoShrinker}
	}
}

// brokenStore stands for a backend that could not be opened: every op panics and the history
// fails at its first step with the error.
type brokenStore struct{ err error }

func (b brokenStore) queue() *work.Queue { panic(fmt.Sprintf("opening the backend failed: %v", b.err)) }
func (b brokenStore) reopen() error      { return b.err }
func (b brokenStore) crash() error       { return b.err }
func (b brokenStore) close()             {}

// --- running and reporting -----------------------------------------------------------------------

// checkHistories runs random histories on the harness's backends and reports a failure with
// its seed, the shrunk history and how to reproduce it.
func checkHistories(t *testing.T, h *harness, runs int) {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	params := gopter.DefaultTestParametersWithSeed(seed)
	params.MinSuccessfulTests = runs
	params.MinSize, params.MaxSize = minLen, maxLen()
	params.MaxShrinkCount = 2000
	params.Workers = 1
	repro := reproCommand(t.Name(), seed)
	t.Logf("seed %d: %d histories of %d to %d ops on %s; reproduce with: %s",
		seed, runs, params.MinSize, params.MaxSize, backendNames(h.backends), repro)

	props := gopter.NewProperties(params)
	props.Property(t.Name(), commands.Prop(h))
	var out bytes.Buffer
	start := time.Now()
	if props.Run(gopter.NewFormatedReporter(false, 1<<20, &out)) {
		t.Logf("passed in %v", time.Since(start).Round(time.Millisecond))
		return
	}
	status, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	if h.last == nil {
		t.Fatalf("property failed (seed %d) without a recorded history:\n%s\nreproduce with: %s", seed, out.String(), repro)
	}
	t.Fatalf("%s\n\nseed: %d\nreproduce with: %s\n\n%s\ngopter: %s", firstFailure(h.last), seed, repro, formatTrace(h.last), status)
}

func backendNames(bs []backendSpec) string {
	var n []string
	for _, b := range bs {
		n = append(n, b.name)
	}
	return strings.Join(n, " vs ")
}

func reproCommand(test string, seed int64) string {
	var env []string
	for _, v := range []string{"WORKLOG_PROPTEST_RUNS", "WORKLOG_PROPTEST_MAXLEN"} {
		if x := os.Getenv(v); x != "" {
			env = append(env, v+"="+x)
		}
	}
	cmd := fmt.Sprintf("go test ./proptest -run '^%s$' -seed %d", test, seed)
	if len(env) > 0 {
		cmd = strings.Join(env, " ") + " " + cmd
	}
	return cmd
}

func firstFailure(tr *trace) string {
	for i, s := range tr.steps {
		if len(s.fails) > 0 {
			return fmt.Sprintf("property violated at step %d of %d (%s): %s", i+1, len(tr.steps), s.op, s.fails[0])
		}
	}
	return "no failure"
}

// formatTrace prints a history as a numbered list of ops with the model time, what the
// system returned and the violations, then as JSON for testdata/regress.
func formatTrace(tr *trace) string {
	var b strings.Builder
	fmt.Fprintf(&b, "shrunk history: %d ops on %s, sessions %s\n", len(tr.steps), tr.backend, strings.Join(sessionNames[:tr.nSess], " "))
	for i, s := range tr.steps {
		fmt.Fprintf(&b, "  %3d. [t=%s] %s\n        -> %s\n", i+1, showTime(s.at), s.op, s.out)
		for _, f := range s.fails {
			fmt.Fprintf(&b, "        VIOLATION %s\n", f)
		}
	}
	ops := make([]op, len(tr.steps))
	for i, s := range tr.steps {
		ops[i] = s.op
	}
	fmt.Fprintf(&b, "\nto keep it as a regression test, save this as proptest/testdata/regress/NAME.json\n(add \"skip\": \"known bug: ...\" while it fails):\n%s", encodeHistory(historyFile{Sessions: tr.nSess}, ops))
	return b.String()
}

// --- histories as files --------------------------------------------------------------------------

// historyFile is a saved history (testdata/regress/*.json), replayed on every backend by
// TestRegressions. Skip, when set, makes the replay skip with that reason.
type historyFile struct {
	Comment  string   `json:"comment,omitempty"`
	Skip     string   `json:"skip,omitempty"`
	Sessions int      `json:"sessions"`
	Ops      []opJSON `json:"ops"`
}

type opJSON struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
	Text string          `json:"text,omitempty"` // the readable form; ignored when loading
}

var opTypes = map[string]reflect.Type{
	"submit":     reflect.TypeOf(SubmitOp{}),
	"read":       reflect.TypeOf(ReadOp{}),
	"cancel":     reflect.TypeOf(CancelOp{}),
	"claim":      reflect.TypeOf(ClaimOp{}),
	"finish":     reflect.TypeOf(FinishOp{}),
	"wake":       reflect.TypeOf(WakeOp{}),
	"claimWakes": reflect.TypeOf(ClaimWakesOp{}),
	"ack":        reflect.TypeOf(AckOp{}),
	"advance":    reflect.TypeOf(AdvanceOp{}),
	"reopen":     reflect.TypeOf(ReopenOp{}),
	"crash":      reflect.TypeOf(CrashOp{}),
	"invalid":    reflect.TypeOf(InvalidOp{}),

	"extend":         reflect.TypeOf(ExtendOp{}),
	"release":        reflect.TypeOf(ReleaseOp{}),
	"claimKinds":     reflect.TypeOf(ClaimKindsOp{}),
	"tasks":          reflect.TypeOf(TasksOp{}),
	"settleAndClaim": reflect.TypeOf(SettleAndClaimOp{}),

	"claimSessionWakes": reflect.TypeOf(ClaimSessionWakesOp{}),

	"prune": reflect.TypeOf(PruneOp{}),

	"retry":      reflect.TypeOf(RetryOp{}),
	"submitMany": reflect.TypeOf(SubmitManyOp{}),

	"setSchedule":    reflect.TypeOf(SetScheduleOp{}),
	"removeSchedule": reflect.TypeOf(RemoveScheduleOp{}),
	"submitTx":       reflect.TypeOf(SubmitTxOp{}),
	"setPolicy":      reflect.TypeOf(SetPolicyOp{}),
}

func opName(o op) string {
	for n, t := range opTypes {
		if reflect.TypeOf(o) == t {
			return n
		}
	}
	panic(fmt.Sprintf("unregistered op %T", o))
}

func encodeHistory(f historyFile, ops []op) string {
	var b strings.Builder
	b.WriteString("{\n")
	if f.Comment != "" {
		fmt.Fprintf(&b, "  \"comment\": %s,\n", mustJSON(f.Comment))
	}
	if f.Skip != "" {
		fmt.Fprintf(&b, "  \"skip\": %s,\n", mustJSON(f.Skip))
	}
	fmt.Fprintf(&b, "  \"sessions\": %d,\n  \"ops\": [\n", f.Sessions)
	for i, o := range ops {
		sep := ","
		if i == len(ops)-1 {
			sep = ""
		}
		args := mustJSON(o)
		if args == "{}" {
			fmt.Fprintf(&b, "    {\"op\": %q, \"text\": %s}%s\n", opName(o), mustJSON(o.String()), sep)
			continue
		}
		fmt.Fprintf(&b, "    {\"op\": %q, \"args\": %s, \"text\": %s}%s\n", opName(o), args, mustJSON(o.String()), sep)
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

func mustJSON(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return strings.TrimSpace(buf.String())
}

func decodeHistory(data []byte) (historyFile, []op, error) {
	var f historyFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, nil, err
	}
	ops := make([]op, len(f.Ops))
	for i, j := range f.Ops {
		t, ok := opTypes[j.Op]
		if !ok {
			return f, nil, fmt.Errorf("op %d: unknown op %q", i+1, j.Op)
		}
		v := reflect.New(t)
		if len(j.Args) > 0 {
			d := json.NewDecoder(bytes.NewReader(j.Args))
			d.DisallowUnknownFields()
			if err := d.Decode(v.Interface()); err != nil {
				return f, nil, fmt.Errorf("op %d (%s): %v", i+1, j.Op, err)
			}
		}
		ops[i] = v.Elem().Interface().(op)
	}
	if f.Sessions < 1 || f.Sessions > len(sessionNames) {
		return f, nil, fmt.Errorf("sessions must be 1 to %d", len(sessionNames))
	}
	return f, ops, nil
}

func loadHistories(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = data
	}
	return out
}

// replay runs a fixed history on a backend with every check, and fails t with the trace if a
// property is violated.
func replay(t *testing.T, b backendSpec, nSess int, ops []op) {
	t.Helper()
	h := &harness{backends: []backendSpec{b}}
	m := newModel(nSess, b.restartable)
	m.inbox = b.inbox
	m.exp = expect{task: -1, wake: -1}
	sut := h.NewSystemUnderTest(m)
	s := sut.(*system)
	defer h.DestroySystemUnderTest(sut)
	for i, o := range ops {
		if !o.valid(m) {
			t.Fatalf("op %d (%s) names a handle or delivery that does not exist at that point", i+1, o)
		}
		c := cmd{o}
		res := c.Run(sut)
		m = c.NextState(m).(*model)
		c.PostCondition(m, res)
	}
	if s.tr.failed() {
		t.Fatalf("%s\n\n%s", firstFailure(s.tr), formatTrace(s.tr))
	}
}
