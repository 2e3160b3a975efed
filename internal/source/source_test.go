package source_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, "internal/source")) }

// TestSessionOrder pins the order: the length as a uvarint, then the bytes. Below 128 bytes
// that is shorter first; at 128 the varint takes two bytes, and 256 (0x80 0x02) sorts before
// 129 (0x81 0x01), as the Pebble store's per-session index keys do.
func TestSessionOrder(t *testing.T) {
	r := strings.Repeat
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"a", "a", 0},
		{"a", "b", -1},
		{"b", "aa", -1},
		{"zz", "aaa", -1},
		{r("z", 127), r("a", 128), -1},
		{r("a", 128), r("a", 129), -1},
		{r("a", 256), r("a", 129), -1},
		{r("a", 300), r("b", 300), -1},
	} {
		if got := source.SessionOrder(c.a, c.b); got != c.want {
			t.Errorf("SessionOrder(%d bytes %q…, %d bytes %q…) = %d, want %d", len(c.a), c.a[:1], len(c.b), c.b[:1], got, c.want)
		}
		if got := source.SessionOrder(c.b, c.a); got != -c.want {
			t.Errorf("SessionOrder(%d bytes, %d bytes) = %d, want %d", len(c.b), len(c.a), got, -c.want)
		}
	}
}

// sessions of lengths on both sides of the varint's 128-byte step, given out of order.
var sessions = []string{
	strings.Repeat("s", 129), "b", strings.Repeat("s", 256), "aa", strings.Repeat("s", 127), "a", strings.Repeat("s", 128),
}

// buildLog writes one log through a Pebble queue: tasks in every session, claims, a
// completion wake acknowledged, a direct wake, and a prune, so that the log has a pruned
// range. It returns the store's directory.
func buildLog(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	// Session p's tasks are due first: they are claimed, finished and pruned whole.
	for i := range 4 {
		if _, err := q.Session("p").SubmitAt(ctx, work.TaskRequest{Kind: "kp", Wake: work.WakeOnCompletion}, at(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range sessions {
		r := work.TaskRequest{Kind: "k" + s[:1], Input: json.RawMessage(`{"n":` + string(rune('0'+i)) + `}`)}
		if i%2 == 0 {
			r.Wake = work.WakeOnCompletion
		}
		if _, err := q.Session(s).SubmitAt(ctx, r, at(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := q.ClaimDueAt(work.WithWorker(ctx, "w1"), at(100), time.Minute, 4)
	if err != nil || len(ds) != 4 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	for i, d := range ds {
		if _, err := q.FinishAt(ctx, d, work.Success(json.RawMessage(`"done"`)), at(101+i)); err != nil {
			t.Fatal(err)
		}
	}
	ws, err := q.ClaimWakesAt(ctx, at(200), time.Minute, 10)
	if err != nil || len(ws) == 0 {
		t.Fatalf("claim wakes: %d, %v", len(ws), err)
	}
	for _, w := range ws {
		if err := q.AckWakeAt(ctx, w, at(201)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Session("a").WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"x":1}`)}, at(300)); err != nil {
		t.Fatal(err)
	}
	if r, err := q.Prune(ctx, at(250)); err != nil || r.Events == 0 {
		t.Fatalf("prune: %+v, %v", r, err)
	}
	return dir
}

// openBoth opens the log of buildLog read-only as a Pebble store and, imported into a new
// schema, as a PostgreSQL queue.
func openBoth(t *testing.T) (pb, pg source.Source) {
	t.Helper()
	pgtest.Need(t)
	ctx := context.Background()
	dir := buildLog(t)
	ps, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	var evs []events.Event
	if err := ps.ReadRange(ctx, 0, 0, func(ev events.Event) error { evs = append(evs, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	pruned, err := ps.PrunedRanges(ctx)
	if err != nil || len(pruned) == 0 {
		t.Fatalf("pruned ranges: %v, %v", pruned, err)
	}
	dsn := pgtest.Schema(t)
	im, err := postgres.OpenImporter(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.AppendLog(ctx, evs, pruned); err != nil {
		t.Fatal(err)
	}
	im.Close()
	rs, err := postgres.OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return ps, rs
}

// read is what one source answers to every read of the Source interface.
type read struct {
	Last        uint64
	Raw         map[uint64][]byte // RawEvent, ok only
	Missing     []uint64          // RawEvent not ok
	Events      []events.Event    // Event of each present seq
	Range       []uint64          // ReadRange(2, last-1)
	Fold        []uint64          // FoldRange(0, 0)
	RawLog      map[uint64][]byte
	Sessions    []string
	SessionSeqs map[string][]uint64
	SessionLog  map[string][]uint64
	Tasks       []projection.Task
	Wakes       []projection.Wake
	ViewTasks   []projection.Task // View: Task of each task id
	Pruned      projection.SeqRanges
	Problems    []string
}

func readAll(t *testing.T, s source.Source) read {
	t.Helper()
	ctx := context.Background()
	var r read
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var err error
	r.Last, err = s.LastSeq(ctx)
	must("LastSeq", err)
	r.Raw, r.RawLog = map[uint64][]byte{}, map[uint64][]byte{}
	for seq := uint64(0); seq <= r.Last+1; seq++ {
		b, ok, err := s.RawEvent(ctx, seq)
		must("RawEvent", err)
		if !ok {
			r.Missing = append(r.Missing, seq)
			if seq > 0 && seq <= r.Last {
				if _, err := s.Event(ctx, seq); !errors.Is(err, events.ErrCorrupt) {
					t.Errorf("Event(%d) of a pruned seq: %v, want ErrCorrupt", seq, err)
				}
			}
			continue
		}
		r.Raw[seq] = b
		ev, err := s.Event(ctx, seq)
		must("Event", err)
		r.Events = append(r.Events, ev)
	}
	must("ReadRange", s.ReadRange(ctx, 2, r.Last-1, func(ev events.Event) error { r.Range = append(r.Range, ev.Head().Seq); return nil }))
	must("FoldRange", s.FoldRange(ctx, 0, 0, func(ev events.Event) error { r.Fold = append(r.Fold, ev.Head().Seq); return nil }))
	must("RawLog", s.RawLog(ctx, 0, 0, func(seq uint64, b []byte) error { r.RawLog[seq] = slices.Clone(b); return nil }))
	must("Sessions", s.Sessions(ctx, func(x string) error { r.Sessions = append(r.Sessions, x); return nil }))
	r.SessionSeqs, r.SessionLog = map[string][]uint64{}, map[string][]uint64{}
	for _, x := range r.Sessions {
		must("SessionSeqs", s.SessionSeqs(ctx, x, 2, func(seq uint64) error { r.SessionSeqs[x] = append(r.SessionSeqs[x], seq); return nil }))
		must("SessionLog", s.SessionLog(ctx, x, 0, func(ev events.Event) error {
			if ev.Head().SessionID != x {
				t.Errorf("SessionLog(%.8q…) gave an event of session %.8q…", x, ev.Head().SessionID)
			}
			r.SessionLog[x] = append(r.SessionLog[x], ev.Head().Seq)
			return nil
		}))
	}
	must("ScanTasks", s.ScanTasks(ctx, func(x *projection.Task) error { r.Tasks = append(r.Tasks, *x); return nil }))
	must("ScanWakes", s.ScanWakes(ctx, func(x *projection.Wake) error { r.Wakes = append(r.Wakes, *x); return nil }))
	must("View", s.View(ctx, func(v projection.Reader) error {
		for _, x := range r.Tasks {
			got, err := v.Task(x.ID)
			if err != nil || got == nil {
				return errors.Join(errors.New("task "+x.ID+" not in View"), err)
			}
			r.ViewTasks = append(r.ViewTasks, *got)
		}
		return nil
	}))
	r.Pruned, err = s.PrunedRanges(ctx)
	must("PrunedRanges", err)
	var calls [][2]uint64
	r.Problems, err = s.Verify(ctx, source.VerifyOptions{Progress: func(seq, last uint64) { calls = append(calls, [2]uint64{seq, last}) }})
	must("Verify", err)
	for _, c := range calls {
		if c[1] != r.Last || c[0] > c[1] {
			t.Errorf("Verify's progress reported (%d, %d) on a log ending at %d", c[0], c[1], r.Last)
		}
	}
	if n, err := s.DiskUsage(ctx); err != nil || n == 0 {
		t.Errorf("DiskUsage: %d, %v", n, err)
	}
	return r
}

// TestBothSourcesReadTheSameLog: a Pebble store and a PostgreSQL queue holding the same log
// answer every read of Source the same, sessions in SessionOrder included.
func TestBothSourcesReadTheSameLog(t *testing.T) {
	pb, pg := openBoth(t)
	a, b := readAll(t, pb), readAll(t, pg)
	if len(a.Missing) < 3 || a.Missing[0] != 0 || a.Missing[len(a.Missing)-1] != a.Last+1 {
		t.Errorf("RawEvent not found at %v: want seq 0, the pruned ones and %d", a.Missing, a.Last+1)
	}
	if len(a.Problems) != 0 {
		t.Errorf("Pebble's Verify: %v", a.Problems)
	}
	want := slices.Clone(sessions)
	slices.SortFunc(want, source.SessionOrder)
	if !slices.Equal(a.Sessions, want) {
		t.Errorf("Pebble lists sessions of lengths %v, want %v", lens(a.Sessions), lens(want))
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := range va.NumField() {
		if f := va.Type().Field(i).Name; !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			t.Errorf("%s differs:\n pebble:   %v\n postgres: %v", f, va.Field(i).Interface(), vb.Field(i).Interface())
		}
	}
}

// TestVerifyProgressOnPostgres: PostgreSQL's Verify reports its progress, as Pebble's does,
// ending at the log head.
func TestVerifyProgressOnPostgres(t *testing.T) {
	_, pg := openBoth(t)
	ctx := context.Background()
	last, err := pg.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]uint64
	if _, err := pg.Verify(ctx, source.VerifyOptions{Progress: func(seq, l uint64) { got = append(got, [2]uint64{seq, l}) }}); err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || got[len(got)-1] != [2]uint64{last, last} {
		t.Errorf("progress %v, want it to end at (%d, %d)", got, last, last)
	}
}

// TestDoneContextRefused: every method of either source refuses a context that is already
// done, with that context's error.
func TestDoneContextRefused(t *testing.T) {
	pb, pg := openBoth(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, s := range map[string]source.Source{"pebble": pb, "postgres": pg} {
		nop := func(events.Event) error { return nil }
		calls := map[string]error{}
		_, calls["LastSeq"] = s.LastSeq(ctx)
		calls["View"] = s.View(ctx, func(projection.Reader) error { return nil })
		_, calls["Event"] = s.Event(ctx, 1)
		_, _, calls["RawEvent"] = s.RawEvent(ctx, 1)
		calls["ReadRange"] = s.ReadRange(ctx, 0, 0, nop)
		calls["FoldRange"] = s.FoldRange(ctx, 0, 0, nop)
		calls["RawLog"] = s.RawLog(ctx, 0, 0, func(uint64, []byte) error { return nil })
		calls["Sessions"] = s.Sessions(ctx, func(string) error { return nil })
		calls["SessionSeqs"] = s.SessionSeqs(ctx, "a", 0, func(uint64) error { return nil })
		calls["SessionLog"] = s.SessionLog(ctx, "a", 0, nop)
		calls["ScanTasks"] = s.ScanTasks(ctx, func(*projection.Task) error { return nil })
		calls["ScanWakes"] = s.ScanWakes(ctx, func(*projection.Wake) error { return nil })
		_, calls["PrunedRanges"] = s.PrunedRanges(ctx)
		_, calls["DiskUsage"] = s.DiskUsage(ctx)
		_, calls["Verify"] = s.Verify(ctx, source.VerifyOptions{})
		for m, err := range calls {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %s with a canceled context: %v, want context.Canceled", name, m, err)
			}
		}
	}
}

func lens(ss []string) []int {
	var n []int
	for _, s := range ss {
		n = append(n, len(s))
	}
	return n
}
