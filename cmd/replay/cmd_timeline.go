package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
)

const timelineLong = `Tell one session's story at a glance, read through the per-session index (no scan of the
rest of the log):

  each task: submitted (when, scheduled for when), every attempt with its lease window, the
  lease expiries that led to a redelivery, cancel requests, the outcome, and the stale
  deliveries that were fenced off (task_settle_rejected);
  each wake: recorded (on request, or on a task's completion), every delivery with its lease,
  expiries, the acknowledgment and rejected stale acknowledgments (wake_ack_rejected).

Lease expiries are not events: a claim of a task that is still running means the previous
lease ran out first, so the story shows that expiry at the lease's end (marked "-" in the
sequence column). A lease that ran out before the store's last event, with no claim since, is
shown as expired; a later one as still open.

--html FILE also writes a self-contained HTML page (inline CSS and SVG, no external assets):
a time axis with a bar per lease window and a marker per event.`

func (a *app) timelineCommand() *cobra.Command {
	var session, htmlFile string
	var filter workFilter
	c := &cobra.Command{
		Use:   "timeline DIR --session S",
		Short: "One session's story: each task's and wake's life, with lease windows",
		Long:  timelineLong,
		Example: `  replay timeline ./store --session checkout-4821
  replay timeline ./store --session checkout-4821 --html checkout.html`,
		Args: storeArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			dir := displayName(args[0])
			if err := filter.check(c, false); err != nil {
				return err
			}
			if htmlFile != "" {
				absStore, err1 := filepath.Abs(dir)
				absHTML, err2 := filepath.Abs(htmlFile)
				if err1 == nil && err2 == nil && inside(absStore, absHTML) {
					return usagef(c, "--html %s is inside the store %s: replay never writes into a store", htmlFile, dir)
				}
			}
			st, err := a.openStore(dir)
			if err != nil {
				return err
			}
			defer st.Close()
			if session == "" {
				return usagef(c, "timeline needs --session; %s", sessionsOf(c.Context(), st, dir))
			}
			if err := requireSession(c.Context(), st, dir, session); err != nil {
				return err
			}
			s, err := readStory(c.Context(), st, session)
			if err != nil {
				return readError(dir, err)
			}
			if filter.active() {
				s.only(&filter)
				fmt.Fprintf(a.out, "Only the tasks matching %s, and their completion wakes.\n", filter.describe())
			}
			a.writeTimelineText(a.out, s)
			if htmlFile != "" {
				if err := writeFileAtomic(htmlFile, []byte(timelineHTML(s, dir))); err != nil {
					return fmt.Errorf("writing %s: %v", htmlFile, unwrapPathError(err))
				}
				fmt.Fprintf(a.out, "\nWrote %s.\n", htmlFile)
			}
			return nil
		},
	}
	c.Flags().StringVar(&session, "session", "", "the session (required)")
	c.Flags().StringVar(&htmlFile, "html", "", "also write a self-contained HTML page with a time axis to this file")
	filter.register(c, false)
	return c
}

// only keeps the tasks f lists and their completion wakes (text and HTML alike).
func (s *sessionStory) only(f *workFilter) {
	kept := map[string]bool{}
	s.Tasks = slices.DeleteFunc(s.Tasks, func(t *taskStory) bool {
		keep := f.task(t.Kind, t.State.String())
		kept[t.ID] = keep
		return !keep
	})
	s.Wakes = slices.DeleteFunc(s.Wakes, func(w *wakeStory) bool { return !kept[w.TaskID] })
}

func writeFileAtomic(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// timeCol is the time column of a story: the clock when the story fits in one UTC day.
func (s *sessionStory) timeCol(ns int64) string {
	if s.dayOnly {
		return clock(ns)
	}
	return fmtTime(ns)
}

func (a *app) writeTimelineText(w io.Writer, s *sessionStory) {
	day := time.Unix(0, s.FirstAt).UTC().Format("2006-01-02")
	span := fmt.Sprintf("%s %s to %s UTC", day, clock(s.FirstAt), clock(s.LastAt))
	if !sameDay(s.FirstAt, s.LastAt) {
		span = fmt.Sprintf("%s to %s", fmtTime(s.FirstAt), fmtTime(s.LastAt))
	}
	fmt.Fprintf(w, "Session %s: %s, %s, %s between seq %d and %d, %s.\n", word(s.Session),
		plural(len(s.Tasks), "task", "tasks"), plural(len(s.Wakes), "wake", "wakes"),
		plural(s.Events, "event", "events"), s.FirstSeq, s.LastSeq, span)
	seqW := digits(s.LastSeq) + 1
	line := func(m mark) {
		seq := "-"
		if m.Seq != 0 {
			seq = fmt.Sprintf("#%d", m.Seq)
		}
		fmt.Fprintf(w, "  %s  %*s  %s\n", s.timeCol(m.At), seqW, seq, m.Text)
	}
	for _, t := range s.Tasks {
		fmt.Fprintf(w, "\ntask %s (%s): %s\n", t.ID, word(t.Kind), s.taskSummary(t))
		for _, m := range t.Marks {
			line(m)
		}
	}
	for _, x := range s.Wakes {
		fmt.Fprintf(w, "\nwake %s (%s): %s\n", x.ID, wakeLabel(x), s.wakeSummary(x))
		for _, m := range x.Marks {
			line(m)
		}
	}
	for _, x := range s.Schedules {
		state := "live"
		if x.Removed {
			state = "removed"
		}
		fmt.Fprintf(w, "\nschedule %s: %s\n", word(x.Name), state)
		for _, m := range x.Marks {
			line(m)
		}
	}
}

func wakeLabel(w *wakeStory) string {
	if w.Reason == events.WakeTaskFinished {
		return "completion of " + w.TaskID
	}
	return "requested"
}

func (s *sessionStory) taskSummary(t *taskStory) string {
	var b strings.Builder
	switch {
	case t.State == events.StatePending && t.DueAt > s.EndAt:
		fmt.Fprintf(&b, "pending, scheduled for %s", s.timeCol(t.DueAt))
	case t.State == events.StatePending:
		fmt.Fprintf(&b, "pending, due since %s", s.timeCol(t.DueAt))
	case t.State == events.StateRunning:
		l := current(t.Leases)
		fmt.Fprintf(&b, "running, attempt %d", t.Attempts)
		if l != nil && l.End == endExpired {
			fmt.Fprintf(&b, ", lease expired at %s: due for redelivery", s.timeCol(l.Until))
		} else if l != nil {
			fmt.Fprintf(&b, ", lease until %s", s.timeCol(l.Until))
		}
	case t.State == events.StateCanceled && t.Attempts == 0:
		b.WriteString("canceled while pending")
	default:
		fmt.Fprintf(&b, "%s after %s", t.State, plural(int(t.Attempts), "attempt", "attempts"))
	}
	var notes []string
	if t.Redeliveries > 0 {
		notes = append(notes, plural(t.Redeliveries, "redelivery", "redeliveries")+" after a lease expiry")
	}
	if t.Releases > 0 {
		notes = append(notes, plural(t.Releases, "release", "releases"))
	}
	if t.Extensions > 0 {
		notes = append(notes, plural(t.Extensions, "lease extension", "lease extensions"))
	}
	if t.CancelRequested && t.Attempts > 0 {
		notes = append(notes, "cancel requested at "+s.timeCol(t.CancelAt))
	}
	if t.Rejections > 0 {
		notes = append(notes, plural(t.Rejections, "stale settlement", "stale settlements")+" rejected")
	}
	if len(notes) > 0 {
		b.WriteString(" (" + strings.Join(notes, ", ") + ")")
	}
	return b.String()
}

func (s *sessionStory) wakeSummary(w *wakeStory) string {
	var b strings.Builder
	l := current(w.Leases)
	switch {
	case w.Acked:
		fmt.Fprintf(&b, "acknowledged after %s", plural(int(w.Attempts), "delivery", "deliveries"))
	case l == nil:
		b.WriteString("waiting, never claimed")
	case l.End == endExpired:
		fmt.Fprintf(&b, "not acknowledged, lease of delivery %d expired at %s: claimable again", l.Attempt, s.timeCol(l.Until))
	default:
		fmt.Fprintf(&b, "claimed by delivery %d, lease until %s", l.Attempt, s.timeCol(l.Until))
	}
	var notes []string
	if w.Redeliveries > 0 {
		notes = append(notes, plural(w.Redeliveries, "redelivery", "redeliveries")+" after a lease expiry")
	}
	if w.Rejections > 0 {
		notes = append(notes, plural(w.Rejections, "stale acknowledgment", "stale acknowledgments")+" rejected")
	}
	if len(notes) > 0 {
		b.WriteString(" (" + strings.Join(notes, ", ") + ")")
	}
	return b.String()
}
