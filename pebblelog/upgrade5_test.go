package pebblelog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// readFormat4Wakes reads testdata/format4-wakes.json: the fixture's wakes by session.
func readFormat4Wakes(t *testing.T) format4Wakes {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "format4-wakes.json"))
	if err != nil {
		t.Fatal(err)
	}
	var w format4Wakes
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// format4Wakes is what testdata/format4-wakes.json records of the format-4 fixture (written
// by TestWriteFormat4Fixture, at 0d480f7): every wake id by session in creation order, the
// acknowledged ones, the ones under a lease until T0+600s, and T0.
type format4Wakes struct {
	Sessions map[string][]string `json:"sessions"`
	Acked    []string            `json:"acked"`
	Leased   []string            `json:"leased"`
	T0       time.Time           `json:"t0"`
}

// A format-4 store has no per-session wake index. Read-only, a read of it says
// ErrNeedsUpgrade naming the store and its format, and the rest reads and verifies as it is.
// Opened read-write it becomes format 5 with the index built from the wake records: each
// session's claim returns exactly its unacknowledged wakes, in ClaimWakes' order (the
// available ones by creation, then those whose lease expires at T0+600s), and Verify agrees.
func TestFormat4StoreUpgradesToFormat5(t *testing.T) {
	ctx := context.Background()
	fx := readFormat4Wakes(t)
	dir := copyDir(t, "format4-store")

	ro, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	err = ro.View(context.Background(), func(r projection.Reader) error {
		return r.ScanIndex(projection.IndexSessionWakes, "alpha", math.MinInt64, 1<<62, func(projection.IndexEntry) bool { return true })
	})
	if !errors.Is(err, pebblelog.ErrNeedsUpgrade) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "format 4") {
		t.Errorf("a per-session wake read of a read-only format-4 store: %v, want ErrNeedsUpgrade naming the store and its format", err)
	}
	n := 0
	if err := ro.View(context.Background(), func(r projection.Reader) error {
		return r.ScanIndex(projection.IndexWakes, "", math.MinInt64, 1<<62, func(projection.IndexEntry) bool { n++; return true })
	}); err != nil || n != 25-len(fx.Acked) {
		t.Errorf("ScanWakes of the read-only format-4 store: %d entries, %v; want %d", n, err, 25-len(fx.Acked))
	}
	if problems, err := ro.Verify(ctx, pebblelog.VerifyOptions{}); err != nil || len(problems) > 0 {
		t.Errorf("Verify of the read-only format-4 store: %v, %q", err, problems)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { q.Close() }()
	if m, _ := os.ReadFile(filepath.Join(dir, pebblelog.MarkerFile)); strings.TrimSpace(string(m)) != fmt.Sprintf("worklog store format %d", pebblelog.FormatVersion) {
		t.Fatalf("marker after the upgrade: %q", m)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify after the upgrade: %v", err)
	}
	acked, leased := map[string]bool{}, map[string]bool{}
	for _, id := range fx.Acked {
		acked[id] = true
	}
	for _, id := range fx.Leased {
		leased[id] = true
	}
	at := func(s int) time.Time { return fx.T0.Add(time.Duration(s) * time.Second) }
	names := slices.Sorted(func(yield func(string) bool) {
		for s := range fx.Sessions {
			if !yield(s) {
				return
			}
		}
	})
	// Before the leases expire: each session's wakes that are neither acknowledged nor leased.
	for _, s := range names {
		var want []string
		for _, id := range fx.Sessions[s] {
			if !acked[id] && !leased[id] {
				want = append(want, id)
			}
		}
		ds, err := q.ClaimSessionWakesAt(ctx, []string{s}, at(100), time.Hour, 100)
		if err != nil {
			t.Fatal(err)
		}
		if got := deliveredIDs(ds); !slices.Equal(got, want) {
			t.Errorf("session %q at T0+100s: %q, want %q", s, got, want)
		}
	}
	// After: the leased ones, in creation order (the same expiry).
	var want []string
	for _, s := range []string{"a", "beta"} {
		for _, id := range fx.Sessions[s] {
			if leased[id] {
				want = append(want, id)
			}
		}
	}
	ds, err := q.ClaimSessionWakesAt(ctx, []string{"beta", "a"}, at(700), time.Hour, 100)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(want, func(a, b string) int { return slices.Index(fx.Leased, a) - slices.Index(fx.Leased, b) })
	if got := deliveredIDs(ds); !slices.Equal(got, want) {
		t.Errorf("sessions beta and a at T0+700s: %q, want %q", got, want)
	}
	for _, d := range ds {
		if d.Attempt != 2 {
			t.Errorf("%s: attempt %d, want 2", d.Wake.ID, d.Attempt)
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify after the claims: %v", err)
	}
}

func deliveredIDs(ds []work.WakeDelivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Wake.ID)
	}
	return out
}
