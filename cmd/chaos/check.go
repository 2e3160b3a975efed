package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// The checks, and how each is made:
//
//   - porcupine (linearizability): a key's submits are a register (keyModel: the first
//     submit of a key decides its task and intent; every acknowledged repeat returns that task,
//     a repeat with another intent conflicts naming it); one task's handler runs, and all
//     handler runs of the kind with MaxRunning 1, are a mutex (mutexModel: a run holds it from
//     its start to its last step, less the spans its process was stopped, each span shrunk by
//     half the tolerated margin at both ends, so two runs that overlap by more than the
//     margin cannot be linearized).
//   - direct, over the histories and the final log: an acknowledged submit, finish and
//     acknowledgment is in the log; a submit or finish that definitely failed is not; a task
//     is settled only by the delivery that holds its current claim, and again only after a
//     retry; nothing is claimed under another claim's unexpired lease, nor after it was
//     settled or acknowledged; a kind's claims never leave more than MaxRunning unexpired leases at the claim's
//     time; every wake not acknowledged in the log is claimable at the end; Verify passes.
type anomaly struct{ what, detail string }

type op struct{ inv, done *rec }

type interval struct {
	task, kind, proc string
	attempt          uint32
	start, end       int64
	open             bool
}

func (c *cluster) check(ctx context.Context, res result) result {
	recs, err := readHistories(c.dir)
	if err != nil {
		res.err = err
		return res
	}
	q, err := c.openFinal(ctx)
	if err != nil {
		res.err = fmt.Errorf("final open: %w", err)
		return res
	}
	var anomalies []anomaly
	add := func(what, f string, a ...any) { anomalies = append(anomalies, anomaly{what, fmt.Sprintf(f, a...)}) }
	if err := q.Verify(ctx); err != nil {
		add("verify", "%v", err)
	}
	var log []events.Event
	if err := q.ReadLog(ctx, 0, func(e events.Event) error { log = append(log, e); return nil }); err != nil {
		res.err = fmt.Errorf("final log read: %w", err)
		q.Close()
		return res
	}
	// Every wake the log holds unacknowledged must be delivered again: claim them all at a
	// time past every lease.
	claimable := map[string]bool{}
	far := time.Now().Add(time.Hour)
	for {
		ds, err := q.ClaimWakesAt(ctx, far, time.Minute, 1000)
		if err != nil {
			add("final-claim", "ClaimWakesAt: %v", err)
			break
		}
		if len(ds) == 0 {
			break
		}
		for _, d := range ds {
			claimable[d.Wake.ID] = true
		}
	}
	q.Close()

	// Operations by process and number; the end of each process (for handler runs that
	// were cut by a kill).
	ops := map[string]*op{}
	var order []string
	procEnd := map[string]int64{}     // c2.1 → when it was killed or ended
	stoppedAt := map[string]int64{}   // c2.1 → the SIGSTOP in force, if any
	paused := map[string][][2]int64{} // c2.1 → its SIGSTOP..SIGCONT spans
	var last int64
	for i := range recs {
		r := &recs[i]
		if r.At > last {
			last = r.At
		}
		switch r.T {
		case "invoke":
			k := fmt.Sprintf("%s/%d", r.P, r.I)
			ops[k] = &op{inv: r}
			order = append(order, k)
		case "ok", "fail", "info":
			if o := ops[fmt.Sprintf("%s/%d", r.P, r.I)]; o != nil {
				o.done = r
			}
		case "nemesis":
			switch r.F {
			case "stop":
				if _, ok := stoppedAt[r.Target]; !ok {
					stoppedAt[r.Target] = r.At
				}
			case "cont":
				if s, ok := stoppedAt[r.Target]; ok {
					paused[r.Target] = append(paused[r.Target], [2]int64{s, r.At})
					delete(stoppedAt, r.Target)
				}
			case "crash":
				add("process-crash", "%s ended by itself (%s): see %s.log", r.Target, r.Err, r.Target)
			case "error":
				add("nemesis-error", "%s", r.Err)
			case "kill", "exit":
				if _, ok := procEnd[r.Target]; !ok {
					procEnd[r.Target] = r.At
					if s, ok := stoppedAt[r.Target]; ok {
						procEnd[r.Target] = s // it took no step after it was stopped
					}
				}
			}
		}
	}
	res.ops = len(order)
	if f, err := os.Create(c.dir + "/history.merged"); err == nil { // the merged history
		enc := json.NewEncoder(f)
		for i := range recs {
			enc.Encode(&recs[i])
		}
		f.Close()
	}

	// The log, indexed.
	submittedBy := map[string]string{} // op id → task
	taskOp := map[string]string{}      // task → op id
	taskKind := map[string]string{}
	settled := map[[2]string]bool{} // (task, attempt)
	claimed := map[[2]string]bool{}
	acked := map[[2]string]bool{}
	recorded := map[string]bool{}
	ackedWake := map[string]bool{}
	wakeLease := map[string]int64{} // wake → its current lease's expiry
	type tstate struct {
		attempt  uint32
		held     bool // a claim not settled nor released
		terminal bool
		exp      int64
	}
	ts := map[string]*tstate{}
	for _, e := range log {
		switch e := e.(type) {
		case *events.TaskSubmitted:
			if op := e.Headers["op"]; op != "" {
				submittedBy[op] = e.TaskID
				taskOp[e.TaskID] = op
			}
			taskKind[e.TaskID] = e.Kind
			ts[e.TaskID] = &tstate{}
		case *events.TaskClaimed:
			claimed[[2]string{e.TaskID, fmt.Sprint(e.Attempt)}] = true
			s := ts[e.TaskID]
			if s == nil {
				add("log", "seq %d: a claim of task %s, never submitted", e.Seq, e.TaskID)
				continue
			}
			if kind := taskKind[e.TaskID]; kind == kindLimited || kind == kindRunOne {
				limit := limitedMax
				if kind == kindRunOne {
					limit = 1
				}
				n := 0
				for id, o := range ts {
					if id != e.TaskID && taskKind[id] == kind && o.held && o.exp > e.At {
						n++
					}
				}
				if n >= limit {
					add("max-running", "seq %d: claim of %s (%s) at %d with %d leases of the kind unexpired (MaxRunning %d)",
						e.Seq, e.TaskID, kind, e.At, n, limit)
				}
			}
			if s.held && s.exp > e.At {
				add("claimed-while-leased", "seq %d: task %s claimed (attempt %d) at %d under attempt %d's lease, unexpired until %d",
					e.Seq, e.TaskID, e.Attempt, e.At, s.attempt, s.exp)
			}
			if s.terminal {
				add("claimed-when-terminal", "seq %d: task %s claimed (attempt %d) after it was settled or canceled", e.Seq, e.TaskID, e.Attempt)
			}
			s.attempt, s.held, s.exp = e.Attempt, true, e.LeaseExpiresAt
		case *events.TaskExtended:
			if s := ts[e.TaskID]; s != nil {
				s.exp = e.LeaseExpiresAt
			}
		case *events.TaskReleased:
			if s := ts[e.TaskID]; s != nil {
				s.held = false
			}
		case *events.TaskSettled:
			settled[[2]string{e.TaskID, fmt.Sprint(e.Attempt)}] = true
			s := ts[e.TaskID]
			switch {
			case s == nil:
				add("log", "seq %d: a settle of task %s, never submitted", e.Seq, e.TaskID)
				continue
			case s.terminal:
				add("settled-twice", "seq %d: task %s settled again (attempt %d) without a retry", e.Seq, e.TaskID, e.Attempt)
			case !s.held || s.attempt != e.Attempt:
				add("settled-by-non-holder", "seq %d: task %s settled by attempt %d; the current claim is attempt %d (held %v)",
					e.Seq, e.TaskID, e.Attempt, s.attempt, s.held)
			}
			s.terminal, s.held = true, false
		case *events.TaskCancelRequested:
			// A pending task is canceled at once; a running one keeps its claim.
			if s := ts[e.TaskID]; s != nil && !s.held {
				s.terminal = true
			}
		case *events.TaskRetried:
			if s := ts[e.TaskID]; s != nil {
				s.terminal, s.held = false, false
			}
		case *events.WakeRecorded:
			recorded[e.WakeID] = true
		case *events.WakeClaimed:
			if exp, ok := wakeLease[e.WakeID]; ok && exp > e.At {
				add("wake-claimed-while-leased", "seq %d: wake %s claimed (attempt %d) at %d under a lease unexpired until %d",
					e.Seq, e.WakeID, e.Attempt, e.At, exp)
			}
			if ackedWake[e.WakeID] {
				add("wake-claimed-after-ack", "seq %d: wake %s claimed (attempt %d) after its acknowledgment", e.Seq, e.WakeID, e.Attempt)
			}
			wakeLease[e.WakeID] = e.LeaseExpiresAt
		case *events.WakeAcked:
			acked[[2]string{e.WakeID, fmt.Sprint(e.Attempt)}] = true
			ackedWake[e.WakeID] = true
		}
	}
	for id := range recorded {
		if !ackedWake[id] && !claimable[id] {
			add("wake-lost", "wake %s is not acknowledged and is not delivered again", id)
		}
	}
	for id := range claimable {
		if ackedWake[id] {
			add("wake-redelivered", "wake %s was acknowledged and is delivered again", id)
		}
	}

	// The histories against the log.
	finishOK := map[[2]string]bool{}
	for _, k := range order {
		o := ops[k]
		if o.done != nil && o.inv.F == "finish" && o.done.T != "fail" {
			finishOK[[2]string{o.inv.Task, fmt.Sprint(o.inv.Attempt)}] = true
		}
	}
	for _, k := range order {
		o := ops[k]
		t := "info"
		if o.done != nil {
			t = o.done.T
		}
		in := o.inv
		switch in.F {
		case "submit":
			opID := fmt.Sprintf("%s/%d", in.P, in.I)
			switch t {
			case "ok":
				task := o.done.Task
				if taskKind[task] == "" {
					add("submit-lost", "%s: acknowledged submit of %s is not in the log", opID, task)
				} else if in.Key == "" && submittedBy[opID] != task {
					add("submit-wrong-task", "%s: acknowledged task %s, the log's task of this submit is %q", opID, task, submittedBy[opID])
				}
			case "fail":
				if id, ok := submittedBy[opID]; ok {
					add("failed-submit-present", "%s: failed (%s) but the log holds its task %s", opID, o.done.Err, id)
				}
			}
		case "finish":
			key := [2]string{in.Task, fmt.Sprint(in.Attempt)}
			switch t {
			case "ok":
				if !settled[key] {
					add("finish-lost", "%s/%d: acknowledged finish of %s attempt %d is not in the log", in.P, in.I, in.Task, in.Attempt)
				}
			case "fail":
				if settled[key] && !finishOK[key] && o.done.Err == work.ErrStaleDelivery.Error() {
					add("failed-finish-present", "%s/%d: finish of %s attempt %d failed (%s), the log settles it",
						in.P, in.I, in.Task, in.Attempt, o.done.Err)
				}
			}
		case "claim":
			if t == "ok" {
				for _, cl := range o.done.Claims {
					if !claimed[[2]string{cl.Task, fmt.Sprint(cl.Attempt)}] {
						add("claim-lost", "%s/%d: acknowledged claim of %s attempt %d is not in the log", in.P, in.I, cl.Task, cl.Attempt)
					}
				}
			}
		case "ack":
			if t == "ok" && !acked[[2]string{in.Wake, fmt.Sprint(in.Attempt)}] {
				add("ack-lost", "%s/%d: acknowledged ack of wake %s attempt %d is not in the log", in.P, in.I, in.Wake, in.Attempt)
			}
		case "wake":
			if t == "ok" && !recorded[o.done.Wake] {
				add("wake-request-lost", "%s/%d: acknowledged wake %s is not in the log", in.P, in.I, o.done.Wake)
			}
		}
	}

	// porcupine: keys.
	var keyOps []porcupine.Operation
	clients := map[string]int{}
	cid := func(p string) int {
		if n, ok := clients[p]; ok {
			return n
		}
		clients[p] = len(clients)
		return clients[p]
	}
	// An unknown submit invoked after a key had its task can change nothing: left out, it
	// spares porcupine a never-returning operation (many of them make its search long).
	decided := map[string]int64{}
	for _, k := range order {
		o := ops[k]
		if o.inv.F == "submit" && o.inv.Key != "" && o.done != nil && (o.done.T == "ok" || o.done.Err == work.ErrIdempotencyConflict.Error()) {
			key := o.inv.Sess + "/" + o.inv.Key
			if d, ok := decided[key]; !ok || o.done.At < d {
				decided[key] = o.done.At
			}
		}
	}
	for _, k := range order {
		o := ops[k]
		if o.inv.F != "submit" || o.inv.Key == "" {
			continue
		}
		if d, ok := decided[o.inv.Sess+"/"+o.inv.Key]; ok && o.inv.At > d && (o.done == nil || o.done.T == "info") {
			continue
		}
		t, ret := "info", last+1
		var out keyOut
		if o.done != nil {
			t = o.done.T
			if t != "info" {
				ret = o.done.At
			}
			out.task = o.done.Task
			out.conflict = o.done.Err == work.ErrIdempotencyConflict.Error()
		}
		if t == "fail" && !out.conflict {
			continue // it did not happen (checked above against the log)
		}
		out.unknown = t == "info"
		keyOps = append(keyOps, porcupine.Operation{ClientId: cid(o.inv.P),
			Input: keyIn{key: o.inv.Sess + "/" + o.inv.Key, intent: o.inv.Intent}, Call: o.inv.At,
			Output: out, Return: ret})
	}
	anomalies = append(anomalies, c.porcupine("keys", keyModelOf(), keyOps)...)

	// porcupine: handler runs.
	var runs []interval
	open := map[string]*interval{}
	groupProc := func(p string) string {
		if c.backend == "pebble" { // gN.I runs in the owning process c0.I
			return "c0" + p[strings.IndexByte(p, '.'):]
		}
		return p
	}
	for i := range recs {
		r := &recs[i]
		k := fmt.Sprintf("%s/%s/%d", r.P, r.Task, r.Attempt)
		switch r.T {
		case "hstart":
			open[k] = &interval{task: r.Task, kind: r.Kind, proc: r.P, attempt: r.Attempt, start: r.At}
		case "hend":
			if iv := open[k]; iv != nil {
				iv.end = r.At
				if r.State != "nostep" {
					runs = append(runs, *iv)
				}
				delete(open, k)
			}
		}
	}
	for _, iv := range open {
		end, ok := procEnd[groupProc(iv.proc)]
		if !ok {
			end = last
		}
		iv.end, iv.open = end, true
		runs = append(runs, *iv)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].start < runs[j].start })
	margin := c.cfg.margin.Nanoseconds()
	var runOps []porcupine.Operation
	for n, iv := range runs {
		who := fmt.Sprintf("%s#%d", iv.proc, iv.attempt)
		// A run holds the mutex while its process executes: the spans its process was
		// stopped (SIGSTOP) are cut out, since a stopped handler does nothing; what it does
		// after SIGCONT counts again.
		for _, seg := range cut([2]int64{iv.start, iv.end}, paused[groupProc(iv.proc)]) {
			// Shrunk by half the margin at each end, two runs still overlap only when they
			// overlapped by more than the margin.
			acq, rel := seg[0]+margin/2, seg[1]-margin/2
			if rel <= acq+1 {
				continue
			}
			sv := iv
			sv.start, sv.end = seg[0], seg[1]
			for _, part := range []string{"task " + iv.task, "kind " + iv.kind} {
				if strings.HasPrefix(part, "kind ") && iv.kind != kindRunOne {
					continue
				}
				runOps = append(runOps,
					porcupine.Operation{ClientId: cid(iv.proc), Input: mutexIn{part: part, who: who, acquire: true, run: n},
						Call: acq, Output: sv, Return: acq + 1},
					porcupine.Operation{ClientId: cid(iv.proc), Input: mutexIn{part: part, who: who, run: n},
						Call: rel, Output: sv, Return: rel + 1})
			}
		}
	}
	anomalies = append(anomalies, c.porcupine("runs", mutexModel(), runOps)...)

	res.anomalies = len(anomalies)
	counts := map[string]int{}
	for _, k := range order {
		o := ops[k]
		t := "info"
		if o.done != nil {
			t = o.done.T
		}
		counts[o.inv.F+" "+t]++
	}
	var nem int
	for i := range recs {
		if r := &recs[i]; r.T == "nemesis" && r.F != "start" && r.F != "exit" && r.F != "term" && r.F != "heal" && r.F != "cont" && r.F != "pg-start" {
			nem++
		}
	}
	fmt.Printf("%s: checked %d log events, %d keyed submits in %d keys, %d handler runs, %d wakes; %d faults; "+
		"submits ok/fail/unknown %d/%d/%d, finishes %d/%d/%d, claims %d/%d/%d\n",
		c.backend, len(log), len(keyOps), len(decided), len(runs), len(recorded), nem,
		counts["submit ok"], counts["submit fail"], counts["submit info"],
		counts["finish ok"], counts["finish fail"], counts["finish info"],
		counts["claim ok"], counts["claim fail"], counts["claim info"])
	if len(anomalies) > 0 {
		f, _ := os.Create(c.dir + "/anomalies.txt")
		for i, a := range anomalies {
			line := fmt.Sprintf("anomaly %s: %s", a.what, a.detail)
			fmt.Fprintln(f, line)
			if i < 10 {
				fmt.Printf("%s: %s\n", c.backend, line)
			}
		}
		f.Close()
	}
	return res
}

// porcupine checks ops against m, partition by partition; each illegal partition is an
// anomaly, and the first few get porcupine's HTML view.
func (c *cluster) porcupine(name string, m porcupine.Model, ops []porcupine.Operation) []anomaly {
	var out []anomaly
	for i, part := range m.Partition(ops) {
		pm := m
		pm.Partition = nil
		res, info := porcupine.CheckOperationsVerbose(pm, part, time.Minute)
		if res == porcupine.Ok {
			continue
		}
		what := c.describePart(part)
		a := anomaly{name, fmt.Sprintf("%s is not linearizable (%s, %d operations)", what, res, len(part))}
		if res == porcupine.Unknown {
			a.what = name + "-timeout"
		}
		if len(out) < 5 {
			path := fmt.Sprintf("%s/%s-%d.html", c.dir, name, i)
			if err := porcupine.VisualizePath(pm, info, path); err == nil {
				a.detail += "; view: " + path
			}
		}
		out = append(out, a)
	}
	return out
}

func (c *cluster) describePart(part []porcupine.Operation) string {
	switch in := part[0].Input.(type) {
	case keyIn:
		return "key " + in.key
	case mutexIn:
		// Name the runs that overlap (the first few pairs).
		var ivs []interval
		var who []string
		for _, o := range part {
			if m := o.Input.(mutexIn); m.acquire {
				ivs = append(ivs, o.Output.(interval))
				who = append(who, m.who)
			}
		}
		var pairs []string
		for i := range ivs {
			for j := i + 1; j < len(ivs) && len(pairs) < 3; j++ {
				a, b := ivs[i], ivs[j]
				if lo, hi := max(a.start, b.start), min(a.end, b.end); hi-lo > c.cfg.margin.Nanoseconds() {
					pairs = append(pairs, fmt.Sprintf("%s %s %s and %s %s %s overlap %v", who[i], a.task, span(a), who[j], b.task, span(b),
						time.Duration(hi-lo).Round(time.Millisecond)))
				}
			}
		}
		return "handler runs of " + in.part + ": " + strings.Join(pairs, "; ")
	}
	return "?"
}

func keyModelOf() porcupine.Model {
	m := keyModel()
	return m.ToModel()
}

// cut removes the spans from iv, returning what is left, in order.
func cut(iv [2]int64, spans [][2]int64) [][2]int64 {
	out := [][2]int64{iv}
	for _, sp := range spans {
		var next [][2]int64
		for _, seg := range out {
			if sp[1] <= seg[0] || sp[0] >= seg[1] {
				next = append(next, seg)
				continue
			}
			if sp[0] > seg[0] {
				next = append(next, [2]int64{seg[0], sp[0]})
			}
			if sp[1] < seg[1] {
				next = append(next, [2]int64{sp[1], seg[1]})
			}
		}
		out = next
	}
	return out
}

func span(iv interval) string {
	end := "end"
	if iv.open {
		end = "died"
	}
	return fmt.Sprintf("[%s, %s %s]", time.Unix(0, iv.start).UTC().Format("15:04:05.000"), end,
		time.Unix(0, iv.end).UTC().Format("15:04:05.000"))
}

type keyIn struct {
	key    string
	intent int
}

type keyOut struct {
	task     string
	conflict bool
	unknown  bool
}

type keyState struct {
	task   string // "": no task yet; "*": made by a submit whose outcome is unknown
	intent int
}

// keyModel: a key is a register written once, by the first submit that takes effect.
func keyModel() porcupine.NondeterministicModel {
	return porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			return partitionBy(h, func(o porcupine.Operation) string { return o.Input.(keyIn).key })
		},
		Init: func() []interface{} { return []interface{}{keyState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			s, in, out := state.(keyState), input.(keyIn), output.(keyOut)
			switch {
			case out.unknown:
				if s.task == "" {
					return []interface{}{s, keyState{"*", in.intent}}
				}
				return []interface{}{s}
			case out.conflict:
				if s.task != "" && s.intent != in.intent && (s.task == "*" || s.task == out.task) {
					return []interface{}{keyState{out.task, s.intent}}
				}
				return nil
			case s.task == "":
				return []interface{}{keyState{out.task, in.intent}}
			case s.intent == in.intent && (s.task == "*" || s.task == out.task):
				return []interface{}{keyState{out.task, s.intent}}
			}
			return nil
		},
		Equal: func(a, b interface{}) bool { return a.(keyState) == b.(keyState) },
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(keyIn), output.(keyOut)
			switch {
			case out.unknown:
				return fmt.Sprintf("submit(intent %d) → ?", in.intent)
			case out.conflict:
				return fmt.Sprintf("submit(intent %d) → conflict with %s", in.intent, out.task)
			}
			return fmt.Sprintf("submit(intent %d) → %s", in.intent, out.task)
		},
		DescribeState: func(state interface{}) string {
			s := state.(keyState)
			if s.task == "" {
				return "no task"
			}
			return fmt.Sprintf("%s (intent %d)", s.task, s.intent)
		},
	}
}

type mutexIn struct {
	part    string
	who     string
	acquire bool
	run     int
}

// mutexModel: a partition's handler runs hold one mutex; who holds it is the state.
func mutexModel() porcupine.Model {
	return porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			return partitionBy(h, func(o porcupine.Operation) string { return o.Input.(mutexIn).part })
		},
		Init: func() interface{} { return -1 },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			s, in := state.(int), input.(mutexIn)
			if in.acquire {
				return s == -1, in.run
			}
			return s == in.run, -1
		},
		DescribeOperation: func(input, output interface{}) string {
			in, iv := input.(mutexIn), output.(interval)
			if in.acquire {
				return fmt.Sprintf("%s starts %s", in.who, iv.task)
			}
			end := "ends"
			if iv.open {
				end = "dies"
			}
			return fmt.Sprintf("%s %s %s", in.who, end, iv.task)
		},
		DescribeState: func(state interface{}) string {
			if state.(int) == -1 {
				return "free"
			}
			return fmt.Sprintf("held by run %d", state.(int))
		},
	}
}

// partitionBy splits a history into the operations of each key, keys in order of first
// appearance, each partition in the history's order (porcupine checks them one by one).
func partitionBy(h []porcupine.Operation, key func(porcupine.Operation) string) [][]porcupine.Operation {
	by := map[string][]porcupine.Operation{}
	var keys []string
	for _, o := range h {
		k := key(o)
		if by[k] == nil {
			keys = append(keys, k)
		}
		by[k] = append(by[k], o)
	}
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, by[k])
	}
	return out
}
