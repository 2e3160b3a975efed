package console_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var logSeqRe = regexp.MustCompile(`<tr><td class="num">(\d+)</td>`)

// logSeqs is the seqs of a log page's rows, in the page's order.
func logSeqs(t *testing.T, body string) []uint64 {
	t.Helper()
	i := strings.Index(body, `<tbody id="log-rows">`)
	if i < 0 {
		t.Fatalf("no log rows\n%s", body)
	}
	body = body[i:]
	body = body[:strings.Index(body, `</tbody>`)]
	var out []uint64
	for _, m := range logSeqRe.FindAllStringSubmatch(body, -1) {
		n, _ := strconv.ParseUint(m[1], 10, 64)
		out = append(out, n)
	}
	return out
}

// TestLogPageIsNewestFirst: the log page lists events newest first, as docs/console.md says,
// on the live page, a page from a seq on, a page up to a seq, a session's events and in the
// past; and the older/newer links step to the neighbouring pages.
func TestLogPageIsNewestFirst(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	last := logSeqs(t, get(t, srv, "/log?limit=1000").body)[0]
	for _, c := range []struct {
		path      string
		newest, n uint64
	}{
		{"/log", last, last},
		{"/log?limit=5", last, 5},
		{"/log?from=3&limit=4", 6, 4},
		{"/log?to=7&limit=3", 7, 3},
		{"/log?at_seq=9&limit=4", 9, 4},
		{"/log?session=checkout-1&limit=2", 0, 2},
	} {
		seqs := logSeqs(t, get(t, srv, c.path).body)
		if uint64(len(seqs)) != c.n || (c.newest != 0 && seqs[0] != c.newest) {
			t.Errorf("%s: seqs %v, want %d newest first from %d", c.path, seqs, c.n, c.newest)
			continue
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] >= seqs[i-1] {
				t.Errorf("%s: seqs %v not newest first", c.path, seqs)
				break
			}
		}
	}
	// The older link of a page of the 5 newest is the 5 before them; its newer link comes back.
	r := get(t, srv, "/log?limit=5")
	m := regexp.MustCompile(`href="(\?[^"]*)" id="older"`).FindStringSubmatch(r.body)
	if m == nil {
		t.Fatalf("no older link\n%s", r.body)
	}
	r = get(t, srv, "/log"+strings.ReplaceAll(m[1], "&amp;", "&"))
	older := logSeqs(t, r.body)
	if len(older) != 5 || older[0] != last-5 || older[4] != last-9 {
		t.Errorf("older page %v, want %d..%d newest first", older, last-5, last-9)
	}
	m = regexp.MustCompile(`href="(\?[^"]*)" id="newer"`).FindStringSubmatch(r.body)
	if m == nil {
		t.Fatalf("no newer link on the older page\n%s", r.body)
	}
	newer := logSeqs(t, get(t, srv, "/log"+strings.ReplaceAll(m[1], "&amp;", "&")).body)
	if len(newer) != 5 || newer[0] != last || newer[4] != last-4 {
		t.Errorf("newer page %v, want %d..%d newest first", newer, last, last-4)
	}
}
