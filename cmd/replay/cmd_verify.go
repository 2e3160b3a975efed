package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
)

const verifyLong = `Check a store: rebuild the projection from the log with the fold the live store uses, and
compare it with the stored one keyspace by keyspace (task and wake records field by field,
idempotency keys, the eligibility indexes, the per-session index, the last sequence); check
that the log is gap-free from seq 1 and that every event decodes (envelope, checksum, fields).
This is pebblelog's Store.Verify: the rebuild goes to a scratch store in a temporary directory
(outside the store), so memory stays bounded on any log size.

Exit status 0 when everything holds; 1 with every difference listed (which task or wake,
which field, stored vs rebuilt; at most 1000); 2 when the store cannot be read at all, or
when a segment of the archive of --archive is damaged (the file and offset named).`

func (a *app) verifyCommand() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "verify DIR",
		Short: "Rebuild the projection from the log and compare it with the stored one",
		Long:  verifyLong,
		Example: `  replay verify ./store && echo consistent
  replay verify ./store --json | jq .problems`,
		Args: storeArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			dir := displayName(args[0])
			st, err := a.openStore(dir)
			if err != nil {
				return err
			}
			defer st.Close()
			r, err := a.verify(c.Context(), st)
			if err != nil {
				return readError(dir, err)
			}
			if asJSON {
				if err := writeJSONLine(a.out, r); err != nil {
					return err
				}
			} else {
				r.writeText(a, dir)
			}
			if !r.OK {
				return exitCode(exitFindings)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON (docs/replay-json.md)")
	return c
}

type verifyResult struct {
	OK       bool     `json:"ok"`
	LastSeq  uint64   `json:"last_seq"`
	Tasks    int      `json:"tasks"`
	Wakes    int      `json:"wakes"`
	Problems []string `json:"problems"`
	// PrunedEvents counts the sequences the store pruned (absent when none): their events
	// are gone from the store, so only an archive (Archive) can check them.
	PrunedEvents uint64 `json:"pruned_events,omitempty"`
	pruned       projection.SeqRanges
	// Archive is the archive of --archive, checked too (absent without it).
	Archive *archiveVerifyJSON `json:"archive,omitempty"`
}

func (a *app) verify(ctx context.Context, st store) (*verifyResult, error) {
	p := a.newProgress("verifying", false)
	problems, err := st.Verify(ctx, pebblelog.VerifyOptions{Progress: p.update})
	p.finish()
	if err != nil {
		return nil, err
	}
	last, err := st.LastSeq(ctx)
	if err != nil {
		problems = append(problems, "last sequence: "+err.Error())
	}
	var av *archiveVerifyJSON
	if as, ok := st.(*archivedStore); ok {
		var ap []string
		if av, ap, err = verifyArchive(ctx, as, last); err != nil {
			return nil, err
		}
		problems = append(problems, ap...)
	}
	r := &verifyResult{OK: len(problems) == 0, LastSeq: last, Problems: problems, Archive: av}
	if as, ok := st.(*archivedStore); ok {
		r.pruned = as.pruned
	} else if r.pruned, err = st.PrunedRanges(ctx); err != nil {
		return nil, err
	}
	r.PrunedEvents = r.pruned.Count()
	if r.Problems == nil {
		r.Problems = []string{}
	}
	// Counting records is part of the report, not of the check: a record that does not
	// decode is already one of the problems.
	_ = st.ScanTasks(ctx, func(*projection.Task) error { r.Tasks++; return nil })
	_ = st.ScanWakes(ctx, func(*projection.Wake) error { r.Wakes++; return nil })
	return r, nil
}

func (r *verifyResult) writeText(a *app, dir string) {
	w := a.out
	if r.OK && r.LastSeq == 0 {
		fmt.Fprintf(w, "verify %s: ok. The log is empty and so is the stored projection.\n", dir)
		return
	}
	if r.OK && r.Archive != nil {
		defer fmt.Fprintf(w, "The archive %s holds every pruned event (%s archived), each intact and decoded.\n", r.Archive.Dir, plural(int(r.Archive.Events), "event", "events"))
	}
	if r.OK && r.PrunedEvents > 0 {
		// Say what was checked: the live events; the pruned ones only through an archive.
		live := r.LastSeq - r.PrunedEvents
		checked := "not checked here (their events are gone from the store; --archive checks an archive of them)"
		if r.Archive != nil {
			checked = "checked in the archive"
		}
		fmt.Fprintf(w, "verify %s: ok. The log runs to seq %d: %s live, each present and decoding, and %s pruned (%s), %s; the stored projection (%s, %s, idempotency keys, indexes, last sequence) equals a rebuild from the live events.\n",
			dir, r.LastSeq, plural(int(live), "event", "events"), plural(int(r.PrunedEvents), "event", "events"),
			seqRangesText(r.pruned), checked, plural(r.Tasks, "task", "tasks"), plural(r.Wakes, "wake", "wakes"))
		return
	}
	if r.OK {
		fmt.Fprintf(w, "verify %s: ok. The log has %s (seq 1..%d), gap-free, and every one decodes; the stored projection (%s, %s, idempotency keys, indexes, last sequence) equals a rebuild from the log.\n",
			dir, plural(int(r.LastSeq), "event", "events"), r.LastSeq, plural(r.Tasks, "task", "tasks"), plural(r.Wakes, "wake", "wakes"))
		return
	}
	fmt.Fprintf(w, "verify %s: FAILED, %s:\n", dir, plural(len(r.Problems), "problem", "problems"))
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  %s\n", p)
	}
}

// seqRangesText is ranges as "seq 4" or "seqs 1–6, 8–10", the first five of them.
func seqRangesText(rs projection.SeqRanges) string {
	var parts []string
	for i, r := range rs {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d more ranges", len(rs)-5))
			break
		}
		if r.From == r.To {
			parts = append(parts, fmt.Sprint(r.From))
		} else {
			parts = append(parts, fmt.Sprintf("%d–%d", r.From, r.To))
		}
	}
	if len(rs) == 1 && rs[0].From == rs[0].To {
		return "seq " + parts[0]
	}
	return "seqs " + strings.Join(parts, ", ")
}
