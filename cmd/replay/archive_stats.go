package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/events"
)

// archiveStatsJSON is stats' account of the archive of --archive.
type archiveStatsJSON struct {
	Dir      string `json:"dir"`
	Segments int    `json:"segments"`
	Events   uint64 `json:"events"` // distinct sequences held
	Bytes    int64  `json:"bytes"`  // size on disk
	// TornBytes are bytes after a segment's last valid frame: writes a crash interrupted,
	// never read.
	TornBytes int64 `json:"torn_bytes"`
	// Ranges are the sequences held, as [first, last] pairs.
	Ranges [][2]uint64 `json:"ranges"`
	// PrunedMissing counts the store's pruned events the archive does not hold (they stay
	// pruned for replay).
	PrunedMissing uint64 `json:"pruned_missing"`
}

func archiveStats(as *archivedStore) *archiveStatsJSON {
	r := as.arch
	a := &archiveStatsJSON{Dir: as.dir, Events: r.Events(), Bytes: r.Size(), Ranges: [][2]uint64{},
		PrunedMissing: as.left.Count()}
	for _, s := range r.Segments() {
		a.Segments++
		a.TornBytes += s.TornBytes
	}
	for _, x := range r.Ranges() {
		a.Ranges = append(a.Ranges, [2]uint64{x.From, x.To})
	}
	return a
}

// text is the archive's line of stats.
func (a *archiveStatsJSON) text() string {
	var rs []string
	for i, r := range a.Ranges {
		if i == 4 {
			rs = append(rs, fmt.Sprintf("… %d ranges in all", len(a.Ranges)))
			break
		}
		if r[0] == r[1] {
			rs = append(rs, fmt.Sprint(r[0]))
		} else {
			rs = append(rs, fmt.Sprintf("%d–%d", r[0], r[1]))
		}
	}
	held := "none"
	if len(rs) > 0 {
		held = "seqs " + strings.Join(rs, ", ")
	}
	s := fmt.Sprintf("%s: %s in %s, %s (%s)", a.Dir, plural(int(a.Events), "event", "events"),
		plural(a.Segments, "segment", "segments"), humanBytes(uint64(a.Bytes)), held)
	if a.TornBytes > 0 {
		s += fmt.Sprintf("; %s of torn writes ignored", humanBytes(uint64(a.TornBytes)))
	}
	if a.PrunedMissing == 0 {
		return s + "; it holds every pruned event"
	}
	return s + fmt.Sprintf("; %s pruned from the store are not in it", plural(int(a.PrunedMissing), "event", "events"))
}

// archiveVerifyJSON is verify's account of the archive of --archive.
type archiveVerifyJSON struct {
	Dir    string `json:"dir"`
	Events uint64 `json:"events"` // distinct sequences held, each decoded and checked
	// Missing are the store's pruned sequences the archive lacks, as [first, last] pairs;
	// each range is also one of the problems.
	Missing [][2]uint64 `json:"missing"`
}

// verifyArchive checks the archive: every checksum, every event decodes under its sequence,
// copies of a sequence are identical, an archived copy of a live event (left by a crash
// between the segment's fsync and the prune) equals the store's, and every pruned sequence
// is held. It returns the account and the problems found; a damaged segment (an
// *archive.Error: the archive cannot be read past it) is an error, as when the archive is
// opened, so that verify exits 2 naming the file and offset.
func verifyArchive(ctx context.Context, as *archivedStore, last uint64) (*archiveVerifyJSON, []string, error) {
	v := &archiveVerifyJSON{Dir: as.dir, Events: as.arch.Events(), Missing: [][2]uint64{}}
	var problems []string
	err := as.arch.ReadEvents(ctx, 0, 0, func(ev events.Event) error {
		seq := ev.Head().Seq
		switch {
		case as.pruned.Contains(seq):
		case seq > last:
			problems = append(problems, fmt.Sprintf("archive %s: seq %d is beyond the log's last sequence %d", as.dir, seq, last))
		default:
			live, ok, err := as.store.RawEvent(ctx, seq)
			if err != nil {
				return err
			}
			held, _, err := as.arch.Get(seq)
			if err != nil {
				return err
			}
			if ok && !bytes.Equal(live, held) {
				problems = append(problems, fmt.Sprintf("archive %s: seq %d differs from the store's event", as.dir, seq))
			}
		}
		return nil
	})
	var ae *archive.Error
	if errors.As(err, &ae) {
		return nil, nil, fmt.Errorf("archive %s: %w", as.dir, err)
	}
	if err != nil {
		problems = append(problems, fmt.Sprintf("archive %s: %v", as.dir, err))
	}
	for _, m := range as.left {
		v.Missing = append(v.Missing, [2]uint64{m.From, m.To})
		if m.From == m.To {
			problems = append(problems, fmt.Sprintf("archive %s: pruned seq %d is not in it", as.dir, m.From))
		} else {
			problems = append(problems, fmt.Sprintf("archive %s: pruned seqs %d–%d (%d events) are not in it", as.dir, m.From, m.To, m.To-m.From+1))
		}
	}
	return v, problems, nil
}
