package projection

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
)

func TestDiffFields(t *testing.T) {
	a := fold(t, number([]events.Event{submit("t", 0), claim("t", 10, 1, "secret-a")}))
	b := fold(t, number([]events.Event{submit("t", 0)}))
	want := []string{
		"last_seq: 2 vs 1",
		"task t: field State: running vs pending",
		"task t: field Attempts: 1 vs 0",
		`task t: field LeaseToken: [redacted] vs ""`,
		"task t: field LeaseExpiresAt: 40 vs 0",
		"task t: field UpdatedSeq: 2 vs 1",
		"due index (40, 1, t): missing on the right",
		"due index (0, 1, t): missing on the left",
		`due index of kind "k" (40, 1, t): missing on the right`,
		`due index of kind "k" (0, 1, t): missing on the left`,
		`lease index of kind "k" (40, 1, t): missing on the right`, // with the indexes: it is one
		`count of kind "k" pending: 0 vs 1`,
		`count of kind "k" running: 1 vs 0`,
	}
	if got := a.Diff(b); !slices.Equal(got, want) {
		t.Errorf("Diff:\n got  %q\n want %q", got, want)
	}
	if a.Equal(b) || b.Equal(a) {
		t.Error("Equal of different states")
	}
	if got := b.Diff(a); len(got) != len(want) || got[1] != "task t: field State: pending vs running" {
		t.Errorf("reverse Diff: %q", got)
	}
}

func TestDiffRecordsAndKeys(t *testing.T) {
	base := []events.Event{submitKey("t", 0, "k"), wakeKey("w", 0, "wk")}
	a := fold(t, number(slices.Clone(base)))
	b := fold(t, number(append(slices.Clone(base), submitKey("u", 1, "k2"), wakeKey("v", 1, "vk"))))
	want := []string{
		"last_seq: 2 vs 4",
		"task u: missing on the left",
		"wake v: missing on the left",
		`task key ("s1", "k2"): missing on the left, right has u`,
		`wake key ("s1", "vk"): missing on the left, right has v`,
		"due index (1, 3, u): missing on the left",
		`due index of kind "k" (1, 3, u): missing on the left`,
		"wake index (1, 4, v): missing on the left",
		`wake index of session "s1" (1, 4, v): missing on the left`,
		`count of kind "k" pending: 1 vs 2`,
		`task list of session "s1" (3, u): missing on the left`,
	}
	if got := a.Diff(b); !slices.Equal(got, want) {
		t.Errorf("Diff:\n got  %q\n want %q", got, want)
	}
	want = []string{
		"last_seq: 4 vs 2",
		"task u: missing on the right",
		"wake v: missing on the right",
		`task key ("s1", "k2"): u vs ""`,
		`wake key ("s1", "vk"): v vs ""`,
		"due index (1, 3, u): missing on the right",
		`due index of kind "k" (1, 3, u): missing on the right`,
		"wake index (1, 4, v): missing on the right",
		`wake index of session "s1" (1, 4, v): missing on the right`,
		`count of kind "k" pending: 2 vs 1`,
		`task list of session "s1" (3, u): missing on the right`,
	}
	if got := b.Diff(a); !slices.Equal(got, want) {
		t.Errorf("reverse Diff:\n got  %q\n want %q", got, want)
	}
}

func TestDiffWakeFields(t *testing.T) {
	pre := []events.Event{wake("w", 5), wclaim("w", 10, 1, "tok-1")}
	a := fold(t, number(append(slices.Clone(pre), ack("w", 20, 1, "tok-1"))))
	b := fold(t, number(append(slices.Clone(pre), wclaim("w", 40, 2, "tok-2"))))
	got := a.Diff(b)
	for _, want := range []string{
		"wake w: field Attempts: 1 vs 2",
		"wake w: field LeaseToken: \"\" vs [redacted]",
		"wake w: field Acked: true vs false",
		"wake w: field AckedToken: [redacted] vs \"\"",
		"wake index (70, 1, w): missing on the left",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("Diff lacks %q:\n%s", want, strings.Join(got, "\n"))
		}
	}
	for _, line := range got {
		if strings.Contains(line, "tok-") {
			t.Errorf("Diff shows a lease token: %q", line)
		}
	}
}

// TestDiffRedactsTokens: Diff ends up in work.VerifyError; tokens must not.
func TestDiffRedactsTokens(t *testing.T) {
	pre := []events.Event{submit("t", 0), claim("t", 10, 1, "tok-a"), claim("t", 40, 2, "tok-b")}
	a := fold(t, number(append(slices.Clone(pre), settle("t", 50, 2, "tok-b", events.StateSucceeded))))
	b := fold(t, number(slices.Clone(pre)))
	got := a.Diff(b)
	if len(got) == 0 {
		t.Fatal("no difference")
	}
	for _, line := range got {
		if strings.Contains(line, "tok-") {
			t.Errorf("Diff shows a lease token: %q", line)
		}
	}
	if !slices.Contains(got, "task t: field SettledToken: [redacted] vs \"\"") {
		t.Errorf("Diff: %q", got)
	}
}

func TestEqualIgnoresNilVersusEmpty(t *testing.T) {
	mk := func(input, output []byte) *Mem {
		s := submitW("t", 0)
		s.Input = input
		st := settle("t", 2, 1, "a", events.StateSucceeded)
		st.Outcome.Output = output
		w := doneWake("w", "t", 2, events.StateSucceeded)
		w.Payload, w.Outcome.Output = input, output
		return fold(t, number([]events.Event{s, claim("t", 1, 1, "a"), st, w}))
	}
	a, b := mk(nil, nil), mk([]byte{}, []byte{})
	if d := a.Diff(b); len(d) > 0 {
		t.Errorf("nil and empty differ: %q", d)
	}
	c := mk([]byte("x"), nil)
	if d := a.Diff(c); len(d) != 2 {
		t.Errorf("Diff of different input: %q", d)
	}
}

func TestEqualSameEvents(t *testing.T) {
	evs := number([]events.Event{
		submitW("t1", 0), submitAt("t2", 0, 100), submitKey("t3", 1, "k"), claim("t1", 2, 1, "a"),
		settle("t1", 3, 1, "a", events.StateFailed), doneWake("w1", "t1", 3, events.StateFailed),
		wakeKey("w2", 4, "k"), wclaim("w1", 5, 1, "b"), ack("w1", 6, 1, "b"), cancel("t3", 7),
		rejectSettle("t1", 8, 1, events.RejectNotClaimed), rejectAck("w1", 9, 1, events.RejectNotClaimed),
	})
	a, b := fold(t, evs), fold(t, evs)
	if !a.Equal(b) || !b.Equal(a) || !a.Equal(a) {
		t.Errorf("two folds of the same events differ: %q", a.Diff(b))
	}
	if !NewMem().Equal(NewMem()) {
		t.Error("empty states differ")
	}
	if tasks, wakes := a.Len(); tasks != 3 || wakes != 2 {
		t.Errorf("Len = %d, %d", tasks, wakes)
	}
	var ids []string
	for _, x := range a.Tasks() {
		ids = append(ids, x.ID)
	}
	for _, x := range a.Wakes() {
		ids = append(ids, x.ID)
	}
	if want := []string{"t1", "t2", "t3", "w1", "w2"}; !slices.Equal(ids, want) {
		t.Errorf("Tasks and Wakes in order %v, want %v", ids, want)
	}
}

// TestMemReturnsCopies: the records Mem returns are copies. (PutTask and PutWake take
// ownership of the record they are given: see State.)
func TestMemReturnsCopies(t *testing.T) {
	m := fold(t, number([]events.Event{submit("t", 0), wake("w", 0)}))
	ref := fold(t, number([]events.Event{submit("t", 0), wake("w", 0)}))
	x := task(t, m, "t")
	x.State, x.Kind = events.StateFailed, "changed"
	w := wakeRec(t, m, "w")
	w.Acked = true
	for _, x := range m.Tasks() {
		x.Kind = "changed"
	}
	if d := m.Diff(ref); len(d) > 0 {
		t.Errorf("changing returned records changed the state: %q", d)
	}
	y := &Task{ID: "u", SessionID: sess}
	if err := m.PutTask(y); err != nil {
		t.Fatal(err)
	}
	got := task(t, m, "u")
	got.Kind = "changed"
	if again := task(t, m, "u"); again.Kind != "" {
		t.Errorf("a record read back after PutTask is shared: %+v", again)
	}
	if got, _ := m.Task("none"); got != nil {
		t.Errorf("Task(none) = %+v", got)
	}
	if got, _ := m.Wake("none"); got != nil {
		t.Errorf("Wake(none) = %+v", got)
	}
}

// TestDiffCatchesPart2Upkeep: a state whose per-kind due index, counts or session list went
// wrong (an upkeep bug) differs from a rebuild of its log, whose indexes are derived from the
// records (DeferIndexes), and Diff names the entry: what a verify of the live state relies on.
func TestDiffCatchesPart2Upkeep(t *testing.T) {
	evs := number([]events.Event{submit("t", 0), submit("u", 1), claim("t", 2, 1, "a")})
	rebuilt := NewMem()
	rebuilt.DeferIndexes()
	for _, ev := range evs {
		if err := Apply(rebuilt, ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		damage func(m *Mem)
		want   string
	}{
		{"a missing kind entry", func(m *Mem) { _ = m.DeleteIndex(IndexKindDue, "k", IndexEntry{At: 1, Seq: 2, ID: "u"}) },
			`due index of kind "k" (1, 2, u): missing on the left`},
		{"an entry under another kind", func(m *Mem) {
			_ = m.DeleteIndex(IndexKindDue, "k", IndexEntry{At: 1, Seq: 2, ID: "u"})
			_ = m.PutIndex(IndexKindDue, "other", IndexEntry{At: 1, Seq: 2, ID: "u"})
		}, `due index of kind "other" (1, 2, u): missing on the right`},
		{"a wrong count", func(m *Mem) { _ = m.AddCount("k", events.StateRunning, 1) },
			`count of kind "k" running: 2 vs 1`},
		{"a count left behind", func(m *Mem) { _ = m.AddCount("k", events.StateFailed, -1) },
			`count of kind "k" failed: -1 vs 0`},
		{"a missing session entry", func(m *Mem) { m.sessions[sess].tasks = m.sessions[sess].tasks[:1] },
			`task list of session "s1" (2, u): missing on the left`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := fold(t, evs)
			if d := live.Diff(rebuilt); len(d) > 0 {
				t.Fatalf("before the damage: %q", d)
			}
			tc.damage(live)
			if d := live.Diff(rebuilt); !slices.Contains(d, tc.want) {
				t.Errorf("Diff = %q, want it to contain %q", d, tc.want)
			}
		})
	}
}

// DiffStored, which holds only the rebuilt state's records and reads the stored ones one at a
// time in id order, says what Diff says, in the same order, for stored states that differ in
// records (missing on either side, changed fields, interleaved ids), keys and indexes.
func TestDiffStoredIsDiff(t *testing.T) {
	base := []events.Event{submitKey("t", 0, "k"), wakeKey("w", 0, "wk")}
	states := []*Mem{
		fold(t, number(slices.Clone(base))),
		fold(t, number(append(slices.Clone(base), submitKey("u", 1, "k2"), wakeKey("v", 1, "vk")))),
		fold(t, number(append(slices.Clone(base), submit("a", 1), submit("z", 2), claim("t", 10, 1, "tok")))),
		fold(t, number([]events.Event{submit("m", 0), submit("b", 0), claim("m", 10, 1, "x")})),
		NewMem(),
	}
	for i, stored := range states {
		for j, rebuilt := range states {
			want := stored.Diff(rebuilt)
			noRecords := *stored
			noRecords.tasks, noRecords.wakes = map[string]*Task{}, map[string]*Wake{}
			got, err := rebuilt.DiffStored(&noRecords, func(fn func(*Task) error) error {
				for _, id := range slices.Sorted(maps.Keys(stored.tasks)) {
					if err := fn(stored.tasks[id]); err != nil {
						return err
					}
				}
				return nil
			}, func(fn func(*Wake) error) error {
				for _, id := range slices.Sorted(maps.Keys(stored.wakes)) {
					if err := fn(stored.wakes[id]); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("states %d vs %d: DiffStored (%v)\n got  %q\n want %q", i, j, err, got, want)
			}
		}
	}
}
