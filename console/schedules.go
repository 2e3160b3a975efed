package console

import (
	"net/http"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/worklog/worklog/projection"
)

// cronParser reads a schedule's rule as the queue does (work's parser: the 5-field cron and
// the descriptors, @every included).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// nextTicks is how many ticks after a schedule's next one the schedules page lists.
const nextTicks = 3

// schedulesMax bounds the schedules one page lists.
const schedulesMax = 1000

// schedRow is one schedule on /schedules and /api/schedules.
type schedRow struct {
	Session   string   `json:"session"`
	Name      string   `json:"name"`
	Cron      string   `json:"cron"`
	TimeZone  string   `json:"time_zone"`
	Kind      string   `json:"kind"`
	Catchup   string   `json:"catchup"`
	Next      string   `json:"next,omitempty"`       // the next tick still to be submitted ("" none)
	Following []string `json:"next_ticks,omitempty"` // the ticks after it
	LastTick  string   `json:"last_tick,omitempty"`  // the last tick submitted since it was set
	LastTask  string   `json:"last_task,omitempty"`  // that tick's task
	Ticks     uint64   `json:"ticks"`                // ticks submitted since it was set
	SetSeq    uint64   `json:"set_seq"`
	SetAt     string   `json:"set_at"`
	Removed   bool     `json:"removed"`
	RuleErr   string   `json:"rule_error,omitempty"` // the rule does not parse here (a zone this machine lacks)
}

// schedulesAt is every schedule set by seq, by session then name (at most schedulesMax; more
// says there were more). Call with the index read-locked.
func (ix *index) schedulesAt(seq uint64, human bool) (rows []schedRow, more bool) {
	tm := jsonTime
	if human {
		tm = fmtTime
	}
	for _, r := range ix.schedules() {
		sc := r.at(seq)
		if sc == nil {
			continue
		}
		if len(rows) == schedulesMax {
			return rows, true
		}
		row := schedRow{Session: sc.SessionID, Name: sc.Name, Cron: sc.Cron, TimeZone: sc.TimeZone, Kind: sc.Kind,
			Catchup: "latest", Ticks: sc.Ticks, SetSeq: sc.SetSeq, SetAt: tm(sc.SetAt), Removed: sc.Removed}
		if row.TimeZone == "" {
			row.TimeZone = "UTC"
		}
		if sc.Catchup == 1 {
			row.Catchup = "all"
		}
		if sc.Ticks > 0 {
			row.LastTick = tm(sc.Cursor)
			row.LastTask = ix.tickTask(sc, seq)
		}
		if !sc.Removed && sc.Next != 0 {
			row.Next = tm(sc.Next)
			ticks, err := followingTicks(sc, nextTicks)
			if err != nil {
				row.RuleErr = err.Error()
			}
			for _, t := range ticks {
				row.Following = append(row.Following, tm(t))
			}
		}
		rows = append(rows, row)
	}
	return rows, false
}

// tickTask is the id of the task of sc's last submitted tick (its key is the tick's), "" when
// the index has none by seq.
func (ix *index) tickTask(sc *projection.Schedule, seq uint64) string {
	for _, ti := range ix.byKey[projection.TickKey(sc.Name, sc.Cursor)] {
		if tr := &ix.tasks[ti]; tr.session == sc.SessionID && tr.seqs[0] <= seq {
			return tr.id
		}
	}
	return ""
}

// followingTicks is the n ticks of sc's rule after its next one.
func followingTicks(sc *projection.Schedule, n int) ([]int64, error) {
	s, err := cronParser.Parse(sc.Cron)
	if err != nil {
		return nil, err
	}
	loc := time.UTC
	if sc.TimeZone != "" {
		if loc, err = time.LoadLocation(sc.TimeZone); err != nil {
			return nil, err
		}
	}
	var out []int64
	t := time.Unix(0, sc.Next).In(loc)
	for range n {
		t = s.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t.UnixNano())
	}
	return out, nil
}

type schedulesData struct {
	Rows    []schedRow
	More    bool
	Actions bool
}

// schedulesPage is GET /schedules.
func (c *Console) schedulesPage(r *http.Request, p *page) (string, error) {
	p.Title, p.Nav = "Schedules", "schedules"
	d := &schedulesData{Actions: c.actions && !p.Past}
	d.Rows, d.More = c.ix.schedulesAt(p.Cut.seq, true)
	p.Data = d
	return "schedules", nil
}

// apiSchedules is GET /api/schedules.
func (c *Console) apiSchedules(r *http.Request) (any, error) {
	c.ix.mu.RLock()
	defer c.ix.mu.RUnlock()
	ct, he := c.cutOf(r)
	if he != nil {
		return nil, he
	}
	rows, more := c.ix.schedulesAt(ct.seq, false)
	if rows == nil {
		rows = []schedRow{}
	}
	return struct {
		AtSeq     uint64     `json:"at_seq"`
		Schedules []schedRow `json:"schedules"`
		More      bool       `json:"more,omitempty"`
	}{ct.seq, rows, more}, nil
}

// removeSchedule is POST /api/schedules/{session}/{name}/remove: Session.RemoveSchedule.
func (c *Console) removeSchedule(w http.ResponseWriter, r *http.Request) {
	form := strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded")
	session, name := r.PathValue("session"), r.PathValue("name")
	if err := c.q.Session(session).RemoveSchedule(r.Context(), name); err != nil {
		e := asHTTPError(err)
		if form {
			c.errorPage(w, r, e)
		} else {
			writeJSONError(w, e)
		}
		return
	}
	if form {
		w.Header().Set("Location", "../../../../schedules")
		w.WriteHeader(http.StatusSeeOther)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"session": session, "name": name, "removed": true})
}
