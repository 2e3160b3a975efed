package console

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// tasksPerPage is the page size of /tasks: a page is at most this many rows.
const tasksPerPage = 100

// bulkBatch is how many tasks a bulk action picks under the index's lock before it acts on
// them: a filter matching millions holds no more than this in memory at once.
const bulkBatch = 500

// taskFilter is the filter of /tasks and of the bulk actions.
type taskFilter struct {
	State, Kind, Session, Q string
	state                   events.TaskState // State parsed (noState: any)
	before                  uint64           // only tasks submitted before this seq (the page cursor); 0: no bound
}

// parseTaskFilter reads state, kind, session, q and before from v.
func parseTaskFilter(v url.Values) (taskFilter, error) {
	f := taskFilter{State: v.Get("state"), Kind: v.Get("kind"), Session: v.Get("session"), Q: strings.TrimSpace(v.Get("q")), state: noState}
	if f.State != "" {
		i := slices.Index(stateNames[:], f.State)
		if i < 0 {
			return f, badRequest("state %q is not a task state: one of %s", f.State, strings.Join(stateNames[:], ", "))
		}
		f.state = events.TaskState(i)
	}
	if b := v.Get("before"); b != "" {
		n, err := strconv.ParseUint(b, 10, 64)
		if err != nil || n == 0 {
			return f, badRequest("before %q is not a sequence number: it must be a whole number from 1 (the next-page link gives it)", b)
		}
		f.before = n
	}
	return f, nil
}

// values is the filter as a query, without the cursor.
func (f taskFilter) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"state": f.State, "kind": f.Kind, "session": f.Session, "q": f.Q} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// matching calls fn with the tasks matching f at seq, newest first (by submission), from
// f.before down, until fn returns false. The walk is over the smallest list the filter
// allows — the ids and keys q names, a session's tasks, a kind's tasks, or every task — and
// reads only the index: no event is read and nothing is folded. Call with the index
// read-locked.
func (ix *index) matching(f taskFilter, seq uint64, fn func(ti int32, st events.TaskState) bool) {
	var list []int32 // nil with all: every task, 0..len(ix.tasks)-1
	all := false
	switch {
	case f.Q != "":
		if ti, ok := ix.byID[f.Q]; ok {
			list = append(list, ti)
		}
		for _, ti := range ix.byKey[f.Q] {
			if !slices.Contains(list, ti) {
				list = append(list, ti)
			}
		}
		slices.Sort(list)
	case f.Session != "":
		if s := ix.sess[f.Session]; s != nil {
			list = s.tasks
		}
	case f.Kind != "":
		list = ix.byKind[f.Kind]
	default:
		all = true
	}
	n := len(list)
	at := func(i int) int32 { return list[i] }
	if all {
		n = len(ix.tasks)
		at = func(i int) int32 { return int32(i) }
	}
	// Tasks are in submission order in every list: start below min(before, seq+1).
	bound := seq + 1
	if f.before != 0 {
		bound = min(bound, f.before)
	}
	start := searchTasks(n, func(i int) bool { return ix.tasks[at(i)].seqs[0] >= bound })
	for i := start - 1; i >= 0; i-- {
		ti := at(i)
		tr := &ix.tasks[ti]
		if (f.Session != "" && tr.session != f.Session) || (f.Kind != "" && tr.kind != f.Kind) {
			continue
		}
		st := ix.stateAt(ti, seq)
		if st == noState || (f.state != noState && st != f.state) {
			continue
		}
		if !fn(ti, st) {
			return
		}
	}
}

// searchTasks is sort.Search: the first i in [0, n) for which ok is true (n when none).
func searchTasks(n int, ok func(int) bool) int {
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if !ok(m) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// taskRow is one row of /tasks and of /api/tasks.
type taskRow struct {
	ID         string `json:"id"`
	Session    string `json:"session"`
	Kind       string `json:"kind"`
	Key        string `json:"idempotency_key,omitempty"`
	State      string `json:"state"`
	SubmitSeq  uint64 `json:"submitted_seq"`
	Submitted  string `json:"submitted_at"`
	UpdatedSeq uint64 `json:"updated_seq"`
	Updated    string `json:"updated_at"`
}

type tasksPage struct {
	Filter taskFilter
	Rows   []taskRow
	Next   uint64 // the cursor of the next page (before=Next); 0: this is the last page
	NextQ  string // the next page's query
}

// tasksAt is one page of the filtered list at seq. Call with the index read-locked.
func (ix *index) tasksAt(f taskFilter, seq uint64, human bool) *tasksPage {
	p := &tasksPage{Filter: f}
	tm := jsonTime
	if human {
		tm = fmtTime
	}
	ix.matching(f, seq, func(ti int32, st events.TaskState) bool {
		if len(p.Rows) == tasksPerPage {
			p.Next = p.Rows[len(p.Rows)-1].SubmitSeq
			return false
		}
		tr := &ix.tasks[ti]
		sp := ix.pos(tr.seqs[0])
		us, ua := ix.lastChange(ti, seq)
		row := taskRow{ID: tr.id, Session: tr.session, Kind: tr.kind, Key: tr.key, State: st.String(), SubmitSeq: tr.seqs[0], UpdatedSeq: us, Updated: tm(ua)}
		if sp > 0 && ix.evs[sp-1].seq == tr.seqs[0] {
			row.Submitted = tm(ix.evs[sp-1].at)
		}
		p.Rows = append(p.Rows, row)
		return true
	})
	if p.Next != 0 {
		v := f.values()
		v.Set("before", strconv.FormatUint(p.Next, 10))
		if seq < ix.lastSeq {
			v.Set("at_seq", strconv.FormatUint(seq, 10))
		}
		p.NextQ = "?" + v.Encode()
	}
	return p
}

type tasksData struct {
	*tasksPage
	States  [nStates]string
	Kinds   []string
	Actions bool   // the bulk actions are offered (actions on, and now)
	Done    string // what a bulk action just did
}

// tasksList is GET /tasks: every task of the queue, filtered, newest first, a page at a time.
func (c *Console) tasksList(r *http.Request, p *page) (string, error) {
	ix := c.ix
	p.Title, p.Nav = "Tasks", "tasks"
	f, err := parseTaskFilter(r.URL.Query())
	if err != nil {
		return "", err
	}
	d := &tasksData{tasksPage: ix.tasksAt(f, p.Cut.seq, true), States: stateNames, Kinds: ix.kinds, Actions: c.actions && !p.Past}
	if op, n := r.URL.Query().Get("done"), r.URL.Query().Get("acted"); op != "" {
		d.Done = op + ": " + n + " task(s) acted on, " + r.URL.Query().Get("skipped") + " skipped"
	}
	p.Data = d
	return "tasks", nil
}

// apiTasks is GET /api/tasks: /tasks as JSON.
func (c *Console) apiTasks(r *http.Request) (any, error) {
	c.ix.mu.RLock()
	defer c.ix.mu.RUnlock()
	ct, he := c.cutOf(r)
	if he != nil {
		return nil, he
	}
	f, err := parseTaskFilter(r.URL.Query())
	if err != nil {
		return nil, err
	}
	pg := c.ix.tasksAt(f, ct.seq, false)
	out := struct {
		AtSeq  uint64    `json:"at_seq"`
		Tasks  []taskRow `json:"tasks"`
		Before uint64    `json:"next_before,omitempty"`
	}{ct.seq, pg.Rows, pg.Next}
	if out.Tasks == nil {
		out.Tasks = []taskRow{}
	}
	return out, nil
}

// bulkResult is the answer of a bulk action.
type bulkResult struct {
	Action  string `json:"action"`
	Matched int    `json:"matched"` // tasks the filter matched when the action reached them
	Acted   int    `json:"acted"`   // of them, the ones it changed (one event each)
	Skipped int    `json:"skipped"` // the ones already as wanted (or that changed under it): not an error
}

// bulk is POST /api/tasks/retry and /api/tasks/cancel: the action on every task the filter
// (as /tasks: in the query or the form) matches now, newest first, bulkBatch tasks at a time.
// A task the action does not apply to (retry: not failed or canceled; cancel: already
// terminal) is skipped, so the same request repeated acts on nothing more.
func (c *Console) bulk(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		form, fail := c.failer(w, r)
		if err := r.ParseForm(); err != nil {
			fail(badRequest("the form could not be read: %v", err))
			return
		}
		if r.Form.Get("at_seq") != "" || r.Form.Get("at") != "" {
			fail(&httpError{code: http.StatusConflict, msg: "at_seq: actions act on the queue as it is now, not on a past view; leave at_seq and at out"})
			return
		}
		f, err := parseTaskFilter(r.Form)
		if err != nil {
			fail(asHTTPError(err))
			return
		}
		res, err := c.bulkAct(r.Context(), action, f)
		if err != nil {
			fail(asHTTPError(err))
			return
		}
		if form {
			v := f.values()
			v.Set("done", action)
			v.Set("acted", strconv.Itoa(res.Acted))
			v.Set("skipped", strconv.Itoa(res.Skipped))
			w.Header().Set("Location", "../../tasks?"+v.Encode())
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		writeJSON(w, http.StatusOK, res)
	}
}

func (c *Console) bulkAct(ctx context.Context, action string, f taskFilter) (bulkResult, error) {
	res := bulkResult{Action: action}
	type pick struct{ id, session string }
	f.before = math.MaxUint64
	for {
		if err := c.ix.catchUp(ctx); err != nil {
			return res, err
		}
		var batch []pick
		var states []events.TaskState
		c.ix.mu.RLock()
		c.ix.matching(f, c.ix.lastSeq, func(ti int32, st events.TaskState) bool {
			tr := &c.ix.tasks[ti]
			batch = append(batch, pick{tr.id, tr.session})
			states = append(states, st)
			f.before = tr.seqs[0]
			return len(batch) < bulkBatch
		})
		c.ix.mu.RUnlock()
		for i, t := range batch {
			res.Matched++
			var err error
			switch {
			case action == "retry" && (states[i] == events.StateFailed || states[i] == events.StateCanceled):
				_, err = c.q.Session(t.session).Retry(ctx, t.id, time.Time{})
			case action == "cancel" && !states[i].Terminal():
				_, err = c.q.Session(t.session).Cancel(ctx, t.id)
			default:
				res.Skipped++
				continue
			}
			switch {
			case err == nil:
				res.Acted++
			case errors.Is(err, work.ErrInvalidTransition):
				res.Skipped++ // it changed since the batch was picked
			default:
				return res, err
			}
		}
		if len(batch) < bulkBatch {
			return res, nil
		}
	}
}
