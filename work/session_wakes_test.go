package work

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// ClaimSessionWakes reads the chosen sessions' own indexes only: with 2,000 wakes of another
// session available first, a claim of 4 among sessions a and b reads at most 4 entries plus
// one look-ahead per session, none of the queue-wide index nor of other sessions, and returns
// ClaimWakes' order among a and b.
func TestClaimSessionWakesCost(t *testing.T) {
	ctx := context.Background()
	e := &countingEngine{memEngine: newMemEngine(), visited: map[string]int{}}
	q := queueOver(e)
	for range 2000 {
		if _, err := q.Session("bulk").WakeAt(ctx, WakeRequest{}, at(0)); err != nil {
			t.Fatal(err)
		}
	}
	var want []string // a and b interleaved in time: a at 1, 4, 7...; b at 2, 5, 8...
	for i := range 5 {
		for j, s := range []string{"a", "b"} {
			w, err := q.Session(s).WakeAt(ctx, WakeRequest{}, at(1+3*i+j))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, w.ID)
		}
	}
	if _, err := q.Session("c").WakeAt(ctx, WakeRequest{}, at(1)); err != nil {
		t.Fatal(err)
	}
	clear(e.visited)
	ds, err := q.ClaimSessionWakesAt(ctx, []string{"b", "a", "b"}, at(100), time.Minute, 4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.Wake.ID)
	}
	if fmt.Sprint(got) != fmt.Sprint(want[:4]) {
		t.Errorf("claimed %v, want %v (ClaimWakes' order among a and b)", got, want[:4])
	}
	if v := e.visited; v["session a"]+v["session b"] > 4+2 || len(v) != 2 {
		t.Errorf("visited %v: want at most 6 entries of sessions a and b, none elsewhere", v)
	}
	clear(e.visited)
	if ds, err = q.ClaimSessionWakesAt(ctx, []string{"a"}, at(100), time.Minute, 10); err != nil || len(ds) != 3 {
		t.Fatalf("ClaimSessionWakesAt(a) = %d, %v; want the 3 left", len(ds), err)
	}
	if v := e.visited; v["session a"] != 3 || len(v) != 1 {
		t.Errorf("one session: visited %v, want a's 3 entries only", v)
	}
	verify(t, q)
}

// plainBackend hides every optional interface of its Backend.
type plainBackend struct{ Backend }

// A custom Backend without SessionWakeClaimer: ErrBackend naming the interface, after
// validation.
func TestClaimSessionWakesNeedsCapability(t *testing.T) {
	q := New(plainBackend{NewInMemory().b})
	_, err := q.ClaimSessionWakesAt(context.Background(), []string{"s"}, at(0), time.Minute, 1)
	if !errors.Is(err, ErrBackend) || !errors.Is(err, errUnsupported) {
		t.Errorf("ClaimSessionWakes over a backend without it: %v, want ErrBackend (unsupported)", err)
	}
	_, err = q.ClaimSessionWakesAt(context.Background(), nil, at(0), time.Minute, 1)
	if !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("validation comes first: %v", err)
	}
}
