package work_test

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestPruner runs the background pruner's scenarios (work/worktest, RunPruner) on a durable
// queue; postgres runs the same on PostgreSQL: one loop, package work's, for both. Break
// fails every write of the store's WAL (Pebble's errorfs).
func TestPruner(t *testing.T) {
	worktest.RunPruner(t, worktest.PrunerHarness{
		New: func(t *testing.T) worktest.PrunerStore {
			dir := t.TempDir()
			var broken atomic.Bool
			fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
				if broken.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
					return errorfs.ErrInjected
				}
				return nil
			}))
			return worktest.PrunerStore{
				Open: func(t *testing.T, retention, interval time.Duration, logger *slog.Logger) *work.Queue {
					t.Helper()
					q, err := work.Open(dir, &work.Options{Retention: retention, PruneInterval: interval, Logger: logger, FS: fs})
					if err != nil {
						t.Fatal(err)
					}
					return q
				},
				Break: func(*testing.T) { broken.Store(true) },
			}
		},
	})
}
