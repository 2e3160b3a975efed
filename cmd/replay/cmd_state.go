package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

type stateOptions struct {
	atSeq    uint64
	at       string
	session  string
	json     bool
	cacheDir string
	noCache  bool
	every    uint64
	cost     bool
	bySess   bool
	filter   workFilter
}

const stateLong = `Time travel: print every task and wake as it was at a point of the log, computed by folding
the log up to that point with the projection code (projection.Apply into projection.NewMem),
the same fold the live store runs.

  --at-seq N   the state right after the event with sequence N (INCLUSIVE); 0 is the empty
               state before the first event
  --at TIME    the state at an RFC 3339 time: the log up to, but not including, the first
               event stamped after TIME (events stamped exactly at TIME are included)
  neither      the state at the end of the log

--session S folds only that session's events, read through the per-session index (no scan of
the rest of the log); a session's state depends only on its own events. With --at, it stops
at the session's first event stamped after TIME.

Without --session, the fold starts from the nearest snapshot in a cache kept OUTSIDE the
store, under --cache-dir (default: the user cache directory, e.g. ~/.cache/worklog-replay),
which is built lazily: a segment every --snapshot-every events the first time a fold passes
there. So the first time travel deep into a long log folds the whole prefix; later ones fold at
most --snapshot-every events past the nearest segment. --no-cache folds from the start.
--cost prints on stderr what the fold did. See docs/replay.md for the cost model.

--by-session streams the whole state one session at a time instead: each session folded
through its own index (as --session does) and printed at once, tasks first (session by
session, each in submission order), then the wakes in the same order, then the counts. The
first lines come after the first sessions' folds and memory holds one session's records,
whatever the log's length; no snapshot cache is read or written.`

func (a *app) stateCommand() *cobra.Command {
	o := &stateOptions{}
	c := &cobra.Command{
		Use:   "state DIR [--at-seq N | --at TIME]",
		Short: "Time travel: every task and wake as it was at a sequence or a time",
		Long:  stateLong,
		Example: `  replay state ./store --at-seq 42
  replay state ./store --at 2026-03-02T09:01:00Z --session checkout-4821
  replay state ./store --at-seq 1500000 --json > state.json`,
		Args: storeArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.filter.check(c, true); err != nil {
				return err
			}
			return a.runState(c, displayName(args[0]), o)
		},
	}
	f := c.Flags()
	f.Var(seqValue(&o.atSeq), "at-seq", "the state right after this sequence (inclusive)")
	f.StringVar(&o.at, "at", "", "the state at this RFC 3339 `TIME` (events stamped at it included)")
	f.StringVar(&o.session, "session", "", "only this session (read through its index; no full scan)")
	f.BoolVar(&o.json, "json", false, "print JSON (docs/replay-json.md)")
	f.StringVar(&o.cacheDir, "cache-dir", "", "where snapshot segments are cached, never inside the store (default: worklog-replay in the user cache directory, e.g. ~/.cache/worklog-replay)")
	f.BoolVar(&o.noCache, "no-cache", false, "fold from the start of the log; read and write no snapshot")
	o.every = defaultSnapshotEvery
	f.Var(countValue(&o.every, "a whole number, at least 10"), "snapshot-every", "events between two cached snapshot segments")
	f.BoolVar(&o.bySess, "by-session", false, "stream the whole state session by session (first lines at once, memory bounded by the largest session)")
	f.BoolVar(&o.cost, "cost", false, "print on stderr what the fold cost (snapshots loaded, events folded)")
	o.filter.register(c, true)
	return c
}

func (a *app) runState(c *cobra.Command, dir string, o *stateOptions) error {
	hasSeq := c.Flags().Changed("at-seq")
	var ct cut
	switch {
	case hasSeq && o.at != "":
		return usagef(c, "give --at-seq or --at, not both")
	case o.at != "":
		at, err := parseTime("at", o.at)
		if err != nil {
			return usagef(c, "%v", err)
		}
		ct = cut{ByTime: true, At: at}
	}
	if o.every < 10 {
		return usagef(c, "--snapshot-every: \"%d\" is too few events between two snapshots (at least 10)", o.every)
	}
	st, err := a.openStore(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	last, err := st.LastSeq(c.Context())
	if err != nil {
		return readError(dir, err)
	}
	switch {
	case hasSeq && o.atSeq > last:
		return fmt.Errorf("--at-seq %d is past the end of the log of %s, which ends at seq %d", o.atSeq, dir, last)
	case hasSeq:
		ct.Seq = o.atSeq
	case !ct.ByTime:
		ct.Seq = last
	}
	if err := checkHorizon(c.Context(), st, dir, ct, hasSeq); err != nil {
		return err
	}
	if o.bySess {
		if o.session != "" {
			return usagef(c, "give --by-session or --session, not both")
		}
		if ct.ByTime {
			if ct.Seq, err = seqAtTime(c.Context(), st, ct.At, last); err != nil {
				return readError(dir, err)
			}
		}
		return a.stateBySession(c.Context(), st, dir, o, ct.Seq, last)
	}

	var res *foldResult
	if o.session != "" {
		if err := requireSession(c.Context(), st, dir, o.session); err != nil {
			return err
		}
		res, err = sessionFold(c.Context(), st, o.session, ct)
	} else {
		var cache *segCache
		if !o.noCache {
			var why string
			root := o.cacheDir
			if root == "" {
				root = defaultCacheRoot()
			}
			cache, why, err = openCache(c.Context(), st, dir, root, o.every, a.stderr)
			if err != nil {
				return err
			}
			if cache == nil && o.cost {
				fmt.Fprintf(a.stderr, "replay: cost: no snapshot cache: %s\n", why)
			}
		}
		res, err = a.fullFold(c.Context(), st, ct, cache)
	}
	if err != nil {
		return readError(dir, err)
	}
	res.lastSeq = last
	if o.cost {
		fmt.Fprintf(a.stderr, "replay: cost: %s\n", res.cost)
	}
	if o.json {
		return a.writeStateJSON(res, o, ct)
	}
	return a.writeStateText(res, o, ct)
}

// requireSession fails when the session has no event at all: a mistyped id should not look
// like an empty state.
func requireSession(ctx context.Context, st store, dir, session string) error {
	found := false
	err := st.SessionSeqs(ctx, session, 0, func(uint64) error { found = true; return errStop })
	if err != nil && !errors.Is(err, errStop) {
		return readError(dir, err)
	}
	if found {
		return nil
	}
	return fmt.Errorf("session %q has no events in %s%s; %s", session, dir, prunedNote(ctx, st), sessionsOf(ctx, st, dir))
}

// sessionsOf names up to ten sessions of the store, for error messages.
func sessionsOf(ctx context.Context, st store, dir string) string {
	var some []string
	more := false
	_ = st.Sessions(ctx, func(s string) error {
		if len(some) == 10 {
			more = true
			return errStop
		}
		some = append(some, word(s))
		return nil
	})
	if len(some) == 0 {
		return dir + " has no sessions: its log is empty"
	}
	list := strings.Join(some, ", ")
	if more {
		list += ", ..."
	}
	return "the sessions of " + dir + " are " + list
}

// stateHeader is the first line of the text output and the top of the JSON document.
type stateHeader struct {
	Seq         uint64 `json:"seq"`
	LastSeq     uint64 `json:"last_seq"`
	At          string `json:"at,omitempty"`
	RequestedAt string `json:"requested_at,omitempty"`
	NextSeq     uint64 `json:"next_seq,omitempty"`
	NextAt      string `json:"next_at,omitempty"`
	Session     string `json:"session,omitempty"`
	Tasks       int    `json:"task_count"`
	Wakes       int    `json:"wake_count"`
}

func (a *app) header(res *foldResult, o *stateOptions, ct cut) stateHeader {
	nt, nw := res.mem.Len()
	h := stateHeader{Seq: res.seq, LastSeq: res.lastSeq, Session: o.session, Tasks: nt, Wakes: nw}
	if res.seq > 0 {
		h.At = jsonTime(res.at)
	}
	if ct.ByTime {
		h.RequestedAt = jsonTime(ct.At)
	}
	if res.next != nil {
		h.NextSeq, h.NextAt = res.next.Seq, jsonTime(res.next.At)
	}
	return h
}

func (a *app) writeStateJSON(res *foldResult, o *stateOptions, ct cut) error {
	h, err := json.Marshal(a.header(res, o, ct))
	if err != nil {
		return err
	}
	w := a.out
	w.Write(h[:len(h)-1])
	w.WriteString(`,"tasks":[`)
	i := 0
	for _, t := range res.mem.Tasks() {
		if !o.filter.task(t.Kind, t.State.String()) {
			continue
		}
		if i++; i > 1 {
			w.WriteByte(',')
		}
		w.WriteByte('\n')
		b, err := json.Marshal(a.taskJSON(&t))
		if err != nil {
			return err
		}
		w.Write(b)
	}
	w.WriteString("\n],\"wakes\":[")
	i = 0
	for _, x := range res.mem.Wakes() {
		if !o.filter.wake(wakeState(&x)) {
			continue
		}
		if i++; i > 1 {
			w.WriteByte(',')
		}
		w.WriteByte('\n')
		b, err := json.Marshal(a.wakeJSON(&x))
		if err != nil {
			return err
		}
		w.Write(b)
	}
	_, err = w.WriteString("\n]}\n")
	return err
}

func (a *app) writeStateText(res *foldResult, o *stateOptions, ct cut) error {
	w := a.out
	nt, nw := res.mem.Len()
	scope := "the store"
	if o.session != "" {
		scope = "session " + word(o.session)
	}
	counts := plural(nt, "task", "tasks") + ", " + plural(nw, "wake", "wakes")
	// now is the time the state is read at: the requested time, or the time of the last event.
	now := res.at
	switch {
	case ct.ByTime:
		now = ct.At
		fmt.Fprintf(w, "State of %s at %s: %s.\n", scope, fmtTime(ct.At), counts)
		if res.seq == 0 {
			fmt.Fprintf(w, "No event is stamped at or before that time")
		} else {
			fmt.Fprintf(w, "The log up to seq %d (stamped %s)", res.seq, fmtTime(res.at))
		}
		if res.next != nil {
			fmt.Fprintf(w, "; the next event, seq %d, is stamped %s.\n", res.next.Seq, fmtTime(res.next.At))
		} else {
			fmt.Fprintf(w, "; no later event (the log ends at seq %d).\n", res.lastSeq)
		}
	case res.seq == 0 && !res.sessions:
		fmt.Fprintf(w, "State of %s at seq 0, before the first event: empty.\n", scope)
		return nil
	default:
		at := ""
		if res.seq > 0 {
			at = " (" + fmtTime(res.at) + ")"
		}
		fmt.Fprintf(w, "State of %s after seq %d of %d%s: %s.\n", scope, ct.Seq, res.lastSeq, at, counts)
		if res.sessions && res.seq != ct.Seq && res.seq > 0 {
			fmt.Fprintf(w, "The session's last event at or before seq %d is seq %d.\n", ct.Seq, res.seq)
		}
	}
	tasks, wakes := res.mem.Tasks(), res.mem.Wakes()
	if o.filter.active() {
		tasks = slices.DeleteFunc(tasks, func(t projection.Task) bool { return !o.filter.task(t.Kind, t.State.String()) })
		wakes = slices.DeleteFunc(wakes, func(x projection.Wake) bool { return !o.filter.wake(wakeState(&x)) })
		nt, nw = len(tasks), len(wakes)
		fmt.Fprintf(w, "Listed (%s): %s, %s.\n", o.filter.describe(), plural(nt, "task", "tasks"), plural(nw, "wake", "wakes"))
	}
	if nt > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TASK\tSESSION\tKIND\tSTATE\tATTEMPTS\tDETAIL")
		for _, t := range tasks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", t.ID, word(t.SessionID), word(t.Kind), t.State, t.Attempts, a.taskDetail(&t, now))
		}
		tw.Flush()
	}
	if nw > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "WAKE\tSESSION\tREASON\tSTATE\tATTEMPTS\tDETAIL")
		for _, x := range wakes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", x.ID, word(x.SessionID), x.Reason, wakeState(&x), x.Attempts, a.wakeDetail(&x, now))
		}
		tw.Flush()
	}
	return nil
}

// taskDetail says what a task's state means at time now.
func (a *app) taskDetail(t *projection.Task, now int64) string {
	var d []string
	switch t.State {
	case events.StatePending:
		if t.ScheduledAt > now {
			d = append(d, "scheduled for "+fmtTime(t.ScheduledAt))
		} else {
			d = append(d, "due since "+fmtTime(t.ScheduledAt))
		}
	case events.StateRunning:
		s := fmt.Sprintf("attempt %d, lease until %s", t.Attempts, fmtTime(t.LeaseExpiresAt))
		if t.LeaseExpiresAt <= now {
			s += " (expired: due for redelivery)"
		}
		if a.showTokens {
			s += ", token " + t.LeaseToken
		}
		d = append(d, s)
	default:
		s := "finished " + fmtTime(t.FinishedAt)
		if t.State == events.StateCanceled && t.Attempts == 0 {
			s = "canceled while pending at " + fmtTime(t.FinishedAt)
		}
		if t.Outcome.Summary != "" {
			s += ": " + word(t.Outcome.Summary)
		}
		if t.Outcome.Error != "" {
			s += ": error " + word(t.Outcome.Error)
		}
		d = append(d, s)
	}
	if t.CancelRequested && t.State == events.StateRunning {
		d = append(d, "cancel requested "+fmtTime(t.CancelRequestedAt))
	}
	if t.CompletionWakeID != "" {
		d = append(d, "woke "+t.CompletionWakeID)
	}
	return strings.Join(d, "; ")
}

func (a *app) wakeDetail(w *projection.Wake, now int64) string {
	var d []string
	if w.Reason == events.WakeTaskFinished {
		d = append(d, fmt.Sprintf("task %s %s", w.TaskID, w.Outcome.State))
	} else {
		d = append(d, "payload "+shortJSON(w.Payload, 60))
	}
	if w.Claimed() && !w.Acked {
		s := fmt.Sprintf("attempt %d, lease until %s", w.Attempts, fmtTime(w.LeaseExpiresAt))
		if w.LeaseExpiresAt <= now {
			s += " (expired: claimable again)"
		}
		if a.showTokens {
			s += ", token " + w.LeaseToken
		}
		d = append(d, s)
	}
	return strings.Join(d, "; ")
}
