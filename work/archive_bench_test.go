package work_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/work"
)

// BenchmarkPruneArchive measures what the archive costs a prune: a store of n settled tasks
// (a quarter with completion wakes, acknowledged; a direct wake per ten) is pruned whole,
// without and with Options.ArchiveDir, SyncAlways; only the Prune is timed. It reports the
// time per pruned subject and the archive's bytes per pruned event.
//
//	go test ./work -run '^$' -bench PruneArchive -benchtime 3x
func BenchmarkPruneArchive(b *testing.B) {
	const n = 4000
	for _, withArchive := range []bool{false, true} {
		b.Run(fmt.Sprintf("archive=%v", withArchive), func(b *testing.B) {
			var subjects int
			var events uint64
			var archBytes int64
			var total time.Duration
			for range b.N {
				dir := b.TempDir()
				o := &work.Options{}
				if withArchive {
					o.ArchiveDir = filepath.Join(dir, "archive")
				}
				q, err := work.Open(filepath.Join(dir, "store"), o)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
				input := json.RawMessage(`{"url":"https://example.com/some/page","attempt":1,"tags":["a","b","c"]}`)
				for i := range n {
					s := q.Session(fmt.Sprintf("s%d", i%100))
					r := work.TaskRequest{Kind: "crawl", Input: input}
					if i%4 == 0 {
						r.Wake = work.WakeOnCompletion
					}
					if _, err := s.SubmitAt(ctx, r, at); err != nil {
						b.Fatal(err)
					}
					if i%10 == 0 {
						if _, err := s.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"n":1}`)}, at); err != nil {
							b.Fatal(err)
						}
					}
				}
				for {
					ds, err := q.ClaimDueAt(ctx, at, time.Minute, 256)
					if err != nil || len(ds) == 0 {
						break
					}
					for _, d := range ds {
						if _, err := q.FinishAt(ctx, d, work.Success(json.RawMessage(`{"ok":true}`)), at); err != nil {
							b.Fatal(err)
						}
					}
				}
				for {
					wds, err := q.ClaimWakesAt(ctx, at, time.Minute, 256)
					if err != nil || len(wds) == 0 {
						break
					}
					for _, wd := range wds {
						if err := q.AckWakeAt(ctx, wd, at); err != nil {
							b.Fatal(err)
						}
					}
				}
				t0 := time.Now()
				res, err := q.Prune(ctx, at.Add(time.Hour))
				total += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				subjects += res.Tasks + res.Wakes
				events += res.Events
				q.Close()
				if withArchive {
					r, err := archive.Open(o.ArchiveDir)
					if err != nil {
						b.Fatal(err)
					}
					archBytes += r.Size()
				}
			}
			b.ReportMetric(float64(total.Microseconds())/float64(subjects), "µs/subject")
			if withArchive {
				b.ReportMetric(float64(archBytes)/float64(events), "archive-B/event")
			}
		})
	}
}
