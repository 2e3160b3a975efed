package projection

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/worklog/worklog/events"
)

// TestApplyDataDriven runs the scripts in testdata/apply, in the manner of etcd raft's
// interaction tests: each script applies events, one a line, and shows what the fold said
// to each and the state it left, records and index entries. `go test ./projection -run
// DataDriven -rewrite` regenerates the expected output; read the diff before committing it.
//
// Directives:
//
//	apply         apply the events of the input, one a line (see parseEvent); print each
//	              one's result, then the state
//	state         print the state
//	set-attempts  task=ID attempts=N: set a pending task's attempt count directly, for the
//	              rule no history of a test's length reaches (attempts cannot grow past
//	              MaxUint32); also sets the reference history aside (see below)
//
// Each script runs against two states at once: a Mem, whose records Apply changes in place,
// and a Mem under copying, whose records it copies out and writes back as pebblelog's
// writer does. Both must answer every event alike and end equal. A rejected event must leave
// the state exactly as the accepted events before it made it (checked against a refold).
func TestApplyDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/apply", func(t *testing.T, path string) {
		s := &script{inPlace: NewMem(), copies: NewMem()}
		datadriven.RunTest(t, path, s.run)
	})
}

type script struct {
	inPlace, copies *Mem
	accepted        []events.Event // the events accepted so far
	edited          bool           // set-attempts changed the state: it is no longer their fold
}

func (s *script) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "apply":
		var out strings.Builder
		for _, line := range strings.Split(d.Input, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			last, _ := s.inPlace.LastSeq()
			ev, err := parseEvent(line, last+1)
			if err != nil {
				d.Fatalf(t, "%s: %v", line, err)
			}
			fmt.Fprintln(&out, s.apply(t, d, ev))
		}
		checkInvariants(t, s.inPlace)
		out.WriteString(render(s.inPlace))
		return out.String()
	case "state":
		return render(s.inPlace)
	case "prunable":
		// The retention index of both states (they must agree), one entry a line.
		var out strings.Builder
		_ = s.inPlace.ScanPrunable(math.MaxInt64, func(e PruneEntry) bool {
			what := "task"
			if e.Wake {
				what = "wake"
			}
			fmt.Fprintf(&out, "prunable %s %s from %d\n", what, e.ID, e.At)
			return true
		})
		var other strings.Builder
		_ = s.copies.ScanPrunable(math.MaxInt64, func(e PruneEntry) bool { fmt.Fprintf(&other, "%v", e); return true })
		var mine strings.Builder
		_ = s.inPlace.ScanPrunable(math.MaxInt64, func(e PruneEntry) bool { fmt.Fprintf(&mine, "%v", e); return true })
		if mine.String() != other.String() {
			d.Fatalf(t, "retention indexes differ: in place %s, through copies %s", mine.String(), other.String())
		}
		if out.Len() == 0 {
			return "prunable: (none)\n"
		}
		return out.String()
	case "set-attempts":
		var id string
		var n uint64
		d.ScanArgs(t, "task", &id)
		d.ScanArgs(t, "attempts", &n)
		for _, m := range []*Mem{s.inPlace, s.copies} {
			x := m.tasks[id]
			if x == nil || x.State != events.StatePending {
				d.Fatalf(t, "set-attempts: no pending task %s", id)
			}
			x.Attempts = uint32(n)
		}
		s.edited = true
		return render(s.inPlace)
	}
	d.Fatalf(t, "unknown directive %s", d.Cmd)
	return ""
}

// apply applies ev to both states and checks they agree; it returns the result line.
func (s *script) apply(t *testing.T, d *datadriven.TestData, ev events.Event) string {
	before := render(s.inPlace)
	err := Apply(s.inPlace, ev)
	cerr := Apply(copying{s.copies}, ev)
	if fmt.Sprint(err) != fmt.Sprint(cerr) {
		d.Fatalf(t, "seq %d: in place %v; through copies %v", ev.Head().Seq, err, cerr)
	}
	if diff := s.inPlace.Diff(s.copies); len(diff) > 0 {
		d.Fatalf(t, "seq %d: in place and through copies differ:\n%s", ev.Head().Seq, strings.Join(diff, "\n"))
	}
	taskID, wakeID := ev.Subject()
	head := fmt.Sprintf("seq %d %s %s", ev.Head().Seq, ev.Type(), taskID+wakeID)
	if err == nil {
		s.accepted = append(s.accepted, ev)
		return head + ": ok"
	}
	var ae *ApplyError
	if !errors.As(err, &ae) {
		d.Fatalf(t, "%s: %v is not an *ApplyError", head, err)
	}
	if render(s.inPlace) != before {
		d.Fatalf(t, "%s: the rejected event changed the state", head)
	}
	if !s.edited {
		ref := NewMem()
		for _, x := range s.accepted {
			if err := Apply(ref, x); err != nil {
				d.Fatalf(t, "refolding: %v", err)
			}
		}
		if diff := ref.Diff(s.inPlace); len(diff) > 0 {
			d.Fatalf(t, "%s: the rejected event changed the state:\n%s", head, strings.Join(diff, "\n"))
		}
	}
	return head + ": rejected: " + ae.Rule
}

// parseEvent reads one event: a verb, then key=value fields (values have no spaces). Every
// event takes seq= (default next, the sequence after the last applied), session= (default
// s1) and at= (default 0).
//
//	submit        task= kind= [input=] [run_at=] [key=] [on-completion]
//	claim         task= attempt= token= expires=
//	settle        task= attempt= token= outcome=succeeded|failed|canceled [summary=] [output=] [error=]
//	cancel        task=
//	extend        task= attempt= expires=
//	release       task= attempt= run_at= [reason=]
//	retry         task= attempts= run_at=
//	reject-settle task= attempt= reason=superseded|token_mismatch|not_claimed
//	wake          wake= [payload=] [key=] [reason=N]        a direct wake
//	done-wake     wake= task= outcome= [summary=] [output=] [error=]   a completion wake
//	wake-claim    wake= attempt= token= expires=
//	ack           wake= attempt= token=
//	reject-ack    wake= attempt= reason=
//	policy        kind= [paused] [max=] [rate=] [burst=]   session= defaults to none here
func parseEvent(line string, next uint64) (events.Event, error) {
	fields := strings.Fields(line)
	verb, args := fields[0], map[string]string{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			v = "true" // a flag
		}
		if _, dup := args[k]; dup {
			return nil, fmt.Errorf("%s given twice", k)
		}
		args[k] = v
	}
	p := &argParser{args: args}
	h := events.Header{Seq: p.uint("seq", next), SessionID: p.str("session", "s1"), At: p.int("at", 0)}
	var ev events.Event
	switch verb {
	case "submit":
		e := &events.TaskSubmitted{Header: h, TaskID: p.str("task", ""), Kind: p.str("kind", ""),
			Input: p.bytes("input"), IdempotencyKey: p.str("key", ""), WakeOnCompletion: p.flag("on-completion"),
			Priority: p.int("priority", 0)}
		if h := p.str("header", ""); h != "" { // header=name:value
			name, value, _ := strings.Cut(h, ":")
			e.Headers = map[string]string{name: value}
		}
		if _, ok := args["run_at"]; ok {
			e.HasRunAt, e.RunAt = true, p.int("run_at", 0)
		}
		ev = e
	case "claim":
		ev = &events.TaskClaimed{Header: h, TaskID: p.str("task", ""), Attempt: p.attempt(),
			LeaseToken: p.str("token", ""), LeaseExpiresAt: p.int("expires", 0)}
	case "settle":
		ev = &events.TaskSettled{Header: h, TaskID: p.str("task", ""), Attempt: p.attempt(),
			LeaseToken: p.str("token", ""), Outcome: p.outcome()}
	case "cancel":
		ev = &events.TaskCancelRequested{Header: h, TaskID: p.str("task", "")}
	case "extend":
		ev = &events.TaskExtended{Header: h, TaskID: p.str("task", ""), Attempt: p.attempt(), LeaseExpiresAt: p.int("expires", 0)}
	case "release":
		ev = &events.TaskReleased{Header: h, TaskID: p.str("task", ""), Attempt: p.attempt(), RunAt: p.int("run_at", 0),
			Reason: p.str("reason", "")}
	case "retry":
		n := p.uint("attempts", 0)
		if n > math.MaxUint32 {
			p.fail("attempts", fmt.Sprint(n), errors.New("out of range"))
		}
		ev = &events.TaskRetried{Header: h, TaskID: p.str("task", ""), Attempts: uint32(n), RunAt: p.int("run_at", 0)}
	case "reject-settle":
		ev = &events.TaskSettleRejected{Header: h, TaskID: p.str("task", ""), Attempt: p.attempt(), Reason: p.reason()}
	case "wake":
		ev = &events.WakeRecorded{Header: h, WakeID: p.str("wake", ""), Reason: events.WakeReason(p.uint("reason", 0)),
			Payload: p.bytes("payload"), IdempotencyKey: p.str("key", "")}
	case "done-wake":
		ev = &events.WakeRecorded{Header: h, WakeID: p.str("wake", ""), Reason: events.WakeTaskFinished,
			TaskID: p.str("task", ""), Outcome: p.outcome()}
	case "wake-claim":
		ev = &events.WakeClaimed{Header: h, WakeID: p.str("wake", ""), Attempt: p.attempt(),
			LeaseToken: p.str("token", ""), LeaseExpiresAt: p.int("expires", 0)}
	case "ack":
		ev = &events.WakeAcked{Header: h, WakeID: p.str("wake", ""), Attempt: p.attempt(), LeaseToken: p.str("token", "")}
	case "policy":
		if _, ok := args["session"]; !ok {
			h.SessionID = ""
		}
		ev = &events.KindPolicySet{Header: h, Kind: p.str("kind", ""), Paused: p.flag("paused"),
			MaxRunning: p.int("max", 0), Rate: p.float("rate"), Burst: p.int("burst", 0)}
	case "reject-ack":
		ev = &events.WakeAckRejected{Header: h, WakeID: p.str("wake", ""), Attempt: p.attempt(), Reason: p.reason()}
	default:
		return nil, fmt.Errorf("unknown event %q", verb)
	}
	if p.err != nil {
		return nil, p.err
	}
	for k := range args {
		if !p.used[k] {
			return nil, fmt.Errorf("%s takes no %s", verb, k)
		}
	}
	return ev, nil
}

// argParser reads an event's fields, remembering the first error and which fields it read.
type argParser struct {
	args map[string]string
	used map[string]bool
	err  error
}

func (p *argParser) get(k string) (string, bool) {
	if p.used == nil {
		p.used = map[string]bool{}
	}
	p.used[k] = true
	v, ok := p.args[k]
	return v, ok
}

func (p *argParser) fail(k, v string, err error) {
	if p.err == nil {
		p.err = fmt.Errorf("%s=%s: %v", k, v, err)
	}
}

func (p *argParser) str(k, def string) string {
	if v, ok := p.get(k); ok {
		return v
	}
	return def
}

func (p *argParser) bytes(k string) []byte {
	if v, ok := p.get(k); ok {
		return []byte(v)
	}
	return nil
}

func (p *argParser) flag(k string) bool { _, ok := p.get(k); return ok }

func (p *argParser) int(k string, def int64) int64 {
	v, ok := p.get(k)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		p.fail(k, v, err)
	}
	return n
}

func (p *argParser) float(k string) float64 {
	v, ok := p.get(k)
	if !ok {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		p.fail(k, v, err)
	}
	return f
}

func (p *argParser) uint(k string, def uint64) uint64 {
	v, ok := p.get(k)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		p.fail(k, v, err)
	}
	return n
}

func (p *argParser) attempt() uint32 {
	n := p.uint("attempt", 0)
	if n > math.MaxUint32 {
		p.fail("attempt", fmt.Sprint(n), errors.New("out of range"))
	}
	return uint32(n)
}

func (p *argParser) outcome() events.Outcome {
	o := events.Outcome{Summary: p.str("summary", ""), Output: p.bytes("output"), Error: p.str("error", "")}
	v, _ := p.get("outcome")
	for s := events.StatePending; s <= events.StateCanceled; s++ {
		if s.String() == v {
			o.State = s
			return o
		}
	}
	p.fail("outcome", v, errors.New("not a task state"))
	return o
}

func (p *argParser) reason() events.RejectReason {
	v, _ := p.get("reason")
	for _, r := range []events.RejectReason{events.RejectSuperseded, events.RejectTokenMismatch, events.RejectNotClaimed} {
		if r.String() == v {
			return r
		}
	}
	p.fail("reason", v, errors.New("not a rejection reason"))
	return 0
}

// render prints a state compactly: one line a record, fields that are zero left out (but
// for the few every record has), then the idempotency keys, the due index, each kind's due
// index (when it differs from the due index: several kinds) and counts, each session's task
// list (when there are several sessions), the wake index and the last sequence.
func render(m *Mem) string {
	var b strings.Builder
	for _, x := range m.Tasks() {
		fmt.Fprintf(&b, "task %s session=%s kind=%s %s attempts=%d", x.ID, x.SessionID, x.Kind, x.State, x.Attempts)
		opt(&b, "input", string(x.Input))
		if x.HasRunAt {
			fmt.Fprintf(&b, " run_at=%d", x.RunAt)
		}
		opt(&b, "key", x.IdempotencyKey)
		if x.Priority != 0 {
			fmt.Fprintf(&b, " priority=%d", x.Priority)
		}
		for _, k := range slices.Sorted(maps.Keys(x.Headers)) {
			fmt.Fprintf(&b, " header=%s:%s", k, x.Headers[k])
		}
		if x.WakeOnCompletion {
			b.WriteString(" on-completion")
		}
		if x.CancelRequested {
			fmt.Fprintf(&b, " cancel_at=%d", x.CancelRequestedAt)
		}
		if x.LeaseToken != "" || x.LeaseExpiresAt != 0 {
			fmt.Fprintf(&b, " lease=%s@%d", x.LeaseToken, x.LeaseExpiresAt)
		}
		if x.State.Terminal() {
			fmt.Fprintf(&b, " finished=%d", x.FinishedAt)
		}
		renderOutcome(&b, x.Outcome)
		opt(&b, "settled_by", x.SettledToken)
		opt(&b, "completion_wake", x.CompletionWakeID)
		if x.RejectedAttempt != 0 {
			fmt.Fprintf(&b, " rejected=%d", x.RejectedAttempt)
		}
		if x.AttemptsAtRetry != 0 {
			fmt.Fprintf(&b, " attempts_at_retry=%d", x.AttemptsAtRetry)
		}
		if x.UnackedEarlierWakes != 0 {
			fmt.Fprintf(&b, " unacked_earlier_wakes=%d", x.UnackedEarlierWakes)
		}
		fmt.Fprintf(&b, " scheduled=%d created=%d seq=%d/%d\n", x.ScheduledAt, x.CreatedAt, x.SubmitSeq, x.UpdatedSeq)
	}
	for _, x := range m.Wakes() {
		fmt.Fprintf(&b, "wake %s session=%s %s attempts=%d", x.ID, x.SessionID, x.Reason, x.Attempts)
		opt(&b, "payload", string(x.Payload))
		opt(&b, "key", x.IdempotencyKey)
		opt(&b, "task", x.TaskID)
		renderOutcome(&b, x.Outcome)
		if x.LeaseToken != "" || x.LeaseExpiresAt != 0 {
			fmt.Fprintf(&b, " lease=%s@%d", x.LeaseToken, x.LeaseExpiresAt)
		}
		if x.Acked {
			fmt.Fprintf(&b, " acked_by=%s", x.AckedToken)
		}
		if x.RejectedAttempt != 0 {
			fmt.Fprintf(&b, " rejected=%d", x.RejectedAttempt)
		}
		fmt.Fprintf(&b, " created=%d seq=%d/%d\n", x.CreatedAt, x.RecordSeq, x.UpdatedSeq)
	}
	renderKeys(&b, "task keys", m.taskKeys)
	renderKeys(&b, "wake keys", m.wakeKeys)
	renderIndex(&b, "due", scanner(m, IndexDue, ""))
	renderPart2(&b, m)
	renderIndex(&b, "available", scanner(m, IndexWakes, ""))
	renderPolicies(&b, m)
	fmt.Fprintf(&b, "last seq %d\n", m.lastSeq)
	return b.String()
}

// renderPolicies prints the kind policies, their buckets and the per-kind lease index, when
// there are any (so the scripts of other events are unchanged).
func renderPolicies(b *strings.Builder, m *Mem) {
	_ = m.KindPolicies(func(p *KindPolicy) bool {
		fmt.Fprintf(b, "policy %s paused=%t max=%d rate=%g burst=%d tokens=%g@%d seq=%d\n",
			p.Kind, p.Paused, p.MaxRunning, p.Rate, p.Burst, p.Tokens, p.TokensAt, p.SetSeq)
		return true
	})
	m.BuildIndexes()
	for _, k := range slices.Sorted(maps.Keys(m.idx[IndexKindLeases].parts)) {
		renderIndex(b, "leases "+k, func(_ int64, fn func(IndexEntry) bool) error {
			return ScanLeases(m, k, math.MinInt64, fn)
		})
	}
}

func opt(b *strings.Builder, k, v string) {
	if v != "" {
		fmt.Fprintf(b, " %s=%s", k, v)
	}
}

// renderOutcome prints a non-zero outcome (a pending task's zero outcome is left out).
func renderOutcome(b *strings.Builder, o events.Outcome) {
	if o.State == events.StatePending && o.Summary == "" && len(o.Output) == 0 && o.Error == "" {
		return
	}
	fmt.Fprintf(b, " outcome=%s", o.State)
	opt(b, "summary", o.Summary)
	opt(b, "output", string(o.Output))
	opt(b, "error", o.Error)
}

func renderKeys(b *strings.Builder, what string, keys map[sessionKey]string) {
	if len(keys) == 0 {
		return
	}
	var ks []string
	for k, id := range keys {
		ks = append(ks, fmt.Sprintf("%s/%s=%s", k.session, k.key, id))
	}
	sort.Strings(ks)
	fmt.Fprintf(b, "%s: %s\n", what, strings.Join(ks, " "))
}

func renderIndex(b *strings.Builder, what string, scan func(int64, func(IndexEntry) bool) error) {
	var es []string
	_ = scan(math.MaxInt64, func(e IndexEntry) bool {
		if e.Pri != 0 {
			es = append(es, fmt.Sprintf("p%d:%d/%d/%s", e.Pri, e.At, e.Seq, e.ID))
		} else {
			es = append(es, fmt.Sprintf("%d/%d/%s", e.At, e.Seq, e.ID))
		}
		return true
	})
	if len(es) == 0 {
		es = []string{"(empty)"}
	}
	fmt.Fprintf(b, "%s: %s\n", what, strings.Join(es, " "))
}

// renderPart2 prints the indexes of part 2. A kind's due index is printed only when there
// are several kinds (with one, it is the due index, and checkInvariants holds it so), and
// the session lists only when there are several sessions (with one, the records' order).
func renderPart2(b *strings.Builder, m *Mem) {
	var kinds, sessions []string
	_ = m.Counts(func(k string, _ events.TaskState, _ int64) bool {
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
		return true
	})
	if len(kinds) > 1 {
		for _, k := range kinds {
			renderIndex(b, "due "+k, func(at int64, fn func(IndexEntry) bool) error {
				return m.ScanIndex(IndexKindDue, k, math.MinInt64, at, fn)
			})
		}
	}
	var counts []string
	_ = m.Counts(func(k string, st events.TaskState, n int64) bool {
		counts = append(counts, fmt.Sprintf("%s/%s=%d", k, st, n))
		return true
	})
	if len(counts) > 0 {
		fmt.Fprintf(b, "counts: %s\n", strings.Join(counts, " "))
	}
	for _, x := range m.Tasks() {
		if !slices.Contains(sessions, x.SessionID) {
			sessions = append(sessions, x.SessionID)
		}
	}
	if len(sessions) > 1 {
		slices.Sort(sessions)
		for _, s := range sessions {
			var ids []string
			_ = m.ScanSessionTasks(s, 0, func(_ uint64, id string) bool { ids = append(ids, id); return true })
			fmt.Fprintf(b, "tasks of %s: %s\n", s, strings.Join(ids, " "))
		}
	}
}
