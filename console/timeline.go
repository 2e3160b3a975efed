package console

import (
	"fmt"

	"github.com/worklog/worklog/events"
)

// timeline is a session's interactive timeline (replay timeline --html, live): one row per
// task, its attempts as bars, marks for submit, heartbeats, releases, fenced settlements and
// wakes. Coordinates are computed here; the template only draws them.
type timeline struct {
	Width, Height int
	Rows          []tlRow
	From, To      string
	Omitted       int
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
	tlRowH   = 22
	tlMaxRow = 80
)

func buildTimeline(evs []events.Event, cutAt int64) *timeline {
	if len(evs) == 0 {
		return nil
	}
	lo, hi := evs[0].Head().At, evs[0].Head().At
	for _, ev := range evs {
		at := ev.Head().At
		lo, hi = min(lo, at), max(hi, at)
		if c, ok := ev.(*events.TaskClaimed); ok {
			hi = max(hi, min(c.LeaseExpiresAt, cutAt))
		}
	}
	hi = max(hi, cutAt)
	if hi <= lo {
		hi = lo + 1
	}
	span := hi - lo
	x := func(at int64) int {
		at = min(max(at, lo), hi)
		return tlLeft + int((at-lo)*int64(tlWidth-tlLeft-10)/span)
	}
	tl := &timeline{Width: tlWidth, From: fmtTime(lo), To: fmtTime(hi)}
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
			if len(tl.Rows) == tlMaxRow {
				tl.Omitted++
				continue
			}
			rows[e.TaskID] = len(tl.Rows)
			tl.Rows = append(tl.Rows, tlRow{Y: 20 + len(tl.Rows)*tlRowH, Task: e.TaskID, Label: clip(e.Kind, 18) + " …" + tail(e.TaskID, 6)})
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
	tl.Height = 30 + len(tl.Rows)*tlRowH
	return tl
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
