package work

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/internal/pebbleengine"
)

var archiveEpoch = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// archiveHistory writes n rounds of prunable history (submits with and without completion
// wakes, claims, an extend, a release, successes, failures, cancels, direct wakes claimed
// and acknowledged, a stale finish's audit) plus live work no prune touches, all before
// archiveEpoch+1h. It returns the clock after it.
func archiveHistory(t *testing.T, q *Queue, n int, big bool) time.Time {
	t.Helper()
	ctx := context.Background()
	clock := archiveEpoch
	tick := func() time.Time { clock = clock.Add(time.Millisecond); return clock }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		s := q.Session(fmt.Sprintf("session-%d", i%3))
		r := TaskRequest{Kind: []string{"email", "report"}[i%2], Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), IdempotencyKey: fmt.Sprint("k", i)}
		if i%3 == 0 {
			r.Wake = WakeOnCompletion
		}
		if i == 5 && big { // a value large enough for a blob file (store format 4): archived whole
			r.Input = json.RawMessage(`"` + strings.Repeat("x", 300<<10) + `"`)
		}
		tk, err := s.SubmitAt(ctx, r, tick())
		must(err)
		if i%7 == 6 {
			_, err := s.CancelAt(ctx, tk.ID, tick())
			must(err)
		} else {
			ds, err := q.ClaimDueAt(ctx, tick(), time.Minute, 1)
			must(err)
			if len(ds) != 1 {
				t.Fatalf("claimed %d", len(ds))
			}
			d := ds[0]
			if i%5 == 1 {
				d, err = q.ExtendAt(ctx, d, time.Hour, tick())
				must(err)
			}
			if i%5 == 2 {
				_, err = q.ReleaseAt(ctx, d, ReleaseRequest{Reason: "later"}, tick())
				must(err)
				ds, err = q.ClaimDueAt(ctx, tick(), time.Minute, 1)
				must(err)
				d = ds[0]
			}
			if i%6 == 0 { // the lease expires, another claim takes it; the first finish is an audit event
				clock = clock.Add(2 * time.Hour)
				ds, err := q.ClaimDueAt(ctx, tick(), time.Minute, 1)
				must(err)
				if _, err := q.FinishAt(ctx, d, Success(nil), tick()); !errors.Is(err, ErrStaleDelivery) {
					t.Fatalf("stale finish: %v", err)
				}
				d = ds[0]
			}
			o := Success(json.RawMessage(`{"ok":true}`))
			if i%4 == 3 {
				o = Failure("smtp down")
			}
			_, err = q.FinishAt(ctx, d, o, tick())
			must(err)
		}
		if i%4 == 0 {
			_, err := s.WakeAt(ctx, WakeRequest{Payload: json.RawMessage(`"ping"`)}, tick())
			must(err)
		}
		ws, err := q.ClaimWakesAt(ctx, tick(), time.Minute, 10)
		must(err)
		for _, w := range ws {
			must(q.AckWakeAt(ctx, w, tick()))
		}
	}
	// Live: pending and an unacknowledged wake.
	_, err := q.Session("live").SubmitAt(ctx, TaskRequest{Kind: "later", RunAt: archiveEpoch.Add(1000 * time.Hour)}, tick())
	must(err)
	_, err = q.Session("live").WakeAt(ctx, WakeRequest{}, tick())
	must(err)
	return clock
}

// wireLog returns the store's log as stored: seq -> wire bytes.
func wireLog(t *testing.T, q *Queue) map[uint64][]byte {
	t.Helper()
	pe, _ := q.pebble()
	out := map[uint64][]byte{}
	if err := pe.Store().RawLog(context.Background(), 1, 0, func(seq uint64, raw []byte) error {
		out[seq] = bytes.Clone(raw)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkArchive checks that the archive in dir holds exactly the store's pruned sequences,
// each byte for byte as the log held it before the prune (before), and each once.
func checkArchive(t *testing.T, fs vfs.FS, dir string, q *Queue, before map[uint64][]byte) {
	t.Helper()
	pe, _ := q.pebble()
	pruned, err := pe.Store().PrunedRanges(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r, err := archive.OpenFS(fs, dir)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.Ranges()) != fmt.Sprint(pruned) || len(pruned) == 0 {
		t.Fatalf("the archive holds %v, the store pruned %v", r.Ranges(), pruned)
	}
	seen := map[uint64]bool{}
	if err := r.Read(context.Background(), 0, 0, func(seq uint64, wire []byte) error {
		if seen[seq] {
			return fmt.Errorf("seq %d read twice", seq)
		}
		seen[seq] = true
		if !bytes.Equal(wire, before[seq]) {
			return fmt.Errorf("seq %d: the archive's bytes differ from the log's before the prune", seq)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if uint64(len(seen)) != pruned.Count() {
		t.Fatalf("read %d events, the store pruned %d", len(seen), pruned.Count())
	}
	if err := r.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The archive read back equals the pruned events byte for byte, over several prune calls
// of several groups each; what is live stays in the store and out of the archive.
func TestArchiveHoldsPrunedEvents(t *testing.T) {
	defer SetPruneGroup(7)()
	dir := t.TempDir()
	arch := filepath.Join(t.TempDir(), "archive")
	q, err := Open(filepath.Join(dir, "store"), &Options{ArchiveDir: arch})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	end := archiveHistory(t, q, 60, true)
	before := wireLog(t, q)
	for _, cut := range []time.Time{archiveEpoch.Add(3 * time.Hour), archiveEpoch.Add(9 * time.Hour), end.Add(time.Hour)} {
		res, err := q.Prune(ctx, cut)
		if err != nil {
			t.Fatal(err)
		}
		if res.Events == 0 {
			t.Fatalf("prune before %v removed nothing", cut)
		}
		checkArchive(t, vfs.Default, arch, q, before)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	after := wireLog(t, q)
	if len(after) == 0 || len(after) >= len(before) {
		t.Fatalf("the store kept %d of %d events", len(after), len(before))
	}
	r, _ := archive.Open(arch)
	for seq := range after {
		if r.Ranges().Contains(seq) {
			t.Fatalf("live event %d is in the archive", seq)
		}
	}
}

// A crash between the archive's fsync and the prune's commit leaves the events archived
// and live: the store opens with everything, the next prune archives them again, and the
// archive reads each pruned event exactly once, equal to the log's.
//
// With SyncNever too: only durable events are archived (PlanPrune syncs the WAL), so an
// archived event the crash left live is in the store, the same bytes under the same seq;
// and the blob-sized value's file survives the crash (it was fsynced before its batch
// committed), so no durable event refers to a missing blob.
func TestArchiveCrashBetweenSegmentAndPrune(t *testing.T) {
	for _, sync := range []SyncMode{SyncAlways, SyncNever} {
		t.Run(sync.String(), func(t *testing.T) { testArchiveCrash(t, sync) })
	}
}

func testArchiveCrash(t *testing.T, sync SyncMode) {
	defer SetPruneGroup(5)()
	fs := vfs.NewCrashableMem()
	const dir, arch = "/data/store", "/data/archive"
	q, err := Open(dir, &Options{FS: fs, ArchiveDir: arch, Sync: sync})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A blob-sized value in both modes: with SyncNever too its blob file is fsynced before
	// its batch commits, so the WAL syncs of the prune (PlanPrune's, the one forced before
	// pruned blobs are removed) never make durable an event whose blob the crash loses.
	end := archiveHistory(t, q, 30, true)
	before := wireLog(t, q)
	var clones []*vfs.MemFS
	pebbleengine.ArchiveCommitted = func() {
		if len(clones) < 3 { // the first groups: the crash falls after a committed group too
			clones = append(clones, fs.CrashClone(vfs.CrashCloneCfg{}))
		}
	}
	defer func() { pebbleengine.ArchiveCommitted = nil }()
	if _, err := q.Prune(ctx, end.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	pebbleengine.ArchiveCommitted = nil
	q.Close()
	for i, clone := range clones {
		q, err := Open(dir, &Options{FS: clone, ArchiveDir: arch, Sync: sync})
		if err != nil {
			t.Fatalf("clone %d: %v", i, err)
		}
		if err := q.Verify(ctx); err != nil {
			t.Fatalf("clone %d: %v", i, err)
		}
		pe, _ := q.pebble()
		pruned, _ := pe.Store().PrunedRanges(context.Background())
		r, err := archive.OpenFS(clone, arch)
		if err != nil {
			t.Fatalf("clone %d: %v", i, err)
		}
		// The group of the crash is archived and not pruned.
		if extra := r.Ranges().Count() - pruned.Count(); extra == 0 {
			t.Fatalf("clone %d: the archive holds no more than the store pruned (%v, %v)", i, r.Ranges(), pruned)
		}
		if m := r.Missing(pruned); len(m) != 0 {
			t.Fatalf("clone %d: pruned but not archived: %v", i, m)
		}
		live := wireLog(t, q)
		if err := r.Read(ctx, 0, 0, func(seq uint64, wire []byte) error {
			if !pruned.Contains(seq) && !bytes.Equal(live[seq], wire) {
				return fmt.Errorf("archived seq %d is neither pruned nor the store's event", seq)
			}
			return nil
		}); err != nil {
			t.Fatalf("clone %d: %v", i, err)
		}
		if _, err := q.Prune(ctx, end.Add(time.Hour)); err != nil {
			t.Fatalf("clone %d: %v", i, err)
		}
		checkArchive(t, clone, arch, q, before)
		q.Close()
	}
	if len(clones) != 3 {
		t.Fatalf("%d crash points", len(clones))
	}
}

func TestArchiveDirValidation(t *testing.T) {
	base := t.TempDir()
	store := filepath.Join(base, "store")
	for _, a := range []string{"  ", store, filepath.Join(store, "archive"), store + "/./x/.."} {
		_, err := Open(store, &Options{ArchiveDir: a})
		var oe *OptionError
		if !errors.As(err, &oe) || !errors.Is(err, ErrInvalidOptions) || oe.Options != "work.Options" || oe.Field != "ArchiveDir" {
			t.Fatalf("ArchiveDir %q: %v", a, err)
		}
	}
	if _, err := os.Stat(store); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused Open touched the store directory: %v", err)
	}
	// A second queue cannot write the same archive.
	q, err := Open(store, &Options{ArchiveDir: filepath.Join(base, "a")})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	_, err = Open(filepath.Join(base, "store2"), &Options{ArchiveDir: filepath.Join(base, "a")})
	if !errors.Is(err, archive.ErrLocked) || !errors.Is(err, ErrBackend) {
		t.Fatalf("two queues on one archive: %v", err)
	}
}

// A subject that becomes prunable ahead of the planned group between the phases makes the
// writer's group hold an event not archived: nothing is pruned (ErrNotArchived), the group
// is planned again, and the archive still equals the pruned events.
func TestArchiveReplansWhenTheGroupChanged(t *testing.T) {
	defer SetPruneGroup(3)()
	dir := t.TempDir()
	arch := filepath.Join(dir, "archive")
	q, err := Open(filepath.Join(dir, "store"), &Options{ArchiveDir: arch})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	end := archiveHistory(t, q, 12, true)
	early := archiveEpoch.Add(-2 * time.Hour)
	tk, err := q.Session("late").SubmitAt(ctx, TaskRequest{Kind: "late"}, early)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, early, 10*time.Hour, 1)
	if err != nil || len(ds) != 1 || ds[0].Task.ID != tk.ID {
		t.Fatalf("claim: %v %v", ds, err)
	}
	before := wireLog(t, q)
	calls := 0
	pebbleengine.ArchiveCommitted = func() {
		calls++
		if calls == 1 { // finished "before" every planned subject: first in the retention index
			if _, err := q.FinishAt(ctx, ds[0], Success(nil), early.Add(time.Minute)); err != nil {
				t.Error(err)
			}
			for seq, b := range wireLog(t, q) { // with the late task's settlement
				before[seq] = b
			}
		}
	}
	replans := pebbleengine.ArchiveReplans.Load()
	defer func() { pebbleengine.ArchiveCommitted = nil }()
	res, err := q.Prune(ctx, end.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pebbleengine.ArchiveCommitted = nil
	if pebbleengine.ArchiveReplans.Load() == replans || res.Tasks == 0 {
		t.Fatalf("no group was planned again (%d archive commits for %+v)", calls, res)
	}
	checkArchive(t, vfs.Default, arch, q, before)
	if _, found, _ := q.Session("late").Task(ctx, tk.ID); found {
		t.Fatal("the late task was not pruned")
	}
}
