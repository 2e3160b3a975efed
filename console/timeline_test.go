package console

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// TestTimelineReadableAt1000Tasks: a session of 1,000 tasks, each claimed and settled within
// a second, with the log's last event a month later in another session (the page's cut). The
// timeline draws 50 tasks a page, 20 pages; each page's scale is its own tasks' time, so the
// bars fill the plot's width (not squeezed against its left edge by the month after) and
// each is wide enough to see; the axis has a few round, increasing labels; the last page is
// tasks 951 to 1000.
func TestTimelineReadableAt1000Tasks(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	s := q.Session("big")
	var ids []string
	for i := range 1000 {
		at := t0.Add(time.Duration(i) * time.Second)
		tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k"}, at)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tk.ID)
		ds, err := q.ClaimKindsAt(ctx, []string{"k"}, at.Add(200*time.Millisecond), time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatal(ds, err)
		}
		if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), at.Add(700*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	late := t0.Add(30 * 24 * time.Hour)
	if _, err := q.Session("other").SubmitAt(ctx, work.TaskRequest{Kind: "k"}, late); err != nil {
		t.Fatal(err)
	}
	var evs []events.Event
	if err := q.ReadLog(ctx, 0, func(ev events.Event) error {
		if ev.Head().SessionID == "big" {
			evs = append(evs, ev)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, page := range []int{1, 7, 20} {
		tl := buildTimeline(evs, late.UnixNano(), page)
		if tl.Pages != 20 || tl.Page != page || len(tl.Rows) != 50 || tl.Tasks != 1000 || tl.First != (page-1)*50+1 || tl.Last != page*50 {
			t.Fatalf("page %d: pages %d, rows %d, tasks %d–%d of %d", page, tl.Pages, len(tl.Rows), tl.First, tl.Last, tl.Tasks)
		}
		minX, maxX := tlWidth, 0
		for i, r := range tl.Rows {
			if want := ids[(page-1)*50+i]; r.Task != want || !strings.HasSuffix(r.Label, want[len(want)-6:]) {
				t.Fatalf("page %d row %d: %s, want %s", page, i, r.Task, want)
			}
			if r.Y != tlTop+i*tlRowH {
				t.Fatalf("row %d at y %d", i, r.Y)
			}
			if len(r.Bars) != 1 || r.Bars[0].Class != "b-succeeded" {
				t.Fatalf("row %d bars: %+v", i, r.Bars)
			}
			b := r.Bars[0]
			if b.X < tlLeft || b.X+b.W > tlRight {
				t.Fatalf("row %d bar outside the plot: %+v", i, b)
			}
			if b.W < 5 {
				t.Fatalf("row %d: a bar %d px wide is not readable", i, b.W)
			}
			minX, maxX = min(minX, b.X), max(maxX, b.X+b.W)
		}
		// The first submission is at the left edge, the last settlement at the right.
		if minX > tlLeft+20 || maxX < tlRight-2 {
			t.Fatalf("page %d: bars from x %d to %d of %d to %d: squeezed", page, minX, maxX, tlLeft, tlRight)
		}
		if len(tl.Ticks) < 3 || len(tl.Ticks) > tlMaxTicks {
			t.Fatalf("page %d: %d axis ticks", page, len(tl.Ticks))
		}
		for i, tk := range tl.Ticks {
			if tk.X < tlLeft || tk.X > tlRight || (i > 0 && (tk.X <= tl.Ticks[i-1].X || tk.Label <= tl.Ticks[i-1].Label)) {
				t.Fatalf("page %d: ticks %+v", page, tl.Ticks)
			}
			if len(tk.Label) != len("15:04:05") {
				t.Fatalf("page %d: a tick label %q for a 50 s span", page, tk.Label)
			}
		}
		if tl.Height != tlTop+10+50*tlRowH {
			t.Fatalf("height %d", tl.Height)
		}
	}
	// The page links the pages, keeping the past.
	h, err := New(q, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://localhost/sessions/big?tl=2&at_seq=2500", nil))
	body := w.Body.String()
	for _, want := range []string{"Tasks 51–100 of 834 (page 2 of 17", `href="?at_seq=2500&amp;tl=1#timeline" id="timeline-prev"`, `href="?at_seq=2500&amp;tl=3#timeline" id="timeline-next"`, `class="lbl tick"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the session page lacks %s", want)
		}
	}
	// Out of range: the nearest page.
	if tl := buildTimeline(evs, late.UnixNano(), 99); tl.Page != 20 {
		t.Errorf("page 99: %d", tl.Page)
	}
	if tl := buildTimeline(evs, late.UnixNano(), 0); tl.Page != 1 || tl.PrevPage != 0 || tl.NextPage != 2 {
		t.Errorf("page 0: %+v", tl.Page)
	}
}
