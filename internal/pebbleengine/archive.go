package pebbleengine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"

	engineapi "github.com/worklog/worklog/internal/engine"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/pebblelog"
)

// The archive of pruned events (Options.ArchiveDir; docs/design.md, "Retention"). A durable
// queue with an archive prunes each group in two phases (pebblelog/archive.go): its events
// are read from a durable snapshot and written into the archive, which is fsynced, and only
// then does the writer prune the group, if it still removes only archived events.

// archiver is a queue's archive writer. mu serializes prune groups (Queue.Prune and the
// background pruner may run at once), so that a group is planned, archived and pruned
// before the next one is planned.
type archiver struct {
	mu sync.Mutex
	w  *archive.Writer
}

// maxArchiveRetries bounds how often a group is planned again because the group the writer
// found held an event not archived (a subject that became prunable before the planned ones
// between the phases). Each retry archives a fresh group; the events archived before stay
// (copies are identical), so a retry costs only disk.
const maxArchiveRetries = 8

// ArchiveCommitted, when set (tests), runs between the archive's fsync and the prune
// command: a crash clone taken there holds the events archived and still live.
var ArchiveCommitted func()

// ArchiveReplans counts groups planned again after ErrNotArchived (tests read it).
var ArchiveReplans atomic.Int64

// openArchiver opens the archive writer of a durable queue.
func openArchiver(archiveDir string, fs vfs.FS) (*archiver, error) {
	w, err := archive.OpenWriter(archiveDir, &archive.WriterOptions{FS: fs})
	if err != nil {
		return nil, fmt.Errorf("opening the archive (options.ArchiveDir): %w", err)
	}
	return &archiver{w: w}, nil
}

func (a *archiver) close() error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.w.Close()
}

// pruneArchived is PruneGroup on a queue with an archive.
func (e *Engine) pruneArchived(ctx context.Context, before int64, limit int) (engineapi.PruneGroupResult, error) {
	a := e.arch
	a.mu.Lock()
	defer a.mu.Unlock()
	for attempt := 0; ; attempt++ {
		seqs, _, err := e.st.PlanPrune(ctx, before, limit, a.w.Add)
		if err != nil {
			a.w.Abort()
			return engineapi.PruneGroupResult{}, err
		}
		if len(seqs) == 0 {
			return engineapi.PruneGroupResult{}, nil
		}
		if err := a.w.Commit(); err != nil {
			return engineapi.PruneGroupResult{}, err // nothing is pruned that is not archived
		}
		if ArchiveCommitted != nil {
			ArchiveCommitted()
		}
		var r pebblelog.PruneResult
		err = e.Update(ctx, func(tx engineapi.Txn) error {
			var err error
			r, err = tx.(pebbleTxn).t.PruneArchived(before, limit, seqs) // set afresh: the closure may run twice
			return err
		})
		if errors.Is(err, pebblelog.ErrNotArchived) && attempt < maxArchiveRetries {
			ArchiveReplans.Add(1)
			continue
		}
		if err != nil {
			return engineapi.PruneGroupResult{}, err
		}
		return engineapi.PruneGroupResult{Tasks: r.Tasks, Wakes: r.Wakes, Events: r.Events, More: r.More}, nil
	}
}
