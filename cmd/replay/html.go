package main

import (
	"fmt"
	"html"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
)

// The timeline page is self-contained: inline CSS, inline SVG, no script, no font, no link to
// anything outside the file, so it can be mailed or attached to an incident as it is.

const (
	htmlLabelW = 270 // the label column
	htmlChartW = 880 // the time axis
	htmlRowH   = 30
	htmlTopH   = 34 // the axis labels above the rows
	// htmlMaxRows caps the chart's rows (6,000 px of them).
	htmlMaxRows = 200
)

const htmlStyle = `
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; margin: 24px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.sub { color: #59636e; margin: 0 0 16px; }
svg { display: block; }
svg text { font: 12px system-ui, sans-serif; fill: #1f2328; }
svg .axis text { fill: #59636e; font-size: 11px; }
svg .grid { stroke: #eaeef2; }
svg text.note { paint-order: stroke; stroke: #f6f8fa; stroke-width: 5px; fill: #59636e; }
svg .rowbg { fill: #f6f8fa; }
svg .pending { stroke: #8c959f; stroke-width: 2; }
svg .waiting { stroke: #8c959f; stroke-width: 2; stroke-dasharray: 3 3; }
svg .lease { stroke-width: 1; rx: 3; }
svg .lease.settled-succeeded, svg .lease.acked { fill: #aceebb; stroke: #1a7f37; }
svg .lease.settled-failed { fill: #ffcecb; stroke: #cf222e; }
svg .lease.settled-canceled { fill: #d8dee4; stroke: #59636e; }
svg .lease.expired { fill: url(#hatch); stroke: #bc4c00; }
svg .lease.open { fill: #b6e3ff; stroke: #0969da; }
svg .lease.released { fill: #fff8c5; stroke: #9a6700; }
svg .m { stroke: #fff; stroke-width: 1.5; }
svg .m-submitted { fill: #0969da; }
svg .m-claimed { fill: #1f2328; }
svg .m-expired { fill: #bc4c00; }
svg .m-cancel { fill: #8250df; }
svg .m-settled-succeeded, svg .m-acked { fill: #1a7f37; }
svg .m-settled-failed { fill: #cf222e; }
svg .m-settled-canceled { fill: #59636e; }
svg .m-rejected { fill: none; stroke: #cf222e; stroke-width: 2.5; }
svg .m-wake, svg .m-recorded { fill: #bf8700; }
svg .m-extended { fill: #0969da; }
svg .m-released { fill: #9a6700; }
svg .m-retried { fill: #8250df; }
svg .m-schedule { fill: #0969da; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 4px 0 12px; color: #59636e; font-size: 13px; }
.legend span { display: inline-flex; align-items: center; gap: 6px; }
.sw { display: inline-block; width: 22px; height: 10px; border: 1px solid; border-radius: 3px; }
h2 { font-size: 15px; margin: 22px 0 4px; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
h2 small { font-family: system-ui, sans-serif; font-weight: normal; color: #59636e; }
table { border-collapse: collapse; font-size: 13px; }
td { padding: 2px 12px 2px 0; vertical-align: top; }
td.t, td.s { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; color: #59636e; white-space: nowrap; }
tr.inferred td { color: #bc4c00; font-style: italic; }
`

func timelineHTML(s *sessionStory, dir string) string {
	var b strings.Builder
	e := html.EscapeString
	t0, t1 := s.FirstAt, s.lastLeaseEnd()
	if t1 <= t0 {
		t1 = t0 + int64(time.Second)
	}
	pad := (t1 - t0) / 40
	t0, t1 = t0-pad, t1+pad
	x := func(ns int64) float64 {
		return htmlLabelW + float64(ns-t0)/float64(t1-t0)*htmlChartW
	}
	// The chart draws at most htmlMaxRows rows, tasks first: a session of hundreds of tasks
	// would make a page thousands of pixels tall. The table below has every event.
	chartTasks := s.Tasks[:min(len(s.Tasks), htmlMaxRows)]
	chartWakes := s.Wakes[:min(len(s.Wakes), htmlMaxRows-len(chartTasks))]
	rows := len(chartTasks) + len(chartWakes)
	width := htmlLabelW + htmlChartW + 20
	height := htmlTopH + rows*htmlRowH + 10

	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Session %s: timeline</title>\n<style>%s</style>\n</head>\n<body>\n",
		e(s.Session), htmlStyle)
	fmt.Fprintf(&b, "<h1>Session %s</h1>\n<p class=\"sub\">%s, %s, %s between seq %d and %d, %s to %s UTC. Store: %s.</p>\n",
		e(s.Session), plural(len(s.Tasks), "task", "tasks"), plural(len(s.Wakes), "wake", "wakes"),
		plural(s.Events, "event", "events"), s.FirstSeq, s.LastSeq, e(fmtTime(s.FirstAt)), e(fmtTime(s.LastAt)), e(dir))

	// The legend above the chart, where it is read first.
	b.WriteString(`<div class="legend">
<span><i class="sw" style="background:#aceebb;border-color:#1a7f37"></i>lease, settled (succeeded) or acknowledged</span>
<span><i class="sw" style="background:#ffcecb;border-color:#cf222e"></i>lease, settled (failed)</span>
<span><i class="sw" style="background:#d8dee4;border-color:#59636e"></i>lease, settled (canceled)</span>
<span><i class="sw" style="background:repeating-linear-gradient(45deg,#fb8f44 0 2px,#fff1e5 2px 6px);border-color:#bc4c00"></i>lease expired without a settlement</span>
<span><i class="sw" style="background:#b6e3ff;border-color:#0969da"></i>lease still open</span>
<span><i class="sw" style="background:#fff8c5;border-color:#9a6700"></i>lease ended by a release</span>
<span>` + legendIcon(`<circle cx="7" cy="7" r="5.5" fill="#0969da"/>`) + `submitted</span>
<span>` + legendIcon(`<circle cx="7" cy="7" r="5.5" fill="#1f2328"/>`) + `claimed</span>
<span>` + legendIcon(`<path d="M7 1 l6 6 l-6 6 l-6 -6 z" fill="#bc4c00"/>`) + `lease expired (inferred)</span>
<span>` + legendIcon(`<path d="M7 1 l6 11 l-12 0 z" fill="#8250df"/>`) + `cancel requested</span>
<span>` + legendIcon(`<path d="M7 1 l6 11 l-12 0 z" fill="#bf8700"/>`) + `wake recorded</span>
<span>` + legendIcon(`<circle cx="7" cy="7" r="5.5" fill="#1a7f37"/>`) + `settled / acknowledged</span>
<span>` + legendIcon(`<path d="M2 2 l10 10 m0 -10 l-10 10" stroke="#cf222e" stroke-width="2.5"/>`) + `stale delivery rejected</span>
<span>` + legendIcon(`<circle cx="7" cy="7" r="3" fill="#0969da"/>`) + `lease extended (heartbeat)</span>
<span>` + legendIcon(`<rect x="2" y="2" width="10" height="10" fill="#9a6700"/>`) + `released: pending again</span>
<span>dashed: waiting for its scheduled time; grey: due, not claimed</span>
</div>
`)
	if all := len(s.Tasks) + len(s.Wakes); rows < all {
		fmt.Fprintf(&b, "<p class=\"sub\">The chart shows the first %d of %d rows (%s, %s); narrow it with --state or --task-kind. The table below lists every event.</p>\n",
			rows, all, plural(len(chartTasks), "task", "tasks"), plural(len(chartWakes), "wake", "wakes"))
	}
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"timeline of session %s\">\n",
		width, height, width, height, e(s.Session))
	b.WriteString(`<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff1e5"/><line x1="0" y1="0" x2="0" y2="6" stroke="#fb8f44" stroke-width="2.5"/></pattern></defs>` + "\n")

	// Rows first, so the grid and the marks draw over them.
	for i := 0; i < rows; i++ {
		if i%2 == 0 {
			fmt.Fprintf(&b, "<rect class=\"rowbg\" x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\"/>\n", htmlTopH+i*htmlRowH, width, htmlRowH)
		}
	}
	// The time axis: a tick every "nice" step, labelled above.
	step := niceStep(time.Duration(t1 - t0))
	b.WriteString("<g class=\"axis\">\n")
	first := (t0/int64(step) + 1) * int64(step)
	for tk := first; tk <= t1; tk += int64(step) {
		xx := x(tk)
		fmt.Fprintf(&b, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>", xx, htmlTopH-6, xx, height-10)
		label := clock(tk)
		if step >= time.Second {
			label = time.Unix(0, tk).UTC().Format("15:04:05")
		}
		fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", xx, htmlTopH-12, label)
	}
	b.WriteString("</g>\n")

	row := 0
	y := func() int { return htmlTopH + row*htmlRowH + htmlRowH/2 }
	tip := func(m mark) string {
		seq := "inferred, not an event"
		if m.Seq != 0 {
			seq = fmt.Sprintf("seq %d", m.Seq)
		}
		return e(fmt.Sprintf("%s (%s): %s", fmtTime(m.At), seq, m.Text))
	}
	drawMarks := func(ms []mark) {
		for _, m := range ms {
			cls := "m " + markCSS(m)
			cx, cy := x(m.At), y()
			switch m.Kind {
			case markRejected: // a cross
				fmt.Fprintf(&b, "<path class=\"%s\" d=\"M%.1f %d l10 10 m0 -10 l-10 10\"><title>%s</title></path>\n",
					cls, cx-5, cy-5, tip(m))
			case markExpired: // a diamond
				fmt.Fprintf(&b, "<path class=\"%s\" d=\"M%.1f %d l6 6 l-6 6 l-6 -6 z\"><title>%s</title></path>\n", cls, cx, cy-6, tip(m))
			case markCancel, markWake, markRecorded: // a triangle
				fmt.Fprintf(&b, "<path class=\"%s\" d=\"M%.1f %d l6 11 l-12 0 z\"><title>%s</title></path>\n", cls, cx, cy-6, tip(m))
			case markExtended: // a small dot on the bar: heartbeats may be many
				fmt.Fprintf(&b, "<circle class=\"%s\" cx=\"%.1f\" cy=\"%d\" r=\"3\"><title>%s</title></circle>\n", cls, cx, cy, tip(m))
			case markReleased: // a square
				fmt.Fprintf(&b, "<rect class=\"%s\" x=\"%.1f\" y=\"%d\" width=\"10\" height=\"10\"><title>%s</title></rect>\n", cls, cx-5, cy-5, tip(m))
			default:
				fmt.Fprintf(&b, "<circle class=\"%s\" cx=\"%.1f\" cy=\"%d\" r=\"5.5\"><title>%s</title></circle>\n", cls, cx, cy, tip(m))
			}
		}
	}
	drawLeases := func(ls []*leaseSpan, settled events.TaskState, what string) {
		for _, l := range ls {
			cls := "lease " + string(l.End)
			if l.End == endSettled {
				cls = "lease settled-" + settled.String()
			}
			if l.End == endRelease && l.Canceled { // the release settled it: drawn as a cancellation
				cls = "lease settled-" + events.StateCanceled.String()
			}
			x0, x1 := x(l.ClaimAt), x(l.EndAt)
			if x1-x0 < 2 {
				x1 = x0 + 2
			}
			title := fmt.Sprintf("%s %d: claimed %s (seq %d), lease until %s, %s", what, l.Attempt, fmtTime(l.ClaimAt), l.ClaimSeq, fmtTime(l.Until), l.End)
			if l.End == endSettled || l.End == endAcked || l.End == endRelease {
				title += " at " + fmtTime(l.EndAt)
			}
			if l.Canceled {
				title += " while a cancel was requested: canceled"
			}
			if l.Extensions > 0 {
				title += fmt.Sprintf(" (%s)", plural(l.Extensions, "lease extension", "lease extensions"))
			}
			fmt.Fprintf(&b, "<rect class=\"%s\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\"><title>%s</title></rect>\n",
				cls, x0, y()-8, x1-x0, 16, e(title))
		}
	}
	label := func(text, title string) {
		fmt.Fprintf(&b, "<text x=\"8\" y=\"%d\"><title>%s</title>%s</text>\n", y()+4, e(title), e(text))
	}

	for _, t := range chartTasks {
		label(fmt.Sprintf("%s · %s", clip(t.Kind, 16), shortID(t.ID)), t.ID+": "+s.taskSummary(t))
		// Waiting for the scheduled time (dashed), then due and pending (solid) until the first
		// claim or the cancellation.
		end := min(s.EndAt, t1)
		if len(t.Leases) > 0 {
			end = t.Leases[0].ClaimAt
		} else if t.State.Terminal() {
			end = t.FinishedAt
		}
		if t.ScheduledAt > t.SubmitAt {
			fmt.Fprintf(&b, "<line class=\"waiting\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x(t.SubmitAt), y(), x(min(t.ScheduledAt, end)), y())
			if t.ScheduledAt > t1 && len(t.Leases) == 0 && !t.State.Terminal() {
				fmt.Fprintf(&b, "<text class=\"note\" x=\"%.1f\" y=\"%d\" text-anchor=\"end\">due %s →</text>\n", x(t1)-4, y()+4, e(s.timeCol(t.ScheduledAt)))
			}
		}
		if end > t.ScheduledAt {
			fmt.Fprintf(&b, "<line class=\"pending\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x(max(t.ScheduledAt, t.SubmitAt)), y(), x(end), y())
		}
		// Pending again after each release: waiting for its RunAt (dashed), then due (solid),
		// until the next claim, its cancellation, or the end of the log.
		for _, w := range t.Waits {
			end := min(s.EndAt, t1)
			if w.Ended {
				end = w.Until
			}
			if w.DueAt > w.From {
				fmt.Fprintf(&b, "<line class=\"waiting\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x(w.From), y(), x(min(w.DueAt, end)), y())
				if w.DueAt > t1 && !w.Ended {
					fmt.Fprintf(&b, "<text class=\"note\" x=\"%.1f\" y=\"%d\" text-anchor=\"end\">due %s →</text>\n", x(t1)-4, y()+4, e(s.timeCol(w.DueAt)))
				}
			}
			if end > w.DueAt {
				fmt.Fprintf(&b, "<line class=\"pending\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x(max(w.DueAt, w.From)), y(), x(end), y())
			}
		}
		drawLeases(t.Leases, t.State, "attempt")
		drawMarks(t.Marks)
		row++
	}
	for _, w := range chartWakes {
		label(fmt.Sprintf("wake · %s", shortID(w.ID)), w.ID+" ("+wakeLabel(w)+"): "+s.wakeSummary(w))
		end := min(s.EndAt, t1)
		if len(w.Leases) > 0 {
			end = w.Leases[0].ClaimAt
		}
		fmt.Fprintf(&b, "<line class=\"pending\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x(w.CreatedAt), y(), x(end), y())
		drawLeases(w.Leases, events.StateSucceeded, "delivery")
		drawMarks(w.Marks)
		row++
	}
	b.WriteString("</svg>\n")

	row2 := func(m mark) {
		seq, cls := "-", " class=\"inferred\""
		if m.Seq != 0 {
			seq, cls = fmt.Sprintf("#%d", m.Seq), ""
		}
		fmt.Fprintf(&b, "<tr%s><td class=\"t\">%s</td><td class=\"s\">%s</td><td>%s</td></tr>\n", cls, e(fmtTime(m.At)), seq, e(m.Text))
	}
	for _, t := range s.Tasks {
		fmt.Fprintf(&b, "<h2>task %s <small>%s: %s</small></h2>\n<table>\n", e(t.ID), e(t.Kind), e(s.taskSummary(t)))
		for _, m := range t.Marks {
			row2(m)
		}
		b.WriteString("</table>\n")
	}
	for _, w := range s.Wakes {
		fmt.Fprintf(&b, "<h2>wake %s <small>%s: %s</small></h2>\n<table>\n", e(w.ID), e(wakeLabel(w)), e(s.wakeSummary(w)))
		for _, m := range w.Marks {
			row2(m)
		}
		b.WriteString("</table>\n")
	}
	for _, x := range s.Schedules {
		state := "live"
		if x.Removed {
			state = "removed"
		}
		fmt.Fprintf(&b, "<h2>schedule %s <small>%s</small></h2>\n<table>\n", e(x.Name), state)
		for _, m := range x.Marks {
			row2(m)
		}
		b.WriteString("</table>\n")
	}
	b.WriteString("</body>\n</html>\n")
	return b.String()
}

// markCSS is the class of a mark's shape: its kind, or for a mark that settled the task
// (a settlement, a cancel of pending work, a release that canceled) the outcome's.
func markCSS(m mark) string {
	if m.Kind == markSettled || ((m.Kind == markCancel || m.Kind == markReleased) && m.State == events.StateCanceled) {
		return "m-settled-" + m.State.String()
	}
	return "m-" + string(m.Kind)
}

// niceStep picks a tick step that gives at most about ten ticks.
func niceStep(span time.Duration) time.Duration {
	steps := []time.Duration{
		time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
		20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond,
		500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
		15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
		10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour,
		6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
	}
	for _, s := range steps {
		if span/s <= 10 {
			return s
		}
	}
	d := 24 * time.Hour
	for span/d > 10 {
		d *= 2
	}
	return d
}

// shortID keeps an id's prefix and its random tail: "task_…3f9a12".
func shortID(id string) string {
	i := strings.IndexByte(id, '_')
	if i < 0 || len(id) <= 20 {
		return id
	}
	return id[:i+1] + "…" + id[len(id)-8:]
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func legendIcon(shape string) string {
	return `<svg width="14" height="14" viewBox="0 0 14 14" aria-hidden="true">` + shape + `</svg>`
}
