package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/work"
)

// archivedDemo returns a copy of the demo store, and a second copy pruned by a queue with
// an archive: everything prunable before before went into the archive. prePrune, when
// set, is a prune of the same copy without an archive first: its events are not archived.
func archivedDemo(t *testing.T, before, prePrune time.Time) (full, pruned, arch string) {
	t.Helper()
	full = demoStore(t)
	pruned = filepath.Join(t.TempDir(), "store")
	if err := copyDir(demoDir, pruned); err != nil {
		t.Fatal(err)
	}
	arch = filepath.Join(t.TempDir(), "archive")
	ctx := context.Background()
	if !prePrune.IsZero() {
		q, err := work.Open(pruned, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := q.Prune(ctx, prePrune); err != nil || res.Events == 0 {
			t.Fatalf("prune without an archive: %+v %v", res, err)
		}
		q.Close()
	}
	q, err := work.Open(pruned, &work.Options{ArchiveDir: arch})
	if err != nil {
		t.Fatal(err)
	}
	res, err := q.Prune(ctx, before)
	if err != nil || res.Events == 0 {
		t.Fatalf("prune: %+v %v", res, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return full, pruned, arch
}

// demoEvents reads the demo's log as JSON lines.
func demoEvents(t *testing.T, dir string) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(mustReplay(t, "log", dir, "--json")), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// With its archive, a pruned store reads as the unpruned one: log, export, state at every
// point (before the horizon too), timeline of every session, task of pruned subjects.
func TestArchiveReplaySameAsUnpruned(t *testing.T) {
	full, pruned, arch := archivedDemo(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), time.Time{})
	r, err := archive.Open(arch)
	if err != nil {
		t.Fatal(err)
	}
	if r.Events() == 0 {
		t.Fatal("nothing archived")
	}
	// Without the archive the store is pruned: log marks it.
	if out := mustReplay(t, "log", pruned); !strings.Contains(out, "pruned") {
		t.Fatalf("the pruned store's log marks nothing pruned:\n%s", out)
	}
	evs := demoEvents(t, full)
	sessions := map[string]bool{}
	var prunedIDs []string
	for _, e := range evs {
		sessions[e["session"].(string)] = true
		if id, ok := e["task_id"].(string); ok && e["event"] == "task_submitted" && r.Ranges().Contains(uint64(e["seq"].(float64))) {
			prunedIDs = append(prunedIDs, id)
		}
		if id, ok := e["wake_id"].(string); ok && e["event"] == "wake_recorded" && r.Ranges().Contains(uint64(e["seq"].(float64))) {
			prunedIDs = append(prunedIDs, id)
		}
	}
	if len(prunedIDs) == 0 {
		t.Fatal("no pruned subject")
	}
	cmds := [][]string{{"log"}, {"log", "--json"}, {"export"}, {"state"}, {"state", "--json"}}
	for _, seq := range []int{1, 3, len(evs) / 3, len(evs) / 2, len(evs) - 1} {
		cmds = append(cmds, []string{"state", "--at-seq", fmt.Sprint(seq)})
	}
	cmds = append(cmds, []string{"state", "--at", evs[len(evs)/2]["at"].(string)})
	for s := range sessions {
		cmds = append(cmds, []string{"timeline", "--session", s}, []string{"log", "--session", s})
	}
	for _, id := range prunedIDs {
		cmds = append(cmds, []string{"task", id})
	}
	for _, c := range cmds {
		want := mustReplay(t, append([]string{c[0], full}, c[1:]...)...)
		got := mustReplay(t, append([]string{c[0], pruned, "--archive", arch}, c[1:]...)...)
		want = strings.ReplaceAll(want, full, "DIR")
		got = strings.ReplaceAll(got, pruned, "DIR")
		if got != want {
			t.Fatalf("replay %v differs with the archive from the unpruned store:\n--- got\n%s\n--- want\n%s", c, got, want)
		}
	}

	// stats reports the archive; verify checks it.
	var st statsJSON
	if err := json.Unmarshal([]byte(mustReplay(t, "stats", pruned, "--archive", arch, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Archive == nil || st.Archive.Events != r.Events() || st.Archive.PrunedMissing != 0 || st.Pruned == nil ||
		st.Pruned.Events != r.Events() || st.Archive.Segments != 1 || st.Archive.Bytes != r.Size() {
		t.Fatalf("stats: %+v archive %+v", st.Pruned, st.Archive)
	}
	if out := mustReplay(t, "stats", pruned, "--archive", arch); !strings.Contains(out, "holds every pruned event") {
		t.Fatalf("stats:\n%s", out)
	}
	if out := mustReplay(t, "verify", pruned, "--archive", arch); !strings.Contains(out, "holds every pruned event") {
		t.Fatalf("verify:\n%s", out)
	}
}

// An archive that lacks some pruned events (pruned before the archive was configured):
// those stay marked pruned, the rest read from the archive; verify names what is missing.
func TestArchivePartial(t *testing.T) {
	t0 := time.Date(2026, 3, 2, 9, 2, 0, 0, time.UTC)
	_, pruned, arch := archivedDemo(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), t0)
	log := mustReplay(t, "log", pruned, "--archive", arch)
	if !strings.Contains(log, "pruned") {
		t.Fatalf("log marks no unarchived range:\n%s", log)
	}
	without := mustReplay(t, "log", pruned)
	if len(log) <= len(without) {
		t.Fatal("the archive added nothing to the log")
	}
	v := replay(t, "verify", pruned, "--archive", arch)
	if v.code != exitFindings || !strings.Contains(v.stdout, "are not in it") && !strings.Contains(v.stdout, "is not in it") {
		t.Fatalf("verify: exit %d\n%s%s", v.code, v.stdout, v.stderr)
	}
	var vr verifyResult
	if err := json.Unmarshal([]byte(replay(t, "verify", pruned, "--archive", arch, "--json").stdout), &vr); err != nil {
		t.Fatal(err)
	}
	if vr.OK || vr.Archive == nil || len(vr.Archive.Missing) == 0 {
		t.Fatalf("verify --json: %+v", vr)
	}
	// a state before the unarchived range's end is refused as before the horizon
	if r := replay(t, "state", pruned, "--archive", arch, "--at-seq", "1"); r.code != exitError || !strings.Contains(r.stderr, "pruned") {
		t.Fatalf("state --at-seq 1: %d %s", r.code, r.stderr)
	}
}

// Damaged segment bytes are refused, naming the file; a missing archive dir is one line.
func TestArchiveDamaged(t *testing.T) {
	_, pruned, arch := archivedDemo(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), time.Time{})
	seg := filepath.Join(arch, "seg-000001.wla")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"log", pruned}, {"state", pruned, "--at-seq", "2"}, {"verify", pruned}} {
		r := replay(t, append(c, "--archive", arch)...)
		if r.code != exitError || !strings.Contains(r.stderr, seg) {
			t.Fatalf("replay %v on a damaged archive: exit %d\n%s%s", c, r.code, r.stdout, r.stderr)
		}
	}
	r := replay(t, "log", pruned, "--archive", filepath.Join(arch, "nope"))
	if r.code != exitError || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.Contains(r.stderr, "--archive") {
		t.Fatalf("a missing archive: %d %q", r.code, r.stderr)
	}
}

func TestArchiveFlagRefused(t *testing.T) {
	for _, args := range [][]string{{"demo", t.TempDir() + "/d"}, {"import", "-", t.TempDir() + "/i"}, {"export", demoDir, "--wire"}} {
		r := replay(t, append(args, "--archive", t.TempDir())...)
		if r.code != exitError || !strings.Contains(r.stderr, "--archive") {
			t.Fatalf("replay %v --archive: %d %s", args, r.code, r.stderr)
		}
	}
}

// TestArchiveLyingLengths: a segment whose first frame's header, its checksum valid, claims a
// length no writer writes (a raw payload of 1e9 or 4e9 bytes, a stored one of 4e9), sealed or
// the last one left unsealed, is refused by every command that reads the archive: exit 2,
// naming the file and the field's offset. (An unsealed one was taken for a torn tail: log
// exited 0 without the archived events, verify reported them missing.)
func TestArchiveLyingLengths(t *testing.T) {
	full, pruned, arch := archivedDemo(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), time.Time{})
	seg := filepath.Join(arch, "seg-000001.wla")
	orig, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	evs := demoEvents(t, full)
	taskID := evs[0]["task_id"].(string)
	session := evs[0]["session"].(string)
	const frame = 32 // the first frame's header, after the segment's
	for _, tc := range []struct {
		name  string
		field int // the offset of the u32 in the frame header
		value uint32
	}{{"raw 1e9", 20, 1e9}, {"raw 4e9", 20, 4e9}, {"stored 4e9", 16, 4e9}} {
		for _, sealed := range []bool{true, false} {
			b := slices.Clone(orig)
			if !sealed {
				b = b[:len(b)-16] // the seal: the segment is then the last one written, not closed
			}
			binary.BigEndian.PutUint32(b[frame+tc.field:], tc.value)
			binary.BigEndian.PutUint32(b[frame+48:], crc32.Checksum(b[frame:frame+48], crc32.MakeTable(crc32.Castagnoli)))
			if err := os.WriteFile(seg, b, 0o644); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%s at offset %d", seg, frame+tc.field)
			for _, c := range [][]string{
				{"log"}, {"log", "--json"}, {"export"}, {"state"}, {"state", "--at-seq", "2"}, {"verify"}, {"verify", "--json"},
				{"stats"}, {"task", taskID}, {"timeline", "--session", session}, {"log", "--session", session},
			} {
				args := append([]string{c[0], pruned, "--archive", arch}, c[1:]...)
				r := replay(t, args...)
				if r.code != exitError || !strings.Contains(r.stderr, want) {
					t.Errorf("%s, sealed %v: replay %v: exit %d, stderr %q: want exit 2 naming %q", tc.name, sealed, c, r.code, r.stderr, want)
				}
			}
		}
	}
}
