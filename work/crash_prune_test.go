package work_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// TestCrashKillPrune is TestCrashKill with pruning under the load: the child runs the usual
// load (submits with keys, claims, finishes, cancels, completion wakes acknowledged, direct
// wakes) and prunes beside it, in groups of two subjects, both with explicit Prune calls and
// with the background pruner (Options.Retention, on the load's clock), while the parent kills
// it with SIGKILL at a random moment, round after round on the same store. After each kill:
//
//   - Open succeeds and Verify is clean;
//   - no half-pruned subject: every event's task or wake has its creation event in the log, a
//     task's record exists exactly when its task_submitted does, a terminal task that wakes
//     on completion has its completion wake's record in the log, a completion wake has its
//     task;
//   - every acknowledged operation is present unless its subject was prunable, by the spec's
//     rule, at a before the child announced before it pruned with it; a present task reads
//     exactly as acknowledged, and its key (a present direct wake's key) still names it; an
//     absent direct wake's key is free;
//   - everything prunable at the before of a Prune that returned is gone.
//
// The child announces a before ("prune-start") only after every call it made at an earlier
// time has been reported: it takes the load's gate (each call and its report run under its
// read lock) to read the clock. So the ledger knows every finish and acknowledgment that can
// make a subject prunable at that before, except those of a round killed before it reported
// them, which the checker reads from the store after the kill, before any later prune.
func TestCrashKillPrune(t *testing.T) {
	rounds, budget := 12, 12*time.Second
	if testing.Short() {
		rounds = 3
	}
	if raceBuild() {
		budget = 8 * time.Second // Pebble checks its invariants under -race: fewer rounds
	}
	if s := os.Getenv(crashRoundsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", crashRoundsEnv, s)
		}
		rounds, budget = n, 0
	}
	seed := crashSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0x9a7e))
	t.Logf("seed %d (set %s to repeat the random choices), up to %d rounds", seed, crashSeedEnv, rounds)

	dir := t.TempDir()
	ctx := context.Background()
	m := newPruneModel()
	all := &ledger{}
	start := time.Now()
	round := 0
	var pruned int
	for round < rounds {
		if budget > 0 && round >= 3 && time.Since(start) > budget {
			t.Logf("stopping after %d rounds: the time budget of %v is spent", round, budget)
			break
		}
		delay := time.Duration(50+rng.IntN(351)) * time.Millisecond
		l := runCrashRound(t, dir, round, seed, delay, false, crashPruneEnv+"=true")
		all.merge(l)
		m.learnLedger(l)
		q, err := work.Open(dir, nil)
		if err != nil {
			t.Fatalf("round %d: reopening after the kill: %v", round, err)
		}
		what := fmt.Sprintf("round %d (killed after %v; %v, %d prunes started, %d returned)", round, delay, l, len(l.pruneStarts), len(l.pruneEnds))
		n, gone := m.check(t, q, all, what)
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		pruned = gone
		t.Logf("%s: %d events in the log, %d acknowledged subjects pruned so far", what, n, gone)
		round++
	}
	if len(all.submits) == 0 || len(all.pruneEnds) == 0 {
		t.Fatalf("the children acknowledged %v and finished %d prunes: the load or the pruning never ran", all, len(all.pruneEnds))
	}
	if pruned == 0 {
		t.Fatal("no acknowledged subject was ever pruned: the test checked nothing of pruning")
	}

	// Last, finish the prune the children started: everything prunable at the greatest before
	// announced goes, and nothing else.
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	res, err := q.Prune(ctx, time.Unix(0, m.announced))
	if err != nil {
		t.Fatal(err)
	}
	m.completed = m.announced
	n, gone := m.check(t, q, all, fmt.Sprintf("after %d rounds (%v) and a last prune", round, all))
	t.Logf("%d rounds in %v; the last prune removed %d tasks, %d wakes; %d events left, %d acknowledged subjects pruned",
		round, time.Since(start).Round(time.Millisecond), res.Tasks, res.Wakes, n, gone)
}

// --- the child ---

// pruneLoad is the pruning part of the child's load (runLoad's p): an explicit Prune every
// `every`, and the background pruner (same interval and retention) on the load's clock.
type pruneLoad struct {
	every, retention time.Duration
	clock            atomic.Pointer[func() time.Time] // the background pruner's clock, once the load runs
}

var crashPrune = &pruneLoad{every: 10 * time.Millisecond, retention: 50 * time.Millisecond}

// crashPruneGroup is the subjects per prune command in the child: small, so that a kill
// lands between the groups of a prune as well as inside one.
const crashPruneGroup = 2

// pruneBefore picks the before of a prune: the load's clock minus the retention, read under
// the gate's write lock, so every call made at an earlier time has returned and been
// reported; and announces it before anything is pruned with it.
func (l *load) pruneBefore(retention time.Duration, emit func(string)) time.Time {
	l.gate.Lock()
	defer l.gate.Unlock()
	b := l.now().Add(-retention)
	emit(fmt.Sprintf("prune-start %d", b.UnixNano()))
	return b
}

func (p *pruneLoad) start(l *load, q *work.Queue, emit func(string), spawn func(int, func(*rand.Rand))) {
	clock := func() time.Time { return l.pruneBefore(p.retention, emit).Add(p.retention) }
	p.clock.Store(&clock)
	spawn(7, func(*rand.Rand) {
		ctx := context.Background()
		for {
			select {
			case <-l.stop:
				return
			case <-time.After(p.every):
			}
			before := l.pruneBefore(p.retention, emit)
			res, err := q.Prune(ctx, before)
			if err != nil {
				l.fail(fmt.Errorf("prune before %v: %w", before, err))
				return
			}
			emit(fmt.Sprintf("pruned %d %d %d %d", before.UnixNano(), res.Tasks, res.Wakes, res.Events))
		}
	})
}

// pruneChildOptions sets up the child's pruning: small groups, the background pruner on the
// load's clock (before the load starts, a time before every round: it prunes nothing), its
// log reported to the parent (an error record fails the round).
func pruneChildOptions(say func(string)) *work.Options {
	work.SetPruneGroup(crashPruneGroup)
	work.SetClock(func() time.Time {
		if c := crashPrune.clock.Load(); c != nil {
			return (*c)()
		}
		return crashEpoch.Add(-24 * time.Hour)
	})
	return &work.Options{Retention: crashPrune.retention, PruneInterval: crashPrune.every, Logger: slog.New(childLog{say})}
}

func runPruneChild(q *work.Queue, round int, seed uint64, say func(string)) error {
	return runLoad(q, round, seed, say, nil, &sync.RWMutex{}, crashPrune)
}

// childLog reports the background pruner's records to the parent, and any error record as
// the child's failure.
type childLog struct{ say func(string) }

func (childLog) Enabled(context.Context, slog.Level) bool { return true }
func (h childLog) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h childLog) WithGroup(string) slog.Handler          { return h }
func (h childLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	line := strings.ReplaceAll(b.String(), "\n", " ")
	switch {
	case r.Level >= slog.LevelError:
		h.say("error log: " + line)
	case strings.HasPrefix(r.Message, "worklog: background prune"):
		h.say("bg-pruned " + line)
	}
	return nil
}

// --- the checker's model ---

type taskFacts struct {
	session, key string
	woc          bool
	finishedAt   int64  // 0: not known to be terminal
	wakeID       string // its completion wake, once known
}

type wakeFacts struct {
	session, key string
	direct       bool
	ackedAt      int64 // 0: not known to be acknowledged
	keyChecked   bool  // absent, and its key was found free
}

// pruneModel is what the checker knows of every subject: from the children's reports and
// from the store after each kill.
type pruneModel struct {
	tasks     map[string]*taskFacts
	wakes     map[string]*wakeFacts
	announced int64 // the greatest before a prune started with
	completed int64 // the greatest before a prune returned with
}

func newPruneModel() *pruneModel {
	return &pruneModel{tasks: map[string]*taskFacts{}, wakes: map[string]*wakeFacts{}}
}

func (m *pruneModel) task(id string) *taskFacts {
	f := m.tasks[id]
	if f == nil {
		f = &taskFacts{}
		m.tasks[id] = f
	}
	return f
}

func (m *pruneModel) wake(id string) *wakeFacts {
	f := m.wakes[id]
	if f == nil {
		f = &wakeFacts{}
		m.wakes[id] = f
	}
	return f
}

func (m *pruneModel) learnLedger(l *ledger) {
	for _, r := range l.submits {
		f := m.task(r.id)
		f.session, f.key = r.session, r.key
		f.woc = crashTaskRequest(r.key).Wake == work.WakeOnCompletion
	}
	for _, r := range l.finishes {
		m.task(r.id).finishedAt = r.finishedAt
	}
	for _, r := range l.cancels {
		if r.finishedAt != 0 {
			m.task(r.id).finishedAt = r.finishedAt
		}
	}
	for _, r := range l.wakes {
		f := m.wake(r.id)
		f.session, f.key, f.direct = r.session, r.key, true
	}
	for _, r := range l.ackRecs {
		m.wake(r.id).ackedAt = r.at
		if r.taskID != "" {
			t := m.task(r.taskID)
			t.woc, t.wakeID = true, r.id
		}
	}
	for _, b := range l.pruneStarts {
		m.announced = max(m.announced, b)
	}
	for _, b := range l.pruneEnds {
		m.completed = max(m.completed, b)
	}
}

// taskPrunable is the spec's rule on what the model knows: terminal before b, with its
// completion wake (if it has one) acknowledged before b.
func (m *pruneModel) taskPrunable(id string, b int64) bool {
	f := m.tasks[id]
	if f == nil || f.finishedAt == 0 || f.finishedAt >= b {
		return false
	}
	if !f.woc {
		return true
	}
	w := m.wakes[f.wakeID]
	return f.wakeID != "" && w != nil && w.ackedAt != 0 && w.ackedAt < b
}

func (m *pruneModel) wakePrunable(id string, b int64) bool {
	w := m.wakes[id]
	return w != nil && w.direct && w.ackedAt != 0 && w.ackedAt < b
}

// prunedLog is what a scan of a pruned log says.
type prunedLog struct {
	n           int
	submitted   map[string]*events.TaskSubmitted
	recorded    map[string]*events.WakeRecorded
	completions map[string]string // task -> its completion wake
	acked       map[string]bool
}

// check checks q after a kill (see TestCrashKillPrune) against l, everything the children
// acknowledged, and learns what the store says of its subjects. It returns the events in the
// log and how many acknowledged subjects are gone.
func (m *pruneModel) check(t *testing.T, q *work.Queue, l *ledger, what string) (n, gone int) {
	t.Helper()
	ctx := context.Background()
	p := &problems{t: t, what: what}
	if err := q.Verify(ctx); err != nil {
		// The checks below say more of what is wrong: they run too.
		msg := err.Error()
		if len(msg) > 2000 {
			msg = msg[:2000] + "..."
		}
		p.add("Verify: %s", msg)
	}

	// The log, with its pruned gaps: no event without its subject's creation.
	lg := prunedLog{submitted: map[string]*events.TaskSubmitted{}, recorded: map[string]*events.WakeRecorded{},
		completions: map[string]string{}, acked: map[string]bool{}}
	var last uint64
	err := q.ReadLog(ctx, 0, func(ev events.Event) error {
		lg.n++
		h := ev.Head()
		if h.Seq <= last {
			return fmt.Errorf("event seq %d after %d", h.Seq, last)
		}
		last = h.Seq
		switch e := ev.(type) {
		case *events.TaskSubmitted:
			lg.submitted[e.TaskID] = e
		case *events.WakeRecorded:
			lg.recorded[e.WakeID] = e
			if e.Reason == events.WakeTaskFinished {
				if lg.submitted[e.TaskID] == nil {
					p.add("completion wake %s (seq %d) of task %s, whose task_submitted is not in the log", e.WakeID, h.Seq, e.TaskID)
				}
				lg.completions[e.TaskID] = e.WakeID
			}
		case *events.WakeAcked:
			lg.acked[e.WakeID] = true
			m.wake(e.WakeID).ackedAt = h.At
		}
		taskID, wakeID := ev.Subject()
		if taskID != "" && lg.submitted[taskID] == nil {
			p.add("%s (seq %d) of task %s, whose task_submitted is not in the log: half pruned", ev.Type(), h.Seq, taskID)
		}
		if wakeID != "" && lg.recorded[wakeID] == nil {
			p.add("%s (seq %d) of wake %s, whose wake_recorded is not in the log: half pruned", ev.Type(), h.Seq, wakeID)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: ReadLog: %v", what, err)
	}

	// Every task of the log has its record, and its completion wake when it has one; learn
	// what the store says of it.
	for id, e := range lg.submitted {
		tk, found, err := q.Session(e.SessionID).Task(ctx, id)
		if err != nil || !found {
			p.add("task %s: task_submitted in the log, but the record: found %v, %v", id, found, err)
			continue
		}
		f := m.task(id)
		f.session, f.key, f.woc = e.SessionID, e.IdempotencyKey, e.WakeOnCompletion
		if tk.State.Terminal() {
			f.finishedAt = nanosOf(tk.FinishedAt)
			if e.WakeOnCompletion && lg.completions[id] == "" {
				p.add("task %s is %s and wakes on completion, but its completion wake is not in the log: half pruned", id, tk.State)
			}
		}
	}
	for id, e := range lg.recorded {
		f := m.wake(id)
		f.session, f.key, f.direct = e.SessionID, e.IdempotencyKey, e.Reason == events.WakeRequested
		if e.Reason == events.WakeTaskFinished {
			m.task(e.TaskID).wakeID = id
		}
	}

	// Every acknowledged operation: present and exactly as acknowledged, or gone and prunable
	// at a before the child used.
	type want struct {
		state       string
		finishedAt  int64
		requestedAt int64
	}
	wants := map[string]*want{}
	wantOf := func(id string) *want {
		if wants[id] == nil {
			wants[id] = &want{}
		}
		return wants[id]
	}
	for _, r := range l.finishes {
		w := wantOf(r.id)
		w.state, w.finishedAt = r.state, r.finishedAt
	}
	for _, r := range l.cancels {
		w := wantOf(r.id)
		w.requestedAt = r.requestedAt
		if r.finishedAt != 0 {
			w.state, w.finishedAt = r.state, r.finishedAt
		}
	}
	for _, r := range l.submits {
		s := q.Session(r.session)
		tk, found, err := s.Task(ctx, r.id)
		if err != nil {
			t.Fatalf("%s: task %s: %v", what, r.id, err)
		}
		if found != (lg.submitted[r.id] != nil) {
			p.add("task %s: record found %v, task_submitted in the log %v: half pruned", r.id, found, lg.submitted[r.id] != nil)
		}
		if !found {
			gone++
			if !m.taskPrunable(r.id, m.announced) {
				p.add("acknowledged submit %s (task %s) is gone, but it was not prunable before %d, the greatest before announced: %+v",
					r.key, r.id, m.announced, *m.tasks[r.id])
			}
			continue
		}
		req := crashTaskRequest(r.key)
		if tk.IdempotencyKey != r.key || tk.SessionID != r.session || tk.Kind != req.Kind || !bytes.Equal(tk.Input, req.Input) {
			p.add("task %s reads %s/%s/%s/%s, want %s/%s/%s/%s", r.id, tk.SessionID, tk.IdempotencyKey, tk.Kind, tk.Input, r.session, r.key, req.Kind, req.Input)
		}
		if w := wants[r.id]; w != nil {
			if w.state != "" && (tk.State.String() != w.state || nanosOf(tk.FinishedAt) != w.finishedAt) {
				p.add("task %s is %s finished at %d, acknowledged %s at %d", r.id, tk.State, nanosOf(tk.FinishedAt), w.state, w.finishedAt)
			}
			if w.requestedAt != 0 && nanosOf(tk.CancelRequestedAt) != w.requestedAt {
				p.add("task %s: cancel requested at %d, acknowledged at %d", r.id, nanosOf(tk.CancelRequestedAt), w.requestedAt)
			}
		}
		if again, err := s.SubmitAt(ctx, req, time.Unix(0, m.announced)); err != nil || again.ID != r.id {
			p.add("repeating submit %s gives %s, %v; want task %s", r.key, again.ID, err, r.id)
		}
	}
	for _, r := range l.wakes {
		f := m.wakes[r.id]
		if lg.recorded[r.id] == nil {
			gone++
			if !m.wakePrunable(r.id, m.announced) {
				p.add("acknowledged wake %s (key %s) is gone, but it was not prunable before %d: %+v", r.id, r.key, m.announced, *f)
			}
			if f.keyChecked {
				continue
			}
			// Its key is free: the record went with its events. (This records a new wake.)
			w, err := q.Session(r.session).WakeAt(ctx, crashWakeRequest(r.key), time.Unix(0, m.announced))
			if err != nil || w.ID == r.id {
				p.add("wake %s is gone from the log, but repeating its key gives %s, %v", r.id, w.ID, err)
			}
			f.keyChecked = true
			continue
		}
		if w, err := q.Session(r.session).WakeAt(ctx, crashWakeRequest(r.key), time.Unix(0, m.announced)); err != nil || w.ID != r.id {
			p.add("repeating wake %s gives %s, %v; want wake %s", r.key, w.ID, err, r.id)
		}
	}
	for _, r := range l.ackRecs {
		if lg.recorded[r.id] != nil && !lg.acked[r.id] {
			p.add("acknowledged ack of wake %s is not in the log", r.id)
		}
	}

	// Every prune that returned removed all it could.
	for id, f := range m.tasks {
		if f.session != "" && m.taskPrunable(id, m.completed) && lg.submitted[id] != nil {
			p.add("task %s was prunable before %d, the before of a prune that returned, and is still there: %+v", id, m.completed, *f)
		}
	}
	for id := range m.wakes {
		if m.wakePrunable(id, m.completed) && lg.recorded[id] != nil {
			p.add("wake %s was prunable before %d, the before of a prune that returned, and is still there", id, m.completed)
		}
	}
	return lg.n, gone
}
