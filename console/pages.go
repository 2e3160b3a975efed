package console

import (
	"cmp"
	"context"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

var funcs = template.FuncMap{
	"pathEsc":  pathEscape,
	"queryEsc": url.QueryEscape,
	"short": func(id string) string {
		if len(id) > 14 && strings.HasPrefix(id, "task_") {
			return "…" + id[len(id)-8:]
		}
		return id
	},
	"add": func(a, b int) int { return a + b },
}

var stateNames = [nStates]string{"pending", "running", "succeeded", "failed", "canceled"}

// phaseNames are a pending task's phases (projection.Task.PendingPhase), as other queues name them.
var phaseNames = []string{projection.PhaseAvailable, projection.PhaseScheduled, projection.PhaseRetrying}

// countRow is one row of a counts table.
type countRow struct {
	Name   string
	Counts [nStates]int64
	Total  int64
}

func rowOf(name string, c *[nStates]int64) countRow {
	r := countRow{Name: name, Counts: *c}
	for _, n := range c {
		r.Total += n
	}
	return r
}

type overviewData struct {
	States     [nStates]string
	Total      countRow
	Kinds      []countRow
	Live       bool // due figures are the queue's own, now
	DueNow     int64
	OldestDue  string
	Charts     []chart
	Failures   []failureRow
	Sessions   int
	Tasks      int
	StatsErr   string
	WindowNote string
}

type failureRow struct {
	Seq              uint64
	At, Task, Reason string
	Session, Kind    string
}

func (c *Console) overview(r *http.Request, p *page) (string, error) {
	ix := c.ix
	p.Title, p.Nav = "Overview", "overview"
	pos := ix.pos(p.Cut.seq)
	counts := ix.countsAt(pos)
	d := &overviewData{States: stateNames}
	var tot [nStates]int64
	for _, k := range ix.kinds {
		v := counts[k]
		if v == nil {
			continue
		}
		row := rowOf(k, v)
		if row.Total == 0 {
			continue
		}
		for i := range tot {
			tot[i] += v[i]
		}
		d.Kinds = append(d.Kinds, row)
	}
	d.Total = rowOf("all kinds", &tot)
	if !p.Past {
		// The due figures are the queue's, from its fold's counts and due index (Queue.Stats).
		st, err := c.q.Stats(r.Context())
		if err != nil {
			d.StatsErr = err.Error()
		} else {
			d.Live, d.DueNow = true, st.DueNow
			if st.DueNow > 0 {
				d.OldestDue = fmtDuration(st.OldestDueAge)
			}
		}
	}
	d.Charts, d.WindowNote = ix.charts(pos)
	for i := len(ix.fails) - 1; i >= 0 && len(d.Failures) < 10; i-- {
		f := ix.fails[i]
		if f.seq > p.Cut.seq {
			continue
		}
		t := ix.tasks[f.task]
		d.Failures = append(d.Failures, failureRow{Seq: f.seq, At: fmtTime(f.at), Task: t.id, Reason: f.reason, Session: t.session, Kind: t.kind})
	}
	for _, s := range ix.sess {
		if s.firstSeq <= p.Cut.seq {
			d.Sessions++
		}
	}
	d.Tasks = int(d.Total.Total)
	p.Data = d
	return "overview", nil
}

// chart is one server-rendered SVG bar chart.
type chart struct {
	Title  string
	Total  int64
	Max    int64
	Bars   []bar
	From   string
	To     string
	Width  int
	Height int
}

type bar struct {
	X, Y, W, H int
	N          int64
	Label      string
}

const (
	chartBuckets = 60      // one a minute
	chartMaxScan = 500_000 // the recent window is bounded: at most this many events are looked at
)

// charts draws throughput (successes), failures and retries (redeliveries: claims of an
// attempt after the first) per minute over the hour before the cut's last event, from the
// index's recent events: a bounded window, never the whole log.
func (ix *index) charts(pos int) ([]chart, string) {
	if pos == 0 {
		return nil, ""
	}
	end := ix.evs[pos-1].maxAt
	start := end - int64(time.Hour)
	var b [3][chartBuckets]int64
	n := 0
	note := ""
	for i := pos - 1; i >= 0; i-- {
		r := ix.evs[i]
		if n == chartMaxScan {
			note = fmt.Sprintf("the charts count the last %d events only", chartMaxScan)
			break
		}
		n++
		if r.maxAt < start {
			break // every earlier event is stamped before the window
		}
		if r.at < start || r.at > end {
			continue
		}
		k := int((r.at - start) * chartBuckets / int64(time.Hour))
		k = min(k, chartBuckets-1)
		switch {
		case r.typ == events.TypeTaskSettled && r.after == events.StateSucceeded:
			b[0][k]++
		case r.typ == events.TypeTaskSettled && r.after == events.StateFailed:
			b[1][k]++
		case r.typ == events.TypeTaskClaimed && r.attempt > 1, r.typ == events.TypeTaskRetried:
			b[2][k]++
		}
	}
	titles := [3]string{"Succeeded per minute", "Failed per minute", "Retries and redeliveries per minute"}
	var out []chart
	for j := range b {
		ch := chart{Title: titles[j], From: fmtTime(start), To: fmtTime(end), Width: 600, Height: 120}
		for _, v := range b[j] {
			ch.Total += v
			ch.Max = max(ch.Max, v)
		}
		bw := ch.Width / chartBuckets
		for i, v := range b[j] {
			h := 0
			if ch.Max > 0 {
				h = int(v * int64(ch.Height-20) / ch.Max)
			}
			if v > 0 && h == 0 {
				h = 1
			}
			t := time.Unix(0, start+int64(i)*int64(time.Minute)).UTC().Format("15:04")
			ch.Bars = append(ch.Bars, bar{X: i * bw, Y: ch.Height - h, W: bw - 1, H: h, N: v, Label: fmt.Sprintf("%s: %d", t, v)})
		}
		out = append(out, ch)
	}
	return out, note
}

type sessionsData struct {
	Prefix string
	Rows   []sessionRow
	Next   string
	Total  int
}

type sessionRow struct {
	ID       string
	Tasks    int
	FirstSeq uint64
	Events   int
}

const sessionsPerPage = 50

func (c *Console) sessions(r *http.Request, p *page) (string, error) {
	ix := c.ix
	p.Title, p.Nav = "Sessions", "sessions"
	qs := r.URL.Query()
	d := &sessionsData{Prefix: qs.Get("prefix")}
	page, more := ix.sessionsPage(d.Prefix, qs.Get("after"), p.Cut.seq, sessionsPerPage)
	for _, s := range page {
		row := sessionRow{ID: s.id, FirstSeq: s.firstSeq}
		row.Events, _ = slices.BinarySearch(s.seqs, p.Cut.seq+1)
		row.Tasks = tasksUpTo(ix, s, p.Cut.seq)
		d.Rows = append(d.Rows, row)
	}
	if more {
		v := url.Values{}
		if d.Prefix != "" {
			v.Set("prefix", d.Prefix)
		}
		v.Set("after", page[len(page)-1].id)
		if p.Past {
			v.Set("at_seq", strconv.FormatUint(p.Cut.seq, 10))
		}
		d.Next = "?" + v.Encode()
	}
	p.Data = d
	return "sessions", nil
}

// tasksUpTo is how many of s's tasks were submitted at or before seq (its tasks are in
// submission order).
func tasksUpTo(ix *index, s *sessRec, seq uint64) int {
	n, _ := slices.BinarySearchFunc(s.tasks, seq+1, func(ti int32, seq uint64) int {
		return cmp.Compare(ix.tasks[ti].seqs[0], seq)
	})
	return n
}

type sessionData struct {
	ID       string
	States   [nStates]string
	Phases   []string          // the pending phases, which the state filter takes too
	PhaseOf  map[string]string // a listed pending task's phase at the page's time, by id
	Kinds    []string
	State    string
	Kind     string
	Tasks    []*taskJSON
	Shown    int
	Matching int
	Slider   slider
	Timeline *timeline
	// The links to the timeline's previous and next page of tasks ("": none).
	TimelinePrev, TimelineNext string
	Wakes                      []wakeRow
}

// wakeRow is one of a session's wakes on its page.
type wakeRow struct {
	ID, Reason, State string
	Attempts          uint32
	Task              string
	Created           string
	RecordSeq         uint64
}

func wakeStateOf(w *projection.Wake) string {
	switch {
	case w.Acked:
		return "acked"
	case w.LeaseToken != "":
		return "claimed"
	}
	return "available"
}

// slider is the time-travel control of the session and task pages.
type slider struct {
	Min, Max, Value uint64
	Prev, Next      uint64 // the previous and next event of the subject, 0 when none
	First, Last     uint64
}

func sliderOf(seqs []uint64, cutSeq, head uint64) slider {
	s := slider{Min: seqs[0], Max: head, Value: cutSeq, First: seqs[0], Last: seqs[len(seqs)-1]}
	i, found := slices.BinarySearch(seqs, cutSeq)
	if found {
		if i > 0 {
			s.Prev = seqs[i-1]
		}
		if i+1 < len(seqs) {
			s.Next = seqs[i+1]
		}
	} else {
		if i > 0 {
			s.Prev = seqs[i-1]
		}
		if i < len(seqs) {
			s.Next = seqs[i]
		}
	}
	return s
}

const sessionTaskLimit = 500

func (c *Console) session(r *http.Request, p *page) (string, error) {
	ix := c.ix
	id := r.PathValue("id")
	p.Title, p.Nav = "Session "+id, "sessions"
	s := ix.sess[id]
	if s == nil {
		return "", notFound("There is no session %q in this queue's log.", id)
	}
	if s.firstSeq > p.Cut.seq {
		return "", notFound("Session %q did not exist at seq %d: its first event is seq %d.", id, p.Cut.seq, s.firstSeq)
	}
	n, _ := slices.BinarySearch(s.seqs, p.Cut.seq+1)
	evs, err := readEvents(r.Context(), c.q, s.seqs[:n])
	if err != nil {
		return "", err
	}
	m, _ := foldEvents(evs, false)
	qs := r.URL.Query()
	d := &sessionData{ID: id, States: stateNames, Phases: phaseNames, PhaseOf: map[string]string{}, State: qs.Get("state"), Kind: qs.Get("kind")}
	if d.State != "" && !slices.Contains(stateNames[:], d.State) && !slices.Contains(phaseNames, d.State) {
		return "", badRequest("state %q is not a task state: one of %s, or a pending task's phase: %s", d.State, strings.Join(stateNames[:], ", "), strings.Join(phaseNames, ", "))
	}
	// A pending task's phase is derived from a time: the page's (the cut's event on a past
	// page, the host's clock on a live one).
	now := time.Now().UnixNano()
	if p.Past {
		now = p.Cut.at
	}
	kinds := map[string]bool{}
	err = m.ScanSessionTasks(id, 0, func(_ uint64, tid string) bool {
		t, _ := m.Task(tid)
		if t == nil {
			return true
		}
		kinds[t.Kind] = true
		phase := t.PendingPhase(now)
		if (d.State == "" || t.State.String() == d.State || phase == d.State) && (d.Kind == "" || t.Kind == d.Kind) {
			d.Matching++
			if len(d.Tasks) < sessionTaskLimit {
				d.Tasks = append(d.Tasks, taskObject(t))
				if phase != "" {
					d.PhaseOf[t.ID] = phase
				}
			}
		}
		return true
	})
	if err != nil {
		return "", err
	}
	for k := range kinds {
		d.Kinds = append(d.Kinds, k)
	}
	slices.Sort(d.Kinds)
	d.Shown = len(d.Tasks)
	for _, w := range m.Wakes() {
		d.Wakes = append(d.Wakes, wakeRow{ID: w.ID, Reason: w.Reason.String(), State: wakeStateOf(&w), Attempts: w.Attempts, Task: w.TaskID, Created: fmtTime(w.CreatedAt), RecordSeq: w.RecordSeq})
	}
	slices.SortFunc(d.Wakes, func(a, b wakeRow) int { return cmp.Compare(a.RecordSeq, b.RecordSeq) })
	if len(d.Wakes) > sessionTaskLimit {
		d.Wakes = d.Wakes[len(d.Wakes)-sessionTaskLimit:]
	}
	d.Slider = sliderOf(s.seqs, p.Cut.seq, p.Head)
	tlPage, _ := strconv.Atoi(qs.Get("tl"))
	d.Timeline = buildTimeline(evs, p.Cut.at, tlPage)
	if tl := d.Timeline; tl != nil {
		link := func(n int) string {
			v := url.Values{}
			for k, s := range map[string]string{"state": d.State, "kind": d.Kind} {
				if s != "" {
					v.Set(k, s)
				}
			}
			if p.Past {
				v.Set("at_seq", strconv.FormatUint(p.Cut.seq, 10))
			}
			v.Set("tl", strconv.Itoa(n))
			return "?" + v.Encode() + "#timeline"
		}
		if tl.PrevPage != 0 {
			d.TimelinePrev = link(tl.PrevPage)
		}
		if tl.NextPage != 0 {
			d.TimelineNext = link(tl.NextPage)
		}
	}
	p.Data = d
	return "session", nil
}

type taskData struct {
	T         *taskJSON
	Steps     []stepRow
	Attempts  []attemptRow
	Rejected  []stepRow
	Input     string
	Output    string
	Failure   string
	Slider    slider
	CanCancel bool
	CanRetry  bool
	Actions   bool
	RetryNote string
	WakeID    string
	Headers   []headerRow // the task's headers, by key
	TraceID   string      // from a W3C traceparent header; "" when none or malformed
	TraceLink string      // Options.TraceURL for TraceID; "" without one
}

type headerRow struct{ Key, Value string }

type stepRow struct {
	Seq      uint64
	At, Type string
	Rule     string
	Refused  bool
	Details  string
}

type attemptRow struct {
	Attempt    uint32
	Worker     string
	ClaimedAt  string
	LeaseUntil string
	Heartbeats int
	Ended      string
}

func (c *Console) task(r *http.Request, p *page) (string, error) {
	ix := c.ix
	id := r.PathValue("id")
	p.Title, p.Nav = "Task "+id, "sessions"
	t, steps, err := c.taskAt(r.Context(), id, p.Cut.seq)
	if err != nil {
		return "", err
	}
	ti := ix.byID[id]
	d := &taskData{T: taskObject(t), Input: prettyJSON(t.Input), WakeID: t.CompletionWakeID}
	for _, k := range slices.Sorted(maps.Keys(t.Headers)) {
		d.Headers = append(d.Headers, headerRow{k, t.Headers[k]})
	}
	if d.TraceID = traceID(t.Headers["traceparent"]); d.TraceID != "" && c.traceURL != "" {
		d.TraceLink = strings.ReplaceAll(c.traceURL, "{trace_id}", d.TraceID)
	}
	if t.State == events.StateSucceeded {
		d.Output = prettyJSON(t.Outcome.Output)
	}
	if t.State == events.StateFailed {
		d.Failure = t.Outcome.Error
	}
	var cur *attemptRow
	for _, s := range steps {
		h := s.ev.Head()
		row := stepRow{Seq: h.Seq, At: fmtTime(h.At), Type: s.ev.Type().String(), Rule: s.rule, Refused: s.refused, Details: details(s.ev)}
		d.Steps = append(d.Steps, row)
		switch e := s.ev.(type) {
		case *events.TaskClaimed:
			if cur != nil && cur.Ended == "" {
				cur.Ended = "lease expired; redelivered at seq " + strconv.FormatUint(h.Seq, 10)
			}
			d.Attempts = append(d.Attempts, attemptRow{Attempt: e.Attempt, Worker: e.Worker, ClaimedAt: fmtTime(h.At), LeaseUntil: fmtTime(e.LeaseExpiresAt)})
			cur = &d.Attempts[len(d.Attempts)-1]
		case *events.TaskExtended:
			if cur != nil && cur.Attempt == e.Attempt {
				cur.Heartbeats++
				cur.LeaseUntil = fmtTime(e.LeaseExpiresAt)
			}
		case *events.TaskSettled:
			if cur != nil && cur.Attempt == e.Attempt {
				cur.Ended = "settled at " + fmtTime(h.At) + ": " + outcomeText(e.Outcome)
			}
		case *events.TaskReleased:
			if cur != nil && cur.Attempt == e.Attempt {
				cur.Ended = "released at " + fmtTime(h.At)
				if e.Reason != "" {
					cur.Ended += " (" + clip(e.Reason, 200) + ")"
				}
			}
		case *events.TaskSettleRejected:
			d.Rejected = append(d.Rejected, row)
		case *events.TaskRetried:
			cur = nil
		}
	}
	for i := range d.Attempts {
		if d.Attempts[i].Ended == "" {
			d.Attempts[i].Ended = "holds the claim"
		}
	}
	d.Slider = sliderOf(ix.tasks[ti].seqs, p.Cut.seq, p.Head)
	d.Actions = !p.Past && c.actions
	d.CanCancel = d.Actions && !t.State.Terminal()
	d.CanRetry = d.Actions && t.Retryable()
	p.Data = d
	return "task", nil
}

// taskAt folds task id's events up to seq (its completion wake's too) and explains them.
// Call with the index read-locked.
func (c *Console) taskAt(ctx context.Context, id string, seq uint64) (*projection.Task, []step, error) {
	ix := c.ix
	ti, ok := ix.byID[id]
	if !ok {
		return nil, nil, notFound("There is no task %q in this queue's log.", id)
	}
	tr := ix.tasks[ti]
	if tr.seqs[0] > seq {
		return nil, nil, notFound("Task %q did not exist at seq %d: it was submitted at seq %d.", id, seq, tr.seqs[0])
	}
	n, _ := slices.BinarySearch(tr.seqs, seq+1)
	evs, err := readEvents(ctx, c.q, tr.seqs[:n])
	if err != nil {
		return nil, nil, err
	}
	m, steps := foldEvents(evs, true)
	t, _ := m.Task(id)
	if t == nil {
		return nil, nil, &httpError{code: http.StatusGone, msg: fmt.Sprintf("Task %q was pruned from this store: its events are gone.", id)}
	}
	return t, steps, nil
}

func prettyJSON(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return clip(string(jsonValue(b)), 64<<10)
}

// details is one event's fields for the log and task pages; never a lease token.
func details(ev events.Event) string {
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		s := "kind " + e.Kind
		if e.IdempotencyKey != "" {
			s += ", key " + e.IdempotencyKey
		}
		if e.HasRunAt {
			s += ", run_at " + fmtTime(e.RunAt)
		}
		if e.Schedule != "" {
			s += ", tick " + fmtTime(e.Tick) + " of schedule " + e.Schedule
		}
		return s + ", input " + clip(string(jsonValue(e.Input)), 200)
	case *events.ScheduleSet:
		s := "schedule " + e.Name + ", cron " + e.Cron
		if e.TimeZone != "" {
			s += " in " + e.TimeZone
		}
		s += ", kind " + e.Kind
		if e.Next != 0 {
			s += ", next tick " + fmtTime(e.Next)
		} else {
			s += ", no tick"
		}
		return s
	case *events.ScheduleRemoved:
		return "schedule " + e.Name + " removed"
	case *events.KindPolicySet:
		if e.Zero() {
			return "kind " + e.Kind + ": policy removed"
		}
		s := "kind " + e.Kind + ":"
		if e.Paused {
			s += " paused"
		}
		if e.MaxRunning > 0 {
			s += fmt.Sprintf(" max_running %d", e.MaxRunning)
		}
		if e.Rate > 0 {
			s += fmt.Sprintf(" rate %g/s burst %d", e.Rate, e.Burst)
		}
		return s
	case *events.TaskClaimed:
		s := fmt.Sprintf("attempt %d, lease until %s", e.Attempt, fmtTime(e.LeaseExpiresAt))
		if e.Worker != "" {
			s += ", worker " + e.Worker
		}
		return s
	case *events.TaskSettled:
		s := fmt.Sprintf("attempt %d, %s", e.Attempt, outcomeText(e.Outcome))
		if e.Outcome.State == events.StateSucceeded && len(e.Outcome.Output) > 0 {
			s += ", output " + clip(string(jsonValue(e.Outcome.Output)), 200)
		}
		return s
	case *events.TaskSettleRejected:
		return fmt.Sprintf("attempt %d presented, %s", e.Attempt, e.Reason)
	case *events.TaskExtended:
		return fmt.Sprintf("attempt %d, lease until %s", e.Attempt, fmtTime(e.LeaseExpiresAt))
	case *events.TaskRetried:
		return fmt.Sprintf("attempts %d kept, run_at %s", e.Attempts, fmtTime(e.RunAt))
	case *events.TaskSubmitRejected:
		return fmt.Sprintf("key %s, %s differs, kind %s", e.IdempotencyKey, e.Field, e.Kind)
	case *events.TaskReleased:
		s := fmt.Sprintf("attempt %d, run_at %s", e.Attempt, fmtTime(e.RunAt))
		if e.Reason != "" {
			s += ", reason " + clip(e.Reason, 200)
		}
		return s
	case *events.WakeRecorded:
		if e.Reason == events.WakeTaskFinished {
			return "completion of " + e.TaskID + ", " + outcomeText(e.Outcome)
		}
		s := "requested"
		if e.IdempotencyKey != "" {
			s += ", key " + e.IdempotencyKey
		}
		return s + ", payload " + clip(string(jsonValue(e.Payload)), 200)
	case *events.WakeClaimed:
		s := fmt.Sprintf("delivery %d, lease until %s", e.Attempt, fmtTime(e.LeaseExpiresAt))
		if e.Worker != "" {
			s += ", worker " + e.Worker
		}
		return s
	case *events.WakeAcked:
		return fmt.Sprintf("delivery %d", e.Attempt)
	case *events.WakeAckRejected:
		return fmt.Sprintf("delivery %d presented, %s", e.Attempt, e.Reason)
	}
	return ""
}

type logData struct {
	Types         []string
	Type, Session string
	Kind          string
	From, To      string
	Limit         int
	Rows          []logRow
	Older         string
	Newer         string
	Live          bool
	StreamURL     string
}

type logRow struct {
	Seq           uint64
	At, Session   string
	Type, Subject string
	TaskLink      string
	Details       string
}

const (
	logDefaultLimit = 100
	logMaxLimit     = 1000
)

func (c *Console) logPage(r *http.Request, p *page) (string, error) {
	ix := c.ix
	p.Title, p.Nav = "Log", "log"
	qs := r.URL.Query()
	d := &logData{Type: qs.Get("type"), Session: qs.Get("session"), Kind: qs.Get("kind"), From: qs.Get("from"), To: qs.Get("to"), Limit: logDefaultLimit}
	for _, t := range events.Types() {
		d.Types = append(d.Types, t.Name)
	}
	var typ events.Type
	if d.Type != "" {
		t, ok := events.TypeByName(d.Type)
		if !ok {
			return "", badRequest("type %q is not an event type: one of %s", d.Type, strings.Join(d.Types, ", "))
		}
		typ = t
	}
	num := func(name, v string) (uint64, error) {
		if v == "" {
			return 0, nil
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return 0, badRequest("%s %q is not a sequence number: it must be a whole number from 1", name, v)
		}
		return n, nil
	}
	from, err := num("from", d.From)
	if err != nil {
		return "", err
	}
	to, err := num("to", d.To)
	if err != nil {
		return "", err
	}
	if l := qs.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n <= 0 || n > logMaxLimit {
			return "", badRequest("limit %q must be a whole number from 1 to %d", l, logMaxLimit)
		}
		d.Limit = n
	}
	if to == 0 || to > p.Cut.seq {
		to = p.Cut.seq
	}
	if from > to && to != 0 {
		return "", badRequest("from %d is after to %d", from, to)
	}
	match := func(r evRec) bool {
		if r.seq < from || r.seq > to {
			return false
		}
		if d.Type != "" && r.typ != typ {
			return false
		}
		if d.Kind != "" && (r.task < 0 || ix.tasks[r.task].kind != d.Kind) {
			return false
		}
		return true
	}
	// The candidates: the session's events, or the whole index (in memory: no log scan).
	var seqs []uint64
	ascending := from != 0
	pick := func(r evRec) bool {
		if match(r) {
			seqs = append(seqs, r.seq)
		}
		return len(seqs) < d.Limit+1
	}
	if d.Session != "" {
		s := ix.sess[d.Session]
		if s != nil {
			walk(len(s.seqs), ascending, func(i int) bool {
				return pick(ix.evs[ix.pos(s.seqs[i])-1])
			})
		}
	} else {
		walk(len(ix.evs), ascending, func(i int) bool { return pick(ix.evs[i]) })
	}
	more := len(seqs) > d.Limit
	if more {
		seqs = seqs[:d.Limit]
	}
	if !ascending {
		slices.Reverse(seqs) // readEvents reads ascending
	}
	evs, err := readEvents(r.Context(), c.q, seqs)
	if err != nil {
		return "", err
	}
	// The page is newest first (docs/console.md), whichever end it was picked from.
	slices.Reverse(evs)
	for _, ev := range evs {
		h := ev.Head()
		tid, wid := ev.Subject()
		row := logRow{Seq: h.Seq, At: fmtTime(h.At), Session: h.SessionID, Type: ev.Type().String(), Details: details(ev)}
		if tid != "" {
			row.Subject, row.TaskLink = tid, tid
		} else {
			row.Subject = wid
			if ti, ok := ix.wakeOf[wid]; ok {
				row.TaskLink = ix.tasks[ti].id
			}
		}
		d.Rows = append(d.Rows, row)
	}
	link := func(from, to uint64) string {
		v := url.Values{}
		for k, val := range map[string]string{"type": d.Type, "session": d.Session, "kind": d.Kind} {
			if val != "" {
				v.Set(k, val)
			}
		}
		if from > 0 {
			v.Set("from", strconv.FormatUint(from, 10))
		}
		if to > 0 {
			v.Set("to", strconv.FormatUint(to, 10))
		}
		if d.Limit != logDefaultLimit {
			v.Set("limit", strconv.Itoa(d.Limit))
		}
		if p.Past {
			v.Set("at_seq", strconv.FormatUint(p.Cut.seq, 10))
		}
		return "?" + v.Encode()
	}
	if len(d.Rows) > 0 {
		first, last := d.Rows[len(d.Rows)-1].Seq, d.Rows[0].Seq // the oldest and newest shown
		if (!ascending && more) || (ascending && first > 1 && from > 1) {
			d.Older = link(0, first-1)
		}
		if last < p.Cut.seq { // a page up to a seq (an older page) has a way back too
			d.Newer = link(last+1, 0)
		}
	}
	d.Live = !p.Past && from == 0 && d.To == ""
	if d.Live {
		v := url.Values{}
		for k, val := range map[string]string{"type": d.Type, "session": d.Session, "kind": d.Kind} {
			if val != "" {
				v.Set(k, val)
			}
		}
		v.Set("from", strconv.FormatUint(p.Cut.seq+1, 10))
		d.StreamURL = "log/stream?" + v.Encode()
	}
	p.Data = d
	return "log", nil
}

// walk calls fn with 0..n-1 (ascending) or n-1..0 until fn returns false.
func walk(n int, ascending bool, fn func(int) bool) {
	if ascending {
		for i := 0; i < n; i++ {
			if !fn(i) {
				return
			}
		}
		return
	}
	for i := n - 1; i >= 0; i-- {
		if !fn(i) {
			return
		}
	}
}

type statsData struct {
	FirstSeq, LastSeq uint64
	FirstAt, LastAt   string
	Events            int
	Sessions          int
	Tasks             int
	Types             []typeCount
	Kinds             []countRow
	States            [nStates]string
}

type typeCount struct {
	Name string
	N    int64
}

func (c *Console) statsPage(r *http.Request, p *page) (string, error) {
	ix := c.ix
	p.Title, p.Nav = "Stats", "stats"
	pos := ix.pos(p.Cut.seq)
	d := &statsData{LastSeq: p.Cut.seq, Events: pos, States: stateNames}
	if pos > 0 {
		d.FirstSeq, d.FirstAt, d.LastAt = ix.evs[0].seq, fmtTime(ix.evs[0].at), fmtTime(ix.evs[pos-1].at)
	}
	types := ix.types
	if p.Past {
		types = ix.typesAt(pos)
	}
	for _, t := range events.Types() {
		d.Types = append(d.Types, typeCount{Name: t.Name, N: types[t.Type]})
	}
	counts := ix.countsAt(pos)
	for _, k := range ix.kinds {
		if v := counts[k]; v != nil {
			row := rowOf(k, v)
			d.Tasks += int(row.Total)
			d.Kinds = append(d.Kinds, row)
		}
	}
	for _, s := range ix.sess {
		if s.firstSeq <= p.Cut.seq {
			d.Sessions++
		}
	}
	p.Data = d
	return "stats", nil
}

// pathEscape escapes an id for one path segment of a link.
func pathEscape(s string) string { return url.PathEscape(s) }

// traceID is the trace id of a W3C traceparent header ("00-<32 hex>-<16 hex>-<2 hex>"), or
// "" when tp is not one (an all-zero id is invalid too). Only lowercase hex passes, so the id
// is safe in a URL as it is.
func traceID(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) < 4 || len(parts[0]) != 2 || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return ""
	}
	id := parts[1]
	if strings.Trim(id, "0123456789abcdef") != "" || strings.Trim(id, "0") == "" {
		return ""
	}
	return id
}
