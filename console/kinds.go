package console

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// policyOfEvent is the work.KindPolicy a kind_policy_set event sets: the one place that maps
// the event's fields to the API's. A field added to both is one line here; the pages, the
// JSON and the edit form read work.KindPolicy's fields by reflection (policyFields).
func policyOfEvent(e *events.KindPolicySet) work.KindPolicy {
	if e == nil {
		return work.KindPolicy{}
	}
	return work.KindPolicy{Paused: e.Paused, MaxRunning: int(e.MaxRunning), Rate: e.Rate, Burst: int(e.Burst),
		FairSessions: e.FairSessions, MaxRunningPerSession: int(e.MaxRunningPerSession)}
}

// policyField is one field of work.KindPolicy as the kinds page shows and edits it.
type policyField struct {
	Name  string // the JSON and form name: the Go name in snake case ("max_running")
	Go    string // the Go name ("MaxRunning")
	Kind  string // "bool", "int" or "float"
	Value string // the value as the form writes it
	On    bool   // a bool's value
}

// policyFields is p's fields, in declaration order: every bool, int and float64 field of
// work.KindPolicy, so that a field added to it is on the page, in the JSON and in the form
// without a change here.
func policyFields(p work.KindPolicy) []policyField {
	v := reflect.ValueOf(p)
	t := v.Type()
	var out []policyField
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		f := policyField{Name: snake(sf.Name), Go: sf.Name}
		fv := v.Field(i)
		switch fv.Kind() {
		case reflect.Bool:
			f.Kind, f.On, f.Value = "bool", fv.Bool(), strconv.FormatBool(fv.Bool())
		case reflect.Int, reflect.Int64, reflect.Int32:
			f.Kind, f.Value = "int", strconv.FormatInt(fv.Int(), 10)
		case reflect.Float64, reflect.Float32:
			f.Kind, f.Value = "float", strconv.FormatFloat(fv.Float(), 'g', -1, 64)
		default:
			continue
		}
		out = append(out, f)
	}
	return out
}

// policyJSON is p as a JSON object of its fields by snake-case name.
func policyJSON(p work.KindPolicy) map[string]any {
	m := map[string]any{}
	v := reflect.ValueOf(p)
	for _, f := range policyFields(p) {
		m[f.Name] = v.FieldByName(f.Go).Interface()
	}
	return m
}

// setPolicyField sets the field named name (snake case) of p from s; form says s is a form's
// value (a checkbox: "on" or absent), not JSON's.
func setPolicyField(p *work.KindPolicy, f policyField, s string) error {
	fv := reflect.ValueOf(p).Elem().FieldByName(f.Go)
	switch f.Kind {
	case "bool":
		b := s == "on" || s == "true" || s == "1"
		if !b && s != "" && s != "off" && s != "false" && s != "0" {
			return badRequest("%s %q is not true or false", f.Name, s)
		}
		fv.SetBool(b)
	case "int":
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if s == "" {
			n, err = 0, nil
		}
		if err != nil || fv.OverflowInt(n) {
			return badRequest("%s %q is not a whole number", f.Name, s)
		}
		fv.SetInt(n)
	case "float":
		x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if s == "" {
			x, err = 0, nil
		}
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return badRequest("%s %q is not a finite number", f.Name, s)
		}
		fv.SetFloat(x)
	}
	return nil
}

func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// kindRow is one kind on /kinds and /api/kinds.
type kindRow struct {
	Kind      string         `json:"kind"`
	Counts    stateCountJSON `json:"tasks"`
	States    [nStates]int64 `json:"-"`
	Total     int64          `json:"-"`
	DueNow    *int64         `json:"due_now,omitempty"`          // now only
	DueMore   bool           `json:"due_now_at_least,omitempty"` // DueNow is a lower bound: the count stopped at dueScanMax
	OldestDue string         `json:"oldest_due_age,omitempty"`   // now only
	OldestAge string         `json:"-"`                          // human
	Policy    map[string]any `json:"policy"`
	PolicySeq uint64         `json:"policy_seq,omitempty"` // the kind_policy_set in force
	Fields    []policyField  `json:"-"`
	Paused    bool           `json:"paused"`
	Running   int64          `json:"running"`                // tasks running (at the page's seq)
	Slots     *int           `json:"slots_in_use,omitempty"` // now, with MaxRunning: tasks under unexpired leases
	Tokens    *float64       `json:"rate_tokens,omitempty"`  // now, with a rate: the bucket
	// SessionSlots is, now, with MaxRunningPerSession, the slots each session holds (the
	// sessions holding any).
	SessionSlots map[string]int `json:"slots_by_session,omitempty"`
	TokensStr    string         `json:"-"`
}

// dueScanMax bounds the due count of one kind: the count walks the kind's due index up to
// now and stops here (the page then says "at least").
const dueScanMax = 100_000

// kindsAt is every kind (with a task or a policy by seq) at the cut. Call with the index
// read-locked; st is the queue's Stats when the cut is now (nil in the past).
func (c *Console) kindsAt(ct cut, st *work.QueueStats) []kindRow {
	ix := c.ix
	counts := ix.countsAt(ix.pos(ct.seq))
	names := slices.Clone(ix.kinds)
	for k := range ix.pols {
		if !slices.Contains(names, k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var rows []kindRow
	for _, k := range names {
		pe := ix.policyAt(k, ct.seq)
		v := counts[k]
		if v == nil && pe == nil {
			continue
		}
		row := kindRow{Kind: k}
		if v != nil {
			row.States = *v
			row.Counts = countJSON(*v)
			row.Total = row.Counts.Total
			row.Running = v[events.StateRunning]
		}
		p := policyOfEvent(pe)
		if pe != nil {
			row.PolicySeq = pe.Seq
		}
		row.Policy, row.Fields, row.Paused = policyJSON(p), policyFields(p), p.Paused
		if st != nil {
			now := st.At.UnixNano()
			n, oldest, more := ix.dueOf(k, now)
			row.DueNow, row.DueMore = &n, more
			if n > 0 {
				row.OldestDue = time.Duration(now - oldest).String()
				row.OldestAge = fmtDuration(time.Duration(now - oldest))
			}
			for _, ps := range st.Policies {
				if ps.Kind != k {
					continue
				}
				if ps.Policy.MaxRunning > 0 {
					r := ps.Running
					row.Slots = &r
				}
				if ps.Policy.MaxRunningPerSession > 0 {
					// Stats counts Running only with MaxRunning; the sessions' slots add up
					// to the kind's.
					row.SessionSlots = ps.RunningBySession
					if row.Slots == nil {
						r := 0
						for _, n := range ps.RunningBySession {
							r += n
						}
						row.Slots = &r
					}
				}
				if ps.Policy.Rate > 0 {
					tk := ps.Tokens
					row.Tokens = &tk
					row.TokensStr = strconv.FormatFloat(tk, 'f', 1, 64)
				}
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// dueOf counts kind's due tasks at now (pending and scheduled by now, or running with an
// expired lease: the queue's own due index, kept by the index's fold) and the oldest one's
// eligible time. Call with the index read-locked, after catchUp built the due indexes.
func (ix *index) dueOf(kind string, now int64) (n, oldest int64, more bool) {
	if !ix.dueBuilt.Load() {
		return 0, 0, false
	}
	_ = ix.mem.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, now, func(e projection.IndexEntry) bool {
		if n == 0 || e.At < oldest {
			oldest = e.At
		}
		n++
		if n == dueScanMax {
			more = true
			return false
		}
		return true
	})
	return n, oldest, more
}

type kindsData struct {
	States  [nStates]string
	Rows    []kindRow
	Live    bool
	Actions bool
	Err     string
}

// kinds is GET /kinds: per kind its counts by state, due tasks, policy and slots in use;
// with actions on (and now) pause, resume and the policy's form.
func (c *Console) kinds(r *http.Request, p *page) (string, error) {
	p.Title, p.Nav = "Kinds", "kinds"
	d := &kindsData{States: stateNames, Live: !p.Past, Actions: c.actions && !p.Past}
	var st *work.QueueStats
	if !p.Past {
		s, err := c.q.Stats(r.Context())
		if err != nil {
			d.Err = err.Error()
		} else {
			st = &s
		}
	}
	d.Rows = c.kindsAt(p.Cut, st)
	p.Data = d
	return "kinds", nil
}

// apiKinds is GET /api/kinds.
func (c *Console) apiKinds(r *http.Request) (any, error) {
	c.ix.wantDue.Store(true)
	if err := c.ix.catchUp(r.Context()); err != nil {
		return nil, err
	}
	var st *work.QueueStats
	c.ix.mu.RLock()
	ct, he := c.cutOf(r)
	c.ix.mu.RUnlock()
	if he != nil {
		return nil, he
	}
	if !ct.past {
		s, err := c.q.Stats(r.Context())
		if err != nil {
			return nil, err
		}
		st = &s
	}
	c.ix.mu.RLock()
	defer c.ix.mu.RUnlock()
	rows := c.kindsAt(ct, st)
	if rows == nil {
		rows = []kindRow{}
	}
	return struct {
		AtSeq uint64    `json:"at_seq"`
		Kinds []kindRow `json:"kinds"`
	}{ct.seq, rows}, nil
}

// kindAction is POST /api/kinds/{kind}/pause, /resume and /policy: the kind's policy read
// from the queue (Queue.KindPolicies), changed, and set (Queue.SetKindPolicy: one
// kind_policy_set). /policy takes the fields by their snake-case names, from the page's form
// (every field; a checkbox absent is false) or a JSON object (the fields it names; the
// others kept).
func (c *Console) kindAction(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		form, fail := c.failer(w, r)
		kind := r.PathValue("kind")
		ctx := r.Context()
		c.ix.wantDue.Store(true) // the answer counts the kind's due tasks
		pols, err := c.q.KindPolicies(ctx)
		if err != nil {
			fail(asHTTPError(err))
			return
		}
		p := pols[kind]
		switch op {
		case "pause":
			p.Paused = true
		case "resume":
			p.Paused = false
		case "policy":
			if err := c.readPolicy(r, form, &p); err != nil {
				fail(asHTTPError(err))
				return
			}
		}
		if err := c.q.SetKindPolicy(ctx, kind, p); err != nil {
			fail(asHTTPError(err))
			return
		}
		if form {
			w.Header().Set("Location", "../../../kinds")
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		if err := c.ix.catchUp(ctx); err != nil {
			fail(asHTTPError(err))
			return
		}
		c.kindAnswer(ctx, w, kind)
	}
}

func (c *Console) kindAnswer(ctx context.Context, w http.ResponseWriter, kind string) {
	st, err := c.q.Stats(ctx)
	if err != nil {
		writeJSONError(w, asHTTPError(err))
		return
	}
	c.ix.mu.RLock()
	defer c.ix.mu.RUnlock()
	for _, row := range c.kindsAt(cut{seq: c.ix.lastSeq, head: c.ix.lastSeq}, &st) {
		if row.Kind == kind {
			writeJSON(w, http.StatusOK, row)
			return
		}
	}
	writeJSON(w, http.StatusOK, kindRow{Kind: kind, Policy: policyJSON(work.KindPolicy{})})
}

// readPolicy reads a policy's fields over p.
func (c *Console) readPolicy(r *http.Request, form bool, p *work.KindPolicy) error {
	fields := policyFields(*p)
	if form {
		if err := r.ParseForm(); err != nil {
			return badRequest("the form could not be read: %v", err)
		}
		for _, f := range fields {
			if err := setPolicyField(p, f, r.PostForm.Get(f.Name)); err != nil {
				return err
			}
		}
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10)).Decode(&m); err != nil {
		return badRequest("the body is not a JSON object of policy fields: %v", err)
	}
	for name, raw := range m {
		i := slices.IndexFunc(fields, func(f policyField) bool { return f.Name == name })
		if i < 0 {
			names := make([]string, len(fields))
			for j, f := range fields {
				names[j] = f.Name
			}
			return badRequest("%q is not a policy field: one of %s", name, strings.Join(names, ", "))
		}
		s := strings.Trim(string(raw), `"`)
		if err := setPolicyField(p, fields[i], s); err != nil {
			return err
		}
	}
	return nil
}
