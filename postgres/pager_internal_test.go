package postgres

import (
	"errors"
	"slices"
	"testing"
)

// The one page-size rule: an index scan's pages double from scanPage to scanPageMax; a
// prune's single page of limit+1 above scanPageMax keeps its size (the rule prune.go had on
// its own); whole-table reads keep readLogPage.
func TestPagesGrowth(t *testing.T) {
	sizes := func(p pages, k int) []int {
		out := []int{p.first}
		for len(out) < k {
			out = append(out, p.next(out[len(out)-1]))
		}
		return out
	}
	if got, want := sizes(indexPages, 9), []int{16, 32, 64, 128, 256, 512, 1024, 1024, 1024}; !slices.Equal(got, want) {
		t.Errorf("index pages %v, want %v", got, want)
	}
	if got, want := sizes(pages{2001, scanPageMax}, 3), []int{2001, 2001, 2001}; !slices.Equal(got, want) {
		t.Errorf("a prune's page of limit+1 > scanPageMax: %v, want %v", got, want)
	}
	if got, want := sizes(tablePages, 3), []int{readLogPage, readLogPage, readLogPage}; !slices.Equal(got, want) {
		t.Errorf("table pages %v, want %v", got, want)
	}
}

// keyset asks for each page after the last row of the one before, stops at a short page or
// when fn says stop, and returns fn's error.
func TestKeysetLoop(t *testing.T) {
	rows := make([]int, 50)
	for i := range rows {
		rows[i] = i + 1
	}
	var asked []int // the last row each fetch was given (0: none)
	fetch := func(last *int, n int) ([]int, error) {
		from := 0
		if last != nil {
			from = *last
		}
		asked = append(asked, from)
		return rows[from:min(from+n, len(rows))], nil
	}
	var got []int
	if err := keyset(pages{4, 16}, fetch, func(r int) (bool, error) { got = append(got, r); return true, nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, rows) {
		t.Fatalf("rows %v, want 1..50", got)
	}
	if want := []int{0, 4, 12, 28, 44}; !slices.Equal(asked, want) {
		t.Errorf("pages asked after %v, want %v (4, 8, 16, 16, then the short page)", asked, want)
	}

	asked, got = nil, nil
	keyset(pages{4, 16}, fetch, func(r int) (bool, error) { got = append(got, r); return r < 6, nil })
	if !slices.Equal(got, []int{1, 2, 3, 4, 5, 6}) || len(asked) != 2 {
		t.Errorf("fn stopped at 6: got %v after %d pages, want 1..6 after 2", got, len(asked))
	}

	stop := errors.New("stop")
	if err := keyset(pages{4, 16}, fetch, func(r int) (bool, error) { return true, stop }); err != stop {
		t.Errorf("keyset returned %v, want fn's error", err)
	}
}
