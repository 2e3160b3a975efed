package pebblelog

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Test times: Unix nanoseconds after a fixed epoch, so that every run writes the same log.
const testEpoch = int64(1_767_225_600_000_000_000) // 2026-01-01T00:00:00Z

func sec(n int) int64 { return testEpoch + int64(n)*1e9 }

// openT opens dir with o and closes the store at the end of the test.
func openT(t *testing.T, dir string, o *Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// appendEvents commits evs as one command.
func appendEvents(t *testing.T, s *Store, evs ...events.Event) {
	t.Helper()
	if err := update(s, evs...); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

// update appends evs as one command and returns its error.
func update(s *Store, evs ...events.Event) error {
	return s.Update(context.Background(), func(tx *Txn) error {
		for _, ev := range evs {
			if err := tx.Append(ev); err != nil {
				return err
			}
		}
		return nil
	})
}

func submitted(session, task string, at int64, wake bool) *events.TaskSubmitted {
	return &events.TaskSubmitted{
		Header: events.Header{SessionID: session, At: at},
		TaskID: task, Kind: "test.kind", Input: []byte(`{"n":1}`), WakeOnCompletion: wake,
	}
}

func claimed(session, task string, at int64, attempt uint32, token string) *events.TaskClaimed {
	return &events.TaskClaimed{
		Header: events.Header{SessionID: session, At: at},
		TaskID: task, Attempt: attempt, LeaseToken: token, LeaseExpiresAt: at + 30e9,
	}
}

func settled(session, task string, at int64, attempt uint32, token string) *events.TaskSettled {
	return &events.TaskSettled{
		Header: events.Header{SessionID: session, At: at},
		TaskID: task, Attempt: attempt, LeaseToken: token,
		Outcome: events.Outcome{State: events.StateSucceeded, Output: []byte(`"ok"`)},
	}
}

func requestedWake(session, wake string, at int64) *events.WakeRecorded {
	return &events.WakeRecorded{
		Header: events.Header{SessionID: session, At: at},
		WakeID: wake, Reason: events.WakeRequested, Payload: []byte(`{"hello":true}`),
	}
}

// seedStore writes a small history touching every kind of record and index: six events.
//
//	1 task t1 submitted (s1)      4 task t2 submitted (s2, key k2, wakes on completion)
//	2 task t1 claimed             5 wake w1 requested (s1)
//	3 task t1 settled             6 task t3 submitted (s1), still pending
func seedStore(t *testing.T, s *Store) {
	t.Helper()
	appendEvents(t, s, submitted("s1", "t1", sec(1), false))
	appendEvents(t, s, claimed("s1", "t1", sec(2), 1, "tok-1"))
	appendEvents(t, s, settled("s1", "t1", sec(3), 1, "tok-1"))
	t2 := submitted("s2", "t2", sec(4), true)
	t2.IdempotencyKey = "k2"
	appendEvents(t, s, t2)
	appendEvents(t, s, requestedWake("s1", "w1", sec(5)))
	appendEvents(t, s, submitted("s1", "t3", sec(6), false))
}

// listing returns every path under dir with its size, sorted: a fingerprint of what is on
// disk, to show that a refused Open wrote nothing.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, fmt.Sprintf("%s %d %v", rel, info.Size(), info.Mode()))
		return nil
	})
	if err != nil {
		t.Fatalf("listing %s: %v", dir, err)
	}
	slices.Sort(out)
	return out
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// verifyProblems runs Verify and fails the test on an error (not a problem).
func verifyProblems(t *testing.T, s *Store) []string {
	t.Helper()
	p, err := s.Verify(context.Background(), VerifyOptions{})
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return p
}

func mustVerify(t *testing.T, s *Store) {
	t.Helper()
	if p := verifyProblems(t, s); len(p) > 0 {
		t.Fatalf("Verify found %d problem(s):\n%s", len(p), strings.Join(p, "\n"))
	}
}

// hasProblem reports whether some problem contains every one of parts.
func hasProblem(problems []string, parts ...string) bool {
	for _, p := range problems {
		all := true
		for _, part := range parts {
			if !strings.Contains(p, part) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func readAll(t *testing.T, s *Store) []events.Event {
	t.Helper()
	var out []events.Event
	if err := s.ReadLog(context.Background(), 0, func(ev events.Event) error {
		out = append(out, ev)
		return nil
	}); err != nil {
		t.Fatalf("ReadLog: %v", err)
	}
	return out
}

// The keys of one entry of each index, for tests that write or delete them by hand.

func dueKey(pri, at int64, seq uint64) []byte {
	return indexEntryKey(projection.IndexDue, "", projection.IndexEntry{Pri: pri, At: at, Seq: seq})
}

func kindIndexKey(kind string, pri, at int64, seq uint64) []byte {
	return indexEntryKey(projection.IndexKindDue, kind, projection.IndexEntry{Pri: pri, At: at, Seq: seq})
}

func sessionWakeKey(session string, at int64, seq uint64) []byte {
	return indexEntryKey(projection.IndexSessionWakes, session, projection.IndexEntry{At: at, Seq: seq})
}
