package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// errStop ends a walk early; it is not an error.
var errStop = errors.New("stop")

type logOptions struct {
	session   string
	task      string
	wake      string
	types     []string
	taskKinds []string
	from, to  uint64
	since     string
	until     string
	json      bool
	limit     uint64
	follow    bool     // --follow (cmd_follow.go)
	oldKind   []string // --kind, the hidden old name of --type
}

const logLong = `Print the events of a store in log order, one line each: sequence, time (UTC), session,
event type, then what the event says: task or wake id, attempt, lease expiry, outcome, reason.

Filters combine (all must hold):
  --session S        events of session S (read through the per-session index: no full scan)
  --task ID          events of task ID, including the completion wake recorded for it
  --wake ID          events of wake ID
  --type TYPE        event type by its stable name, e.g. task_claimed; repeat or comma-separate
  --task-kind KIND   events of tasks of kind KIND (and of their completion wakes)
  --from N, --to N   sequence range, both INCLUSIVE
  --since T, --until T  event time range (RFC 3339), both INCLUSIVE

` + "%s" + `
--json prints one JSON object per line instead, the schema of docs/replay-json.md (the same as
export). Lease tokens are [redacted] unless --show-tokens.
` + followHelp

// eventTypesHelp lists the event types, one a line with what each records, from the events
// catalogue: a new type appears here without anyone editing this text.
func eventTypesHelp() string {
	width := 0
	for _, info := range events.Types() {
		width = max(width, len(info.Name))
	}
	var b strings.Builder
	b.WriteString("Event types, for --type:\n")
	for _, info := range events.Types() {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, info.Name, info.Doc)
	}
	return b.String()
}

func (a *app) logCommand() *cobra.Command {
	o := &logOptions{}
	c := &cobra.Command{
		Use:   "log DIR",
		Short: "Print the events in order, one line each, with filters",
		Long:  fmt.Sprintf(logLong, eventTypesHelp()),
		Example: `  replay log ./store
  replay log ./store --session checkout-4821 --type task_claimed,task_settled
  replay log ./store --from 100 --to 200 --json
  replay log ./store --since 2026-03-02T09:00:00Z --until 2026-03-02T09:05:00Z
  replay log 'postgres://host/db?search_path=q' --follow --type task_settled`,
		Args: storeArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			if c.Flags().Changed("kind") {
				// --kind was the event type's name: users read it as the task's kind.
				fmt.Fprintln(a.stderr, "replay: --kind is the old name of --type (event types); use --type, or --task-kind for tasks of a kind")
				o.types = append(o.types, o.oldKind...)
			}
			return a.runLog(c, displayName(args[0]), o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.session, "session", "", "only events of this session")
	f.StringVar(&o.task, "task", "", "only events of this task (and the completion wake recorded for it)")
	f.StringVar(&o.wake, "wake", "", "only events of this wake")
	f.StringSliceVar(&o.types, "type", nil, "only these event types, e.g. task_claimed (repeat or comma-separate)")
	f.StringSliceVar(&o.oldKind, "kind", nil, "the old name of --type")
	_ = f.MarkHidden("kind")
	f.StringSliceVar(&o.taskKinds, "task-kind", nil, "only events of tasks of these kinds (repeat or comma-separate)")
	f.Var(seqValue(&o.from), "from", "first sequence to print (inclusive)")
	f.Var(seqValue(&o.to), "to", "last sequence to print (inclusive; default the end of the log)")
	f.StringVar(&o.since, "since", "", "only events at or after this RFC 3339 `TIME` (inclusive)")
	f.StringVar(&o.until, "until", "", "only events at or before this RFC 3339 `TIME` (inclusive)")
	f.BoolVar(&o.json, "json", false, "print JSON lines (docs/replay-json.md)")
	f.BoolVarP(&o.follow, "follow", "f", false, "after the log, print each new event as it commits, until Ctrl-C")
	f.Var(countValue(&o.limit, "a whole number, 0 or more; 0: no limit"), "limit", "stop after this many events (0: no limit)")
	return c
}

// eventFilter is the parsed form of the filter flags.
type eventFilter struct {
	types      [256]bool
	anyType    bool
	task, wake string
	since      int64
	until      int64
	hasSince   bool
	hasUntil   bool
	taskKinds  map[string]bool
	kindOf     func(ev events.Event) (string, error)
}

func parseTypes(c *cobra.Command, names []string, f *eventFilter) error {
	f.anyType = len(names) == 0
	for _, n := range names {
		n = strings.TrimSpace(n)
		t, ok := events.TypeByName(n)
		if !ok {
			var all []string
			for _, t := range events.AllTypes() {
				all = append(all, t.String())
			}
			return usagef(c, "--type: %q is not an event type; the types are %s (for a task's kind use --task-kind)",
				n, strings.Join(all, ", "))
		}
		f.types[t] = true
	}
	return nil
}

func (f *eventFilter) match(ev events.Event) (bool, error) {
	if !f.anyType && !f.types[ev.Type()] {
		return false, nil
	}
	h := ev.Head()
	if f.hasSince && h.At < f.since || f.hasUntil && h.At > f.until {
		return false, nil
	}
	taskID, wakeID := ev.Subject()
	if f.task != "" && taskID != f.task {
		if wr, ok := ev.(*events.WakeRecorded); !ok || wr.TaskID != f.task {
			return false, nil
		}
	}
	if f.wake != "" && wakeID != f.wake {
		return false, nil
	}
	if f.taskKinds != nil {
		k, err := f.kindOf(ev)
		if err != nil || !f.taskKinds[k] {
			return false, err
		}
	}
	return true, nil
}

// kindLookup finds the kind of the task an event is about, from the stored projection (a
// task's kind never changes), remembering a bounded number of answers.
func kindLookup(ctx context.Context, st store) func(ev events.Event) (string, error) {
	kinds := map[string]string{}    // task id -> kind
	wakeTask := map[string]string{} // wake id -> task id ("" for a direct wake)
	taskKind := func(id string) (string, error) {
		if k, ok := kinds[id]; ok {
			return k, nil
		}
		var kind string
		err := st.View(ctx, func(r projection.Reader) error {
			t, err := r.Task(id)
			if t != nil {
				kind = t.Kind
			}
			return err
		})
		if len(kinds) > 100_000 {
			clear(kinds)
		}
		kinds[id] = kind
		return kind, err
	}
	return func(ev events.Event) (string, error) {
		switch e := ev.(type) {
		case *events.TaskSubmitted:
			return e.Kind, nil
		case *events.WakeRecorded:
			if e.Reason != events.WakeTaskFinished {
				return "", nil
			}
			return taskKind(e.TaskID)
		}
		taskID, wakeID := ev.Subject()
		if taskID != "" {
			return taskKind(taskID)
		}
		tid, ok := wakeTask[wakeID]
		if !ok {
			err := st.View(ctx, func(r projection.Reader) error {
				w, err := r.Wake(wakeID)
				if w != nil {
					tid = w.TaskID
				}
				return err
			})
			if err != nil {
				return "", err
			}
			if len(wakeTask) > 100_000 {
				clear(wakeTask)
			}
			wakeTask[wakeID] = tid
		}
		if tid == "" {
			return "", nil
		}
		return taskKind(tid)
	}
}

func (a *app) runLog(c *cobra.Command, dir string, o *logOptions) error {
	f := &eventFilter{task: o.task, wake: o.wake}
	if err := parseTypes(c, o.types, f); err != nil {
		return err
	}
	var err error
	if o.since != "" {
		if f.since, err = parseTime("since", o.since); err != nil {
			return usagef(c, "%v", err)
		}
		f.hasSince = true
	}
	if o.until != "" {
		if f.until, err = parseTime("until", o.until); err != nil {
			return usagef(c, "%v", err)
		}
		f.hasUntil = true
	}
	hasTo := c.Flags().Changed("to")
	if hasTo && o.follow {
		return usagef(c, "--follow prints the events to come: it takes no --to")
	}
	if hasTo && o.to < o.from {
		return usagef(c, "--to %d is before --from %d", o.to, o.from)
	}
	if len(o.taskKinds) > 0 {
		f.taskKinds = map[string]bool{}
		for _, k := range o.taskKinds {
			f.taskKinds[strings.TrimSpace(k)] = true
		}
	}

	st, err := a.openStore(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	// A session with no events is a typo far more often than a question: say so, as timeline
	// and state do, rather than print nothing (one seek in the session index).
	if o.session != "" {
		if err := requireSession(c.Context(), st, dir, o.session); err != nil {
			return err
		}
	}
	f.kindOf = kindLookup(c.Context(), st)
	last, err := st.LastSeq(c.Context())
	if err != nil {
		return readError(dir, err)
	}
	to := last
	if hasTo && o.to < last {
		to = o.to
	}
	w := &eventWriter{a: a, json: o.json, seqWidth: digits(last), sessionWidth: sessionWidth(c.Context(), st, o.session), limit: int(min(o.limit, math.MaxInt))}
	// On a walk of the log (not of one session, task or wake) each pruned range is marked
	// where its events were: the reader sees that history is missing there, and why.
	var gaps projection.SeqRanges
	if o.session == "" && o.task == "" && o.wake == "" {
		pruned, err := st.PrunedRanges(c.Context())
		if err != nil {
			return readError(dir, err)
		}
		for _, r := range pruned {
			if r.To >= max(o.from, 1) && r.From <= to {
				gaps = append(gaps, r)
			}
		}
	}
	markGaps := func(before uint64) error {
		for len(gaps) > 0 && gaps[0].From < before {
			if w.limit > 0 && w.n >= w.limit {
				return errStop
			}
			if err := w.writePruned(gaps[0]); err != nil {
				return err
			}
			gaps = gaps[1:]
		}
		return nil
	}
	emit := func(ev events.Event) error {
		if err := markGaps(ev.Head().Seq); err != nil {
			return err
		}
		ok, err := f.match(ev)
		if err != nil || !ok {
			return err
		}
		return w.write(ev)
	}
	err = a.walkEvents(c.Context(), st, walkScope{session: o.session, task: o.task, wake: o.wake, from: o.from, to: to, last: last}, emit)
	if err == nil {
		err = markGaps(math.MaxUint64) // the newest events were pruned
		if errors.Is(err, errStop) {
			err = nil
		} else if err == nil && o.follow && (w.limit == 0 || w.n < w.limit) {
			err = a.followLog(c, st, dir, max(to+1, o.from), o.session, emit)
		}
	}
	if err != nil {
		return readError(dir, err)
	}
	return nil
}

// prunedJSON is log --json's record of a pruned range (docs/replay-json.md): it has no
// "event" field, so a consumer that reads only events skips it.
type prunedJSON struct {
	Record string `json:"record"` // "pruned"
	From   uint64 `json:"from"`
	To     uint64 `json:"to"`
	Events uint64 `json:"events"`
}

// writePruned marks a pruned range in place: the whole range, even when --from or --to cut
// it, so the line says exactly what Queue.Prune removed.
func (w *eventWriter) writePruned(r projection.SeqRange) error {
	if w.json {
		return writeJSONLine(w.a.out, prunedJSON{Record: "pruned", From: r.From, To: r.To, Events: r.To - r.From + 1})
	}
	_, err := fmt.Fprintf(w.a.out, "%*s  seqs %d–%d pruned\n", w.seqWidth, "…", r.From, r.To)
	return err
}

// eventWriter prints events as text lines or JSON lines, up to a limit.
type eventWriter struct {
	a            *app
	json         bool
	seqWidth     int
	sessionWidth int
	limit        int
	n            int
	line         []byte // the text line being written, reused
}

// sessionWidth is the width of the session column: the longest of the first thousand
// session ids (one seek each), between 8 and 32.
func sessionWidth(ctx context.Context, st store, session string) int {
	w := len(word(session))
	if session == "" {
		n := 0
		_ = st.Sessions(ctx, func(s string) error {
			w = max(w, len(word(s)))
			if n++; n == 1000 {
				return errStop
			}
			return nil
		})
	}
	return min(max(w, 8), 32)
}

func (w *eventWriter) write(ev events.Event) error {
	if w.limit > 0 && w.n >= w.limit {
		return errStop
	}
	w.n++
	if w.json {
		return writeJSONLine(w.a.out, w.a.eventJSON(ev))
	}
	w.line = append(w.a.appendEventLine(w.line[:0], ev, w.seqWidth, w.sessionWidth), '\n')
	_, err := w.a.out.Write(w.line)
	return err
}

// walkScope says which events a walk visits: a session's (through its index), a task's or a
// wake's (through the index of the session that owns it), or the whole log; from and to are
// inclusive sequence bounds.
type walkScope struct {
	session, task, wake string
	from, to, last      uint64
}

// walkEvents calls fn for the events in scope, in log order, until fn returns an error;
// errStop ends the walk without one. It reads the per-session index whenever the scope
// allows, so a session's events cost one point read each however long the log is; otherwise
// it streams the log range.
func (a *app) walkEvents(ctx context.Context, st store, s walkScope, fn func(events.Event) error) error {
	err := a.walk(ctx, st, s, fn)
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

func (a *app) walk(ctx context.Context, st store, s walkScope, fn func(events.Event) error) error {
	if s.to < s.from {
		return nil
	}
	session, from := s.session, s.from
	if session == "" && (s.task != "" || s.wake != "") {
		// Find the owning session and the first event in the stored projection; without a
		// record (an unknown id, or a damaged projection), fall back to the full log.
		err := st.View(ctx, func(r projection.Reader) error {
			if s.task != "" {
				t, err := r.Task(s.task)
				if t != nil {
					session, from = t.SessionID, max(from, t.SubmitSeq)
				}
				return err
			}
			w, err := r.Wake(s.wake)
			if w != nil {
				session, from = w.SessionID, max(from, w.RecordSeq)
			}
			return err
		})
		if err != nil {
			session = ""
		}
	}
	if session != "" {
		return st.SessionSeqs(ctx, session, from, func(seq uint64) error {
			if seq > s.to {
				return errStop
			}
			ev, err := st.Event(ctx, seq)
			if err != nil {
				return err
			}
			return fn(ev)
		})
	}
	p := a.newProgress("reading the log", true)
	defer p.finish()
	return st.ReadRange(ctx, from, s.to, func(ev events.Event) error {
		p.update(ev.Head().Seq, s.last)
		return fn(ev)
	})
}

const exportLong = `Print the whole log as JSON lines, one event per line in sequence order, for other tools.
The schema is the one of log --json, documented in docs/replay-json.md: fields are only ever
added, so consumers should ignore fields they do not know. --from and --to (INCLUSIVE) export
a part, e.g. the events since the last export. Lease tokens are [redacted] unless --show-tokens.
Memory stays bounded on any log size: events are streamed.

--wire writes the whole log instead in worklog's wire format (each event's stored bytes,
checksums and lease tokens included), for replay import to load into an empty store of
either backend: how a queue moves from an embedded store to PostgreSQL and back.`

func (a *app) exportCommand() *cobra.Command {
	var from, to uint64
	var wire bool
	c := &cobra.Command{
		Use:   "export DIR",
		Short: "Print the whole log as JSON lines (the schema of log --json)",
		Long:  exportLong,
		Example: `  replay export ./store > events.jsonl
  replay export ./store --from 1001      # only what came after seq 1000
  replay export ./store --wire > store.wlog && replay import store.wlog 'postgres://host/db?search_path=q'`,
		Args: storeArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			dir := displayName(args[0])
			if c.Flags().Changed("to") && to < from {
				return usagef(c, "--to %d is before --from %d", to, from)
			}
			if wire && (c.Flags().Changed("from") || c.Flags().Changed("to")) {
				return usagef(c, "--wire exports the whole log, for import: it takes no --from or --to")
			}
			if wire && a.archive != "" {
				return usagef(c, "--wire exports the store's log as it is stored, for import: it does not read --archive")
			}
			if wire {
				return a.exportWire(c, dir)
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
			end := last
			if c.Flags().Changed("to") && to < last {
				end = to
			}
			w := &eventWriter{a: a, json: true}
			err = a.walkEvents(c.Context(), st, walkScope{from: from, to: end, last: last}, w.write)
			if err != nil {
				return readError(dir, err)
			}
			return nil
		},
	}
	c.Flags().Var(seqValue(&from), "from", "first sequence to export (inclusive)")
	c.Flags().Var(seqValue(&to), "to", "last sequence to export (inclusive; default the end)")
	c.Flags().BoolVar(&wire, "wire", false, "write the whole log in the wire format, for replay import")
	return c
}
