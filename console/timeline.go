package console

import (
	"fmt"
	"time"

	"github.com/worklog/worklog/events"
)

// timeline is a session's interactive timeline (replay timeline --html, live): one row per
// task, its attempts as bars, marks for submit, heartbeats, releases, fenced settlements and
// wakes. Coordinates are computed here; the template only draws them.
type timeline struct {
	Width, Height int
	Rows          []tlRow
	From, To      string
	Ticks         []tlTick // the time axis: a label at each round time of the scale
	Page, Pages   int      // this page of rows (1-based) and how many there are
	First, Last   int      // the tasks drawn: the First-th to the Last-th of the session
	Tasks         int      // the session's tasks in all
	PrevPage      int      // 0: none
	NextPage      int      // 0: none
}

// tlTick is one mark of the time axis.
type tlTick struct {
	X     int
	Label string
}

type tlRow struct {
	Y     int
	Task  string
	Label string
	Bars  []tlBar
	Marks []tlMark
}

type tlBar struct {
	X, W, Y int
	Class   string
	Title   string
}

type tlMark struct {
	X, Y  int
	Class string
	Glyph string
	Title string
}

const (
	tlLeft   = 170
	tlWidth  = 900
	tlRight  = tlWidth - 10 // the plot is x from tlLeft to tlRight
	tlRowH   = 22
	tlTop    = 20 // the axis's labels are above the first row
	tlPerPag = 50 // rows (tasks) on one page of the timeline
)

// buildTimeline draws page (1-based; out of range: the last) of a session's timeline: its
// tasks in submission order, tlPerPag at a time. The time scale is the page's own: from the
// first to the last event of the tasks it draws (a task still holding its claim reaches to
// cutAt or its lease's end, whichever is first), so neither other pages' tasks nor a long
// wait after the session's work squeeze its bars against an edge.
func buildTimeline(evs []events.Event, cutAt int64, page int) *timeline {
	if len(evs) == 0 {
		return nil
	}
	// The page's tasks, and the completion wakes that are theirs.
	var order []string
	for _, ev := range evs {
		if e, ok := ev.(*events.TaskSubmitted); ok {
			order = append(order, e.TaskID)
		}
	}
	if len(order) == 0 {
		return nil
	}
	pages := (len(order) + tlPerPag - 1) / tlPerPag
	page = min(max(page, 1), pages)
	onPage := map[string]bool{}
	for _, id := range order[(page-1)*tlPerPag : min(page*tlPerPag, len(order))] {
		onPage[id] = true
	}
	wakeOf := map[string]string{}
	mine := func(ev events.Event) bool {
		tid, wid := ev.Subject()
		if wr, ok := ev.(*events.WakeRecorded); ok && wr.Reason == events.WakeTaskFinished {
			wakeOf[wr.WakeID] = wr.TaskID
			return onPage[wr.TaskID]
		}
		if tid != "" {
			return onPage[tid]
		}
		return onPage[wakeOf[wid]]
	}
	lo, hi := int64(0), int64(0)
	seen := false
	leaseOf := map[string]int64{} // the claims still open: their lease's end
	for _, ev := range evs {
		if !mine(ev) {
			continue
		}
		at := ev.Head().At
		if !seen {
			lo, hi, seen = at, at, true
		}
		lo, hi = min(lo, at), max(hi, at)
		switch e := ev.(type) {
		case *events.TaskClaimed:
			leaseOf[e.TaskID] = e.LeaseExpiresAt
		case *events.TaskExtended:
			leaseOf[e.TaskID] = e.LeaseExpiresAt
		case *events.TaskSettled:
			delete(leaseOf, e.TaskID)
		case *events.TaskReleased:
			delete(leaseOf, e.TaskID)
		}
	}
	for _, end := range leaseOf { // an open claim's bar reaches its lease's end or the cut
		hi = max(hi, min(end, cutAt))
	}
	if hi <= lo {
		hi = lo + 1
	}
	span := hi - lo
	x := func(at int64) int {
		at = min(max(at, lo), hi)
		return tlLeft + int((at-lo)*int64(tlRight-tlLeft)/span)
	}
	tl := &timeline{Width: tlWidth + 30, // room for the last tick's label
		From: fmtTime(lo), To: fmtTime(hi), Page: page, Pages: pages,
		First: (page-1)*tlPerPag + 1, Last: min(page*tlPerPag, len(order)), Tasks: len(order)}
	if page > 1 {
		tl.PrevPage = page - 1
	}
	if page < pages {
		tl.NextPage = page + 1
	}
	tl.Ticks = axisTicks(lo, hi, x)
	rows := map[string]int{}
	open := map[string]*tlBar{}
	openAt := map[string]int64{}
	wakeTask := map[string]string{}
	row := func(taskID string) *tlRow {
		i, ok := rows[taskID]
		if !ok {
			return nil
		}
		return &tl.Rows[i]
	}
	closeBar := func(r *tlRow, taskID string, at int64, class, how string) {
		b := open[taskID]
		if b == nil {
			return
		}
		b.W = max(x(at)-b.X, 2)
		b.Class = class
		b.Title += "; " + how + " at " + fmtTime(at)
		b.Y = r.Y + 3
		r.Bars = append(r.Bars, *b)
		delete(open, taskID)
	}
	for _, ev := range evs {
		h := ev.Head()
		switch e := ev.(type) {
		case *events.TaskSubmitted:
			if !onPage[e.TaskID] {
				continue
			}
			rows[e.TaskID] = len(tl.Rows)
			tl.Rows = append(tl.Rows, tlRow{Y: tlTop + len(tl.Rows)*tlRowH, Task: e.TaskID, Label: clip(e.Kind, 18) + " …" + tail(e.TaskID, 6)})
			r := &tl.Rows[len(tl.Rows)-1]
			r.Marks = append(r.Marks, tlMark{X: x(h.At), Class: "m-submit", Glyph: "●", Title: fmt.Sprintf("seq %d submitted at %s", h.Seq, fmtTime(h.At))})
		case *events.TaskClaimed:
			r := row(e.TaskID)
			if r == nil {
				continue
			}
			if open[e.TaskID] != nil {
				closeBar(r, e.TaskID, h.At, "b-expired", "lease expired, redelivered")
			}
			title := fmt.Sprintf("attempt %d claimed at %s (seq %d)", e.Attempt, fmtTime(h.At), h.Seq)
			if e.Worker != "" {
				title += " by " + e.Worker
			}
			open[e.TaskID] = &tlBar{X: x(h.At), Title: title}
			openAt[e.TaskID] = e.LeaseExpiresAt
		case *events.TaskExtended:
			if r := row(e.TaskID); r != nil {
				openAt[e.TaskID] = e.LeaseExpiresAt
				r.Marks = append(r.Marks, tlMark{X: x(h.At), Class: "m-beat", Glyph: "|", Title: fmt.Sprintf("heartbeat of attempt %d at %s: lease until %s", e.Attempt, fmtTime(h.At), fmtTime(e.LeaseExpiresAt))})
			}
		case *events.TaskSettled:
			if r := row(e.TaskID); r != nil {
				closeBar(r, e.TaskID, h.At, "b-"+e.Outcome.State.String(), outcomeText(e.Outcome))
			}
		case *events.TaskReleased:
			if r := row(e.TaskID); r != nil {
				closeBar(r, e.TaskID, h.At, "b-released", "released")
				r.Marks = append(r.Marks, tlMark{X: x(h.At), Class: "m-release", Glyph: "↺", Title: fmt.Sprintf("released by attempt %d at %s", e.Attempt, fmtTime(h.At))})
			}
		case *events.TaskSettleRejected:
			if r := row(e.TaskID); r != nil {
				r.Marks = append(r.Marks, tlMark{X: x(h.At), Class: "m-reject", Glyph: "✕", Title: fmt.Sprintf("stale settlement of attempt %d rejected at %s (%s)", e.Attempt, fmtTime(h.At), e.Reason)})
			}
		case *events.TaskCancelRequested:
			if r := row(e.TaskID); r != nil {
				r.Marks = append(r.Marks, tlMark{X: x(h.At), Class: "m-cancel", Glyph: "⊘", Title: "cancel requested at " + fmtTime(h.At)})
			}
		case *events.WakeRecorded:
			if e.Reason == events.WakeTaskFinished {
				wakeTask[e.WakeID] = e.TaskID
				if r := row(e.TaskID); r != nil {
					r.Marks = append(r.Marks, tlMark{X: x(h.At), Class: "m-wake", Glyph: "◆", Title: "completion wake " + e.WakeID + " recorded at " + fmtTime(h.At)})
				}
			}
		case *events.WakeAcked:
			if r := row(wakeTask[e.WakeID]); r != nil {
				r.Marks = append(r.Marks, tlMark{X: x(h.At), Class: "m-ack", Glyph: "✓", Title: "wake acknowledged at " + fmtTime(h.At)})
			}
		}
	}
	for id, b := range open {
		r := row(id)
		end, how, class := openAt[id], "lease ends", "b-running"
		if end <= cutAt {
			how, class = "lease expired", "b-expired"
		} else {
			end = cutAt
			how = "holds the claim"
		}
		closeBar(r, id, end, class, how)
		_ = b
	}
	for i := range tl.Rows {
		for j := range tl.Rows[i].Marks {
			tl.Rows[i].Marks[j].Y = tl.Rows[i].Y + 15
		}
	}
	tl.Height = tlTop + 10 + len(tl.Rows)*tlRowH
	return tl
}

// tlSteps are the axis's candidate intervals: the first that puts at most tlMaxTicks marks
// on the span is the scale.
var tlSteps = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
	2 * 24 * time.Hour, 7 * 24 * time.Hour, 14 * 24 * time.Hour, 30 * 24 * time.Hour, 90 * 24 * time.Hour, 365 * 24 * time.Hour,
}

const tlMaxTicks = 8

// axisTicks marks every round multiple of the scale's step between lo and hi (UTC), labelled
// as precisely as the step needs.
func axisTicks(lo, hi int64, x func(int64) int) []tlTick {
	step := tlSteps[len(tlSteps)-1]
	for _, s := range tlSteps {
		if (hi-lo)/int64(s) < tlMaxTicks {
			step = s
			break
		}
	}
	layout := "15:04:05.000"
	switch {
	case step >= 24*time.Hour:
		layout = "2006-01-02"
	case step >= time.Minute:
		layout = "01-02 15:04"
	case step >= time.Second:
		layout = "15:04:05"
	}
	var out []tlTick
	first := (lo + int64(step) - 1) / int64(step) * int64(step)
	if lo < 0 {
		first = lo / int64(step) * int64(step)
	}
	for t := first; t <= hi; t += int64(step) {
		out = append(out, tlTick{X: x(t), Label: time.Unix(0, t).UTC().Format(layout)})
	}
	return out
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
