package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
)

const statsLong = `Summarise a store: the sequence range and its times, the size on disk, the sessions, the
events by type, the tasks by state and by kind, the wakes by state and reason, and the oldest
unfinished work (the oldest task not yet terminal, the oldest wake not yet acknowledged).

Tasks and wakes are counted from the stored projection (one pass over the records); events by
type from one pass over the log that reads each event's type byte without decoding it. Memory
stays bounded by the number of distinct kinds and sessions.`

func (a *app) statsCommand() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "stats DIR",
		Short: "Counts by state and kind, sessions, sequence range, size, oldest unfinished work",
		Long:  statsLong,
		Example: `  replay stats ./store
  replay stats ./store --json | jq .tasks.by_state`,
		Args: storeArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			dir := displayName(args[0])
			st, err := a.openStore(dir)
			if err != nil {
				return err
			}
			defer st.Close()
			s, err := a.stats(c.Context(), st, dir)
			if err != nil {
				return readError(dir, err)
			}
			if asJSON {
				return writeJSONLine(a.out, s)
			}
			a.writeStatsText(s)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON (docs/replay-json.md)")
	return c
}

type countJSON struct {
	Name    string         `json:"name"`
	Count   int            `json:"count"`
	ByState map[string]int `json:"by_state,omitempty"`
}

// prunedStatsJSON is stats' account of retention: how many pruned ranges the log has, how
// many events they held, and where the log's history begins.
type prunedStatsJSON struct {
	Ranges  int    `json:"ranges"`
	Events  uint64 `json:"events"`
	Horizon uint64 `json:"horizon"`
}

type statsJSON struct {
	Dir       string `json:"dir"`
	Format    string `json:"format"`
	FirstSeq  uint64 `json:"first_seq"`
	LastSeq   uint64 `json:"last_seq"`
	FirstAt   string `json:"first_at,omitempty"`
	LastAt    string `json:"last_at,omitempty"`
	DiskBytes uint64 `json:"disk_bytes"`
	// Pruned is the history Queue.Prune removed (absent when none was): first_seq is then
	// the first retained event (the horizon when the oldest events went).
	Pruned *prunedStatsJSON `json:"pruned,omitempty"`
	// Archive is the archive of --archive (absent without it): cmd_stats_archive.go.
	Archive  *archiveStatsJSON `json:"archive,omitempty"`
	Sessions int               `json:"sessions"`
	Busiest  []countJSON       `json:"busiest_sessions"`
	Events   map[string]uint64 `json:"events"`
	Tasks    struct {
		Total   int            `json:"total"`
		ByState map[string]int `json:"by_state"`
		ByKind  []countJSON    `json:"by_kind"`
	} `json:"tasks"`
	Wakes struct {
		Total    int            `json:"total"`
		ByState  map[string]int `json:"by_state"`
		ByReason map[string]int `json:"by_reason"`
	} `json:"wakes"`
	OldestTask *taskJSON      `json:"oldest_unfinished_task,omitempty"`
	OldestWake *wakeJSON      `json:"oldest_unacked_wake,omitempty"`
	Policies   []policyJSON   `json:"kind_policies"`
	Schedules  []scheduleJSON `json:"schedules"`

	lastAt int64
}

// policyJSON is a kind's policy (Queue.SetKindPolicy) as stats lists it.
type policyJSON struct {
	Kind       string  `json:"kind"`
	Paused     bool    `json:"paused"`
	MaxRunning int64   `json:"max_running"` // 0: no limit
	Rate       float64 `json:"rate"`        // claims per second; 0: no rate
	Burst      int64   `json:"burst"`
	// The per-session fields, present only when set; running_by_session: with
	// max_running_per_session, the slots each session holds at the log's last event (its
	// tasks of the kind under leases unexpired then), for the sessions holding any.
	FairSessions         bool             `json:"fair_sessions,omitempty"`
	MaxRunningPerSession int64            `json:"max_running_per_session,omitempty"`
	RunningBySession     map[string]int64 `json:"running_by_session,omitempty"`
}

// scheduleJSON is a live schedule (one with a next tick) as stats lists it.
type scheduleJSON struct {
	Session  string `json:"session"`
	Name     string `json:"name"`
	Cron     string `json:"cron"`
	TimeZone string `json:"time_zone,omitempty"` // "": UTC
	Kind     string `json:"kind"`
	Catchup  string `json:"catchup"` // latest or all
	Next     string `json:"next"`
	Ticks    uint64 `json:"ticks"` // ticks submitted since it was set whose tasks are still in the log (retention takes earlier ones, never the latest)
}

// flowStats reads the kind policies and the live schedules (the schedule index: those with a
// next tick; removed ones and ones whose rule names no later time are not listed).
func flowStats(ctx context.Context, st store, s *statsJSON) error {
	return st.View(ctx, func(r projection.Reader) error {
		s.Policies, s.Schedules = []policyJSON{}, []scheduleJSON{}
		var perr error
		err := r.KindPolicies(func(p *projection.KindPolicy) bool {
			pj := policyJSON{Kind: p.Kind, Paused: p.Paused, MaxRunning: p.MaxRunning, Rate: p.Rate, Burst: p.Burst,
				FairSessions: p.FairSessions, MaxRunningPerSession: p.MaxRunningPerSession}
			if p.MaxRunningPerSession > 0 {
				perr = projection.LeaseSessions(r, p.Kind, s.lastAt, func(session string, _ int64) bool {
					if pj.RunningBySession == nil {
						pj.RunningBySession = map[string]int64{}
					}
					pj.RunningBySession[session]++
					return true
				})
			}
			s.Policies = append(s.Policies, pj)
			return perr == nil
		})
		if err == nil {
			err = perr
		}
		if err != nil {
			return err
		}
		var ferr error
		err = r.ScanScheduleDue(math.MaxInt64, func(e projection.ScheduleEntry) bool {
			sc, err := r.Schedule(e.SessionID, e.Name)
			if err != nil || sc == nil {
				ferr = err
				return err == nil
			}
			catchup := "latest"
			if sc.Catchup == 1 {
				catchup = "all"
			}
			s.Schedules = append(s.Schedules, scheduleJSON{Session: sc.SessionID, Name: sc.Name, Cron: sc.Cron, TimeZone: sc.TimeZone,
				Kind: sc.Kind, Catchup: catchup, Next: jsonTime(sc.Next), Ticks: sc.Ticks})
			return true
		})
		if err = errors.Join(err, ferr); err != nil {
			return err
		}
		slices.SortFunc(s.Schedules, func(a, b scheduleJSON) int {
			return cmp.Or(strings.Compare(a.Session, b.Session), strings.Compare(a.Name, b.Name))
		})
		return nil
	})
}

func (a *app) stats(ctx context.Context, st store, dir string) (*statsJSON, error) {
	if as, ok := st.(*archivedStore); ok { // the store's own figures, and the archive's
		s, err := a.stats(ctx, as.store, dir)
		if err == nil {
			s.Archive = archiveStats(as)
		}
		return s, err
	}
	disk, err := st.DiskUsage(ctx)
	if err != nil {
		return nil, err
	}
	s := &statsJSON{Dir: dir, DiskBytes: disk, Events: map[string]uint64{}}
	if pg, ok := st.(*postgres.Store); ok {
		s.Format = pgFormat(pg)
	} else if b, err := os.ReadFile(filepath.Join(dir, pebblelog.MarkerFile)); err == nil {
		s.Format = strings.TrimSpace(string(b))
	}
	last, err := st.LastSeq(ctx)
	if err != nil {
		return nil, err
	}
	s.LastSeq = last
	pruned, err := st.PrunedRanges(ctx)
	if err != nil {
		return nil, err
	}
	// The retained events run from the first not pruned to the last not pruned.
	firstSeq, lastSeq := horizon(pruned), last
	if n := len(pruned); n > 0 {
		s.Pruned = &prunedStatsJSON{Ranges: n, Events: pruned.Count(), Horizon: firstSeq}
		if pruned[n-1].To == last {
			lastSeq = pruned[n-1].From - 1
		}
	}
	if last > 0 && firstSeq <= lastSeq {
		s.FirstSeq = firstSeq
		first, err := st.Event(ctx, firstSeq)
		if err != nil {
			return nil, err
		}
		lastEv, err := st.Event(ctx, lastSeq)
		if err != nil {
			return nil, err
		}
		s.FirstAt, s.LastAt = jsonTime(first.Head().At), jsonTime(lastEv.Head().At)
		s.lastAt = lastEv.Head().At
	}

	p := a.newProgress("counting events", false)
	err = st.RawLog(ctx, 0, 0, func(seq uint64, raw []byte) error {
		name := "corrupt"
		if len(raw) > 1 {
			name = events.Type(raw[1]).String()
		}
		s.Events[name]++
		p.update(seq, last)
		return nil
	})
	p.finish()
	if err != nil {
		return nil, err
	}

	s.Tasks.ByState = map[string]int{}
	for _, st := range []events.TaskState{events.StatePending, events.StateRunning, events.StateSucceeded, events.StateFailed, events.StateCanceled} {
		s.Tasks.ByState[st.String()] = 0
	}
	kinds := map[string]*countJSON{}
	sessions := map[string]int{}
	var oldest *projection.Task
	err = st.ScanTasks(ctx, func(t *projection.Task) error {
		s.Tasks.Total++
		s.Tasks.ByState[t.State.String()]++
		k := kinds[t.Kind]
		if k == nil {
			k = &countJSON{Name: t.Kind, ByState: map[string]int{}}
			kinds[t.Kind] = k
		}
		k.Count++
		k.ByState[t.State.String()]++
		sessions[t.SessionID]++
		if !t.State.Terminal() && (oldest == nil || t.CreatedAt < oldest.CreatedAt ||
			t.CreatedAt == oldest.CreatedAt && t.SubmitSeq < oldest.SubmitSeq) {
			oldest = t
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, k := range kinds {
		s.Tasks.ByKind = append(s.Tasks.ByKind, *k)
	}
	sortCounts(s.Tasks.ByKind)
	if oldest != nil {
		s.OldestTask = a.taskJSON(oldest)
	}

	s.Wakes.ByState = map[string]int{"available": 0, "claimed": 0, "acked": 0}
	s.Wakes.ByReason = map[string]int{}
	var oldestWake *projection.Wake
	err = st.ScanWakes(ctx, func(w *projection.Wake) error {
		s.Wakes.Total++
		s.Wakes.ByState[wakeState(w)]++
		s.Wakes.ByReason[w.Reason.String()]++
		if _, ok := sessions[w.SessionID]; !ok {
			sessions[w.SessionID] = 0
		}
		if !w.Acked && (oldestWake == nil || w.CreatedAt < oldestWake.CreatedAt ||
			w.CreatedAt == oldestWake.CreatedAt && w.RecordSeq < oldestWake.RecordSeq) {
			oldestWake = w
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if oldestWake != nil {
		s.OldestWake = a.wakeJSON(oldestWake)
	}
	s.Sessions = len(sessions)
	for name, n := range sessions {
		s.Busiest = append(s.Busiest, countJSON{Name: name, Count: n})
	}
	sortCounts(s.Busiest)
	if len(s.Busiest) > 5 {
		s.Busiest = s.Busiest[:5]
	}
	if err := flowStats(ctx, st, s); err != nil {
		return nil, err
	}
	return s, nil
}

func sortCounts(cs []countJSON) {
	slices.SortFunc(cs, func(a, b countJSON) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

func (a *app) writeStatsText(s *statsJSON) {
	w := a.out
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "Store\t%s (%s)\n", s.Dir, s.Format)
	if s.LastSeq == 0 {
		fmt.Fprintf(tw, "Log\tempty\n")
	} else {
		retained := s.LastSeq
		if s.Pruned != nil {
			retained -= s.Pruned.Events
		}
		if retained == 0 {
			fmt.Fprintf(tw, "Log\tevery event pruned, last seq %d\n", s.LastSeq)
		} else {
			fmt.Fprintf(tw, "Log\t%s, seq %d..%d, %s .. %s\n", plural(int(retained), "event", "events"), s.FirstSeq, s.LastSeq, s.FirstAt, s.LastAt)
		}
	}
	if s.Pruned != nil {
		fmt.Fprintf(tw, "Pruned\t%s in %s; history begins at seq %d\n", plural(int(s.Pruned.Events), "event", "events"),
			plural(s.Pruned.Ranges, "range", "ranges"), s.Pruned.Horizon)
	}
	fmt.Fprintf(tw, "Size on disk\t%s\n", humanBytes(s.DiskBytes))
	if s.Archive != nil {
		fmt.Fprintf(tw, "Archive\t%s\n", s.Archive.text())
	}
	var busy []string
	for _, b := range s.Busiest {
		busy = append(busy, fmt.Sprintf("%s (%s)", word(b.Name), plural(b.Count, "task", "tasks")))
	}
	sessions := fmt.Sprintf("%d", s.Sessions)
	if len(busy) > 0 {
		sessions += "; busiest: " + strings.Join(busy, ", ")
	}
	fmt.Fprintf(tw, "Sessions\t%s\n", sessions)
	tw.Flush()

	fmt.Fprintln(w, "\nEvents by type")
	width := digits(s.LastSeq)
	for _, t := range events.AllTypes() {
		fmt.Fprintf(w, "  %-22s %*d\n", t, width, s.Events[t.String()])
	}
	var odd []string
	for name := range s.Events {
		if _, ok := events.TypeByName(name); !ok {
			odd = append(odd, name)
		}
	}
	slices.Sort(odd)
	for _, name := range odd {
		fmt.Fprintf(w, "  %-22s %*d\n", name, width, s.Events[name])
	}

	states := func(m map[string]int, order []string) string {
		var parts []string
		for _, k := range order {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
		return strings.Join(parts, ", ")
	}
	taskOrder := []string{"pending", "running", "succeeded", "failed", "canceled"}
	fmt.Fprintf(w, "\nTasks: %d\n", s.Tasks.Total)
	fmt.Fprintf(w, "  by state  %s\n", states(s.Tasks.ByState, taskOrder))
	if len(s.Tasks.ByKind) > 0 {
		fmt.Fprintln(w, "  by kind")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for i, k := range s.Tasks.ByKind {
			if i == 20 {
				fmt.Fprintf(tw, "    ... %d more kinds\n", len(s.Tasks.ByKind)-20)
				break
			}
			var parts []string
			for _, st := range taskOrder {
				if n := k.ByState[st]; n > 0 {
					parts = append(parts, fmt.Sprintf("%s %d", st, n))
				}
			}
			fmt.Fprintf(tw, "    %s\t%d\t%s\n", word(k.Name), k.Count, strings.Join(parts, ", "))
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nWakes: %d\n", s.Wakes.Total)
	fmt.Fprintf(w, "  by state   %s\n", states(s.Wakes.ByState, []string{"available", "claimed", "acked"}))
	fmt.Fprintf(w, "  by reason  %s\n", states(s.Wakes.ByReason, []string{"requested", "task_finished"}))

	writeFlowText(w, s)

	fmt.Fprintln(w, "\nOldest unfinished work")
	if s.OldestTask == nil && s.OldestWake == nil {
		fmt.Fprintln(w, "  none: every task is terminal and every wake acknowledged")
		return
	}
	age := func(at string) string {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil || s.lastAt == 0 {
			return ""
		}
		d := time.Duration(s.lastAt - t.UnixNano())
		if d <= 0 {
			return ""
		}
		return fmt.Sprintf(", %s before the last event", d.Round(time.Millisecond))
	}
	if t := s.OldestTask; t != nil {
		detail := t.State
		if t.State == "running" {
			detail += fmt.Sprintf(", attempt %d, lease until %s", t.Attempts, t.LeaseExpiresAt)
		} else if t.ScheduledAt != t.CreatedAt {
			detail += ", scheduled for " + t.ScheduledAt
		}
		fmt.Fprintf(w, "  task  %s (%s, session %s): %s; submitted %s%s\n", t.ID, word(t.Kind), word(t.Session), detail, t.CreatedAt, age(t.CreatedAt))
	} else {
		fmt.Fprintln(w, "  task  none: every task is terminal")
	}
	if x := s.OldestWake; x != nil {
		detail := x.State + ", never claimed"
		if x.Attempts > 0 {
			detail = fmt.Sprintf("%s after %s", x.State, plural(int(x.Attempts), "delivery", "deliveries"))
		}
		fmt.Fprintf(w, "  wake  %s (%s, session %s): %s; recorded %s%s\n", x.ID, x.Reason, word(x.Session), detail,
			x.CreatedAt, age(x.CreatedAt))
	} else {
		fmt.Fprintln(w, "  wake  none: every wake is acknowledged")
	}
}

// writeFlowText lists the kind policies and the live schedules.
func writeFlowText(w io.Writer, s *statsJSON) {
	fmt.Fprintf(w, "\nKind policies: %d\n", len(s.Policies))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range s.Policies {
		var parts []string
		if p.Paused {
			parts = append(parts, "paused")
		}
		if p.MaxRunning > 0 {
			parts = append(parts, fmt.Sprintf("max running %d", p.MaxRunning))
		}
		if p.Rate > 0 {
			parts = append(parts, fmt.Sprintf("rate %g/s, burst %d", p.Rate, p.Burst))
		}
		if p.FairSessions {
			parts = append(parts, "fair sessions")
		}
		if p.MaxRunningPerSession > 0 {
			parts = append(parts, fmt.Sprintf("max running per session %d", p.MaxRunningPerSession))
			for _, sess := range slices.Sorted(maps.Keys(p.RunningBySession)) {
				parts = append(parts, fmt.Sprintf("%s holds %d", word(sess), p.RunningBySession[sess]))
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\n", word(p.Kind), strings.Join(parts, ", "))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nSchedules: %d\n", len(s.Schedules))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, x := range s.Schedules {
		zone := x.TimeZone
		if zone == "" {
			zone = "UTC"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%q in %s\tkind %s, catchup %s, %s\tnext %s\n", word(x.Session), word(x.Name), x.Cron, zone,
			word(x.Kind), x.Catchup, plural(int(x.Ticks), "tick", "ticks")+" in the log", x.Next)
	}
	tw.Flush()
}
