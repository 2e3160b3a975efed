package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/worklog/worklog/events"
	"io"
	"os"
	"text/tabwriter"

	"github.com/worklog/worklog/internal/pastfold"
)

// stateBySession prints the whole queue at a seq session by session (internal/pastfold):
// each session is folded through its own index and printed at once, so the first lines come
// after the first sessions' folds and memory holds one session's records, whatever the log's
// length. Tasks come session by session (in the store's session order), each session's in
// submission order; the wakes, in the same order, are spilled to a temporary file while the
// tasks are printed and follow them. The counts come last: they are known only at the end.
func (a *app) stateBySession(ctx context.Context, st store, dir string, o *stateOptions, seq, last uint64) (err error) {
	var at int64
	if seq > 0 {
		ev, err := st.Event(ctx, seq)
		if err != nil {
			return readError(dir, err)
		}
		at = ev.Head().At
	}
	spill, err := os.CreateTemp("", "worklog-replay-wakes-")
	if err != nil {
		return fmt.Errorf("replay: the wakes' spill file: %w", err)
	}
	defer func() { spill.Close(); os.Remove(spill.Name()) }()
	wakes := bufio.NewWriter(spill)

	w := a.out
	var nt, nw int
	if o.json {
		h := struct {
			Seq     uint64 `json:"seq"`
			LastSeq uint64 `json:"last_seq"`
			At      string `json:"at,omitempty"`
			Order   string `json:"order"`
		}{Seq: seq, LastSeq: last, Order: "by_session"}
		if seq > 0 {
			h.At = jsonTime(at)
		}
		b, err := json.Marshal(h)
		if err != nil {
			return err
		}
		w.Write(b[:len(b)-1])
		w.WriteString(`,"tasks":[`)
	} else {
		if seq == 0 {
			fmt.Fprintf(w, "State of the store at seq 0, before the first event: empty.\n")
			return nil
		}
		fmt.Fprintf(w, "State of the store after seq %d of %d (%s), session by session: each session's tasks in submission order, then the wakes in the same order, then the counts.\n",
			seq, last, fmtTime(at))
		if o.filter.active() {
			fmt.Fprintf(w, "Listed: %s.\n", o.filter.describe())
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	ww := tabwriter.NewWriter(wakes, 0, 0, 2, ' ', 0)
	err = pastfold.EachSession(ctx, st, seq, func(_ string, s *pastfold.Session) error {
		for _, t := range s.Mem.Tasks() {
			if !o.filter.task(t.Kind, t.State.String()) {
				continue
			}
			if nt++; o.json {
				if nt > 1 {
					w.WriteByte(',')
				}
				w.WriteByte('\n')
				if err := writeJSON(w, a.taskJSON(&t)); err != nil {
					return err
				}
			} else {
				if nt == 1 {
					fmt.Fprintln(w)
					fmt.Fprintln(tw, "TASK\tSESSION\tKIND\tSTATE\tATTEMPTS\tDETAIL")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", t.ID, word(t.SessionID), word(t.Kind), t.State, t.Attempts, a.taskDetail(&t, at))
			}
		}
		for _, x := range s.Mem.Wakes() {
			if !o.filter.wake(wakeState(&x)) {
				continue
			}
			if nw++; o.json {
				if nw > 1 {
					wakes.WriteByte(',')
				}
				wakes.WriteByte('\n')
				if err := writeJSON(wakes, a.wakeJSON(&x)); err != nil {
					return err
				}
			} else {
				if nw == 1 {
					fmt.Fprintln(ww, "WAKE\tSESSION\tREASON\tSTATE\tATTEMPTS\tDETAIL")
				}
				fmt.Fprintf(ww, "%s\t%s\t%s\t%s\t%d\t%s\n", x.ID, word(x.SessionID), x.Reason, wakeState(&x), x.Attempts, a.wakeDetail(&x, at))
			}
		}
		// A session's rows are aligned among themselves: the output goes out as each
		// session is folded, not when the whole state is known.
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := ww.Flush(); err != nil {
			return err
		}
		return w.Flush()
	})
	if err != nil {
		return readError(dir, err)
	}
	if err := wakes.Flush(); err != nil {
		return fmt.Errorf("replay: the wakes' spill file: %w", err)
	}
	if _, err := spill.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if o.json {
		w.WriteString("\n],\"wakes\":[")
		if _, err := io.Copy(w, spill); err != nil {
			return err
		}
		fmt.Fprintf(w, "\n],\"task_count\":%d,\"wake_count\":%d}\n", nt, nw)
		return nil
	}
	if nw > 0 {
		fmt.Fprintln(w)
		if _, err := io.Copy(w, spill); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nAfter seq %d: %s, %s.\n", seq, plural(nt, "task", "tasks"), plural(nw, "wake", "wakes"))
	return nil
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// seqAtTime is the seq a time cut of the whole log ends at: the last event before the first
// one stamped after at (0 when the first is). It reads the log up to there.
func seqAtTime(ctx context.Context, st store, at int64, last uint64) (uint64, error) {
	seq := last
	err := st.ReadRange(ctx, 1, last, func(ev events.Event) error {
		if h := ev.Head(); h.At > at {
			seq = h.Seq - 1
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, err
	}
	return seq, nil
}
