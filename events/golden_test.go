package events

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// go test ./events -run Golden -update rewrites the golden files of the current schema
// versions from goldenFixtures. Files of older schema versions are never rewritten: they are
// what stores written by older builds contain, and TestGoldenDecode reads them forever.
var update = flag.Bool("update", false, "rewrite testdata/golden from the fixtures")

const goldenDir = "testdata/golden"

// goldenFixture is one golden file: the event it must decode to, forever.
//
// The expected values are literals on purpose. Never derive them from code that may change,
// and never edit the fixture of a version that has shipped: when a type's body gains fields
// (a new schema version), add a new fixture with the new name and keep the old one. Decoding
// an old file with a newer decoder gives the zero value for the newer fields, which is what
// the old fixture says.
type goldenFixture struct {
	name string // "<type name>.v<schema version>"; the file is testdata/golden/<name>.bin
	ev   Event
}

const (
	goldenSession = "sess_0192f3a4-0000-7000-8000-00000000abcd"
	goldenTask    = "task_0192f3a4-7b1c-7d2e-8f90-a1b2c3d4e5f6"
	goldenWake    = "wake_0192f3a4-8c2d-7e3f-9a01-b2c3d4e5f607"
	goldenToken   = "lease_9f86d081884c7d659a2feaa0c55ad015"
	goldenAt      = int64(1767225600123456789) // 2026-01-01T00:00:00.123456789Z
)

// The sequence numbers differ per type so that the fixtures cover every msgpack integer
// width: fixnum, uint8, uint16, uint32 and uint64.
var goldenFixtures = []goldenFixture{
	{"task_submitted.v1", &TaskSubmitted{
		Header:           Header{Seq: 1, SessionID: goldenSession, At: goldenAt},
		TaskID:           goldenTask,
		Kind:             "email.send",
		Input:            []byte(`{"to":"ada@example.com","subject":"héllo ✓"}`),
		HasRunAt:         true,
		RunAt:            goldenAt + 90e9,
		IdempotencyKey:   "signup-42",
		WakeOnCompletion: true,
	}},
	{"task_submitted.v2", &TaskSubmitted{
		// Priority and headers (schema version 2): a negative priority; headers written
		// sorted by key, one value of more than 31 bytes (str8), one key not ASCII.
		Header:         Header{Seq: 2, SessionID: goldenSession, At: goldenAt},
		TaskID:         goldenTask,
		Kind:           "email.send",
		Input:          []byte(`{"to":"ada@example.com"}`),
		IdempotencyKey: "signup-43",
		Priority:       -17,
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tenant":      "acme",
			"ключ":        "",
		},
	}},
	{"task_submitted.v3", &TaskSubmitted{
		// A schedule's tick (schema version 3): submitted by a claim at goldenAt for the
		// tick a minute before, run at the tick; the schedule's next tick an hour later.
		Header:         Header{Seq: 3, SessionID: goldenSession, At: goldenAt},
		TaskID:         goldenTask,
		Kind:           "report.nightly",
		Input:          []byte(`{"region":"eu"}`),
		HasRunAt:       true,
		RunAt:          1767225540000000000,
		IdempotencyKey: "schedule:nightly:2026-01-01T00:00:00Z",
		Priority:       5,
		Schedule:       "nightly",
		Tick:           1767225540000000000,
		ScheduleNext:   1767229140000000000,
	}},
	{"task_claimed.v1", &TaskClaimed{
		Header:         Header{Seq: 200, SessionID: goldenSession, At: goldenAt + 91e9},
		TaskID:         goldenTask,
		Attempt:        3,
		LeaseToken:     goldenToken,
		LeaseExpiresAt: goldenAt + 121e9,
	}},
	{"task_claimed.v2", &TaskClaimed{
		Header:         Header{Seq: 201, SessionID: goldenSession, At: goldenAt + 91e9},
		TaskID:         goldenTask,
		Attempt:        3,
		LeaseToken:     goldenToken,
		LeaseExpiresAt: goldenAt + 121e9,
		Worker:         "worker-7.example.net:48213",
	}},
	{"task_settled.v1", &TaskSettled{
		Header:     Header{Seq: 65000, SessionID: goldenSession, At: goldenAt + 95e9},
		TaskID:     goldenTask,
		Attempt:    300,
		LeaseToken: goldenToken,
		Outcome: Outcome{
			State:   StateSucceeded,
			Summary: "sent 1 message",
			Output:  []byte(`{"message_id":"<42@example.com>"}`),
			Error:   "retried after a transient 421",
		},
	}},
	{"task_cancel_requested.v1", &TaskCancelRequested{
		Header: Header{Seq: 4_000_000_000, SessionID: goldenSession, At: goldenAt + 92e9},
		TaskID: goldenTask,
	}},
	{"wake_recorded.v1", &WakeRecorded{
		Header:         Header{Seq: 1<<40 + 5, SessionID: goldenSession, At: goldenAt + 96e9},
		WakeID:         goldenWake,
		Reason:         WakeTaskFinished,
		Payload:        []byte(`{"note":"every field is populated"}`),
		IdempotencyKey: "wake-key-7",
		TaskID:         goldenTask,
		Outcome: Outcome{
			State:   StateFailed,
			Summary: "partial",
			Output:  []byte(`[1,2,3]`),
			Error:   "smtp: 550 mailbox unavailable",
		},
	}},
	{"wake_claimed.v1", &WakeClaimed{
		Header:         Header{Seq: 1<<64 - 1, SessionID: goldenSession, At: goldenAt + 97e9},
		WakeID:         goldenWake,
		Attempt:        1<<32 - 1,
		LeaseToken:     goldenToken,
		LeaseExpiresAt: goldenAt + 127e9,
	}},
	{"wake_claimed.v2", &WakeClaimed{
		// A worker identity of more than 31 bytes (str8), not ASCII.
		Header:         Header{Seq: 1<<64 - 2, SessionID: goldenSession, At: goldenAt + 97e9},
		WakeID:         goldenWake,
		Attempt:        1<<32 - 1,
		LeaseToken:     goldenToken,
		LeaseExpiresAt: goldenAt + 127e9,
		Worker:         "agent-runtime/eu-west-1 — pod 3",
	}},
	{"wake_acked.v1", &WakeAcked{
		Header:     Header{Seq: 127, SessionID: goldenSession, At: goldenAt + 98e9},
		WakeID:     goldenWake,
		Attempt:    2,
		LeaseToken: goldenToken,
	}},
	{"task_settle_rejected.v1", &TaskSettleRejected{
		// A time before 1970 and a session id of more than 255 bytes (str16).
		Header:  Header{Seq: 128, SessionID: strings.Repeat("s", 300), At: -1_000_000_007},
		TaskID:  goldenTask,
		Attempt: 70000,
		Reason:  RejectNotClaimed,
	}},
	{"wake_ack_rejected.v1", &WakeAckRejected{
		Header:  Header{Seq: 256, SessionID: goldenSession, At: -5},
		WakeID:  goldenWake,
		Attempt: 1,
		Reason:  RejectTokenMismatch,
	}},
	{"task_extended.v1", &TaskExtended{
		Header:         Header{Seq: 70000, SessionID: goldenSession, At: goldenAt + 111e9},
		TaskID:         goldenTask,
		Attempt:        3,
		LeaseExpiresAt: goldenAt + 151e9,
	}},
	{"task_released.v1", &TaskReleased{
		// A reason of more than 31 bytes (str8), not ASCII.
		Header:  Header{Seq: 300, SessionID: goldenSession, At: goldenAt + 112e9},
		TaskID:  goldenTask,
		Attempt: 3,
		RunAt:   goldenAt + 172e9,
		Reason:  "smtp: 421 try again later — backing off",
	}},
	{"task_retried.v1", &TaskRetried{
		// An operator's retry after three attempts, eligible again a minute later.
		Header:   Header{Seq: 301, SessionID: goldenSession, At: goldenAt + 200e9},
		TaskID:   goldenTask,
		Attempts: 3,
		RunAt:    goldenAt + 260e9,
	}},
	{"kind_policy_set.v1", &KindPolicySet{
		// At most five running, 2.5 claims a second with bursts of ten; no session.
		Header:     Header{Seq: 302, At: goldenAt + 201e9},
		Kind:       "email.send",
		MaxRunning: 5,
		Rate:       2.5,
		Burst:      10,
	}},
	{"kind_policy_set.v2", &KindPolicySet{
		// Claims take from the kind's sessions in turn, at most three of a session running
		// at once, with no other limit; no session.
		Header:               Header{Seq: 303, At: goldenAt + 202e9},
		Kind:                 "agent.turn",
		FairSessions:         true,
		MaxRunningPerSession: 3,
	}},
	{"schedule_set.v1", &ScheduleSet{
		// A cron rule in a time zone, catching up every tick, with a template that has
		// headers and a completion wake; the next tick after From.
		Header:           Header{Seq: 5000000000, SessionID: goldenSession, At: goldenAt + 300e9},
		Name:             "nightly",
		Cron:             "0 9 * * 1-5",
		TimeZone:         "America/New_York",
		Catchup:          1,
		Kind:             "report.nightly",
		Input:            []byte(`{"region":"eu"}`),
		Priority:         -3,
		Headers:          map[string]string{"tenant": "acme"},
		WakeOnCompletion: true,
		From:             goldenAt + 300e9,
		Next:             1767276000000000000,
	}},
	{"schedule_removed.v1", &ScheduleRemoved{
		Header: Header{Seq: 5000000001, SessionID: goldenSession, At: goldenAt + 400e9},
		Name:   "nightly",
	}},
	{"task_submit_rejected.v1", &TaskSubmitRejected{
		Header:         Header{Seq: 301, SessionID: goldenSession, At: goldenAt + 113e9},
		TaskID:         goldenTask,
		IdempotencyKey: "order-7/charge",
		Field:          "input",
		Kind:           "charge_card",
	}},
}

// bodyFieldNames are the names Decode gives the top-level body fields of each type, in wire
// order; the golden .hex files and the decode error tests use them.
var bodyFieldNames = map[Type][]string{
	TypeTaskSubmitted:       {"task_id", "kind", "input", "has_run_at", "run_at", "idempotency_key", "wake_on_completion", "priority", "headers", "schedule", "tick", "schedule_next"},
	TypeTaskClaimed:         {"task_id", "attempt", "lease_token", "lease_expires_at", "worker"},
	TypeTaskSettled:         {"task_id", "attempt", "lease_token", "outcome"},
	TypeTaskCancelRequested: {"task_id"},
	TypeWakeRecorded:        {"wake_id", "reason", "payload", "idempotency_key", "task_id", "outcome"},
	TypeWakeClaimed:         {"wake_id", "attempt", "lease_token", "lease_expires_at", "worker"},
	TypeWakeAcked:           {"wake_id", "attempt", "lease_token"},
	TypeTaskSettleRejected:  {"task_id", "attempt", "reason"},
	TypeWakeAckRejected:     {"wake_id", "attempt", "reason"},
	TypeTaskExtended:        {"task_id", "attempt", "lease_expires_at"},
	TypeTaskReleased:        {"task_id", "attempt", "run_at", "reason"},
	TypeTaskRetried:         {"task_id", "attempts", "run_at"},
	TypeKindPolicySet:       {"kind", "paused", "max_running", "rate", "burst", "fair_sessions", "max_running_per_session"},
	TypeScheduleSet:         {"name", "cron", "time_zone", "catchup", "kind", "input", "priority", "headers", "wake_on_completion", "from", "next"},
	TypeScheduleRemoved:     {"name"},
	TypeTaskSubmitRejected:  {"task_id", "idempotency_key", "field", "kind"},
}

var outcomeFieldNames = []string{"state", "summary", "output", "error"}

func fieldNames(t Type) []string {
	return append([]string{"seq", "session_id", "at"}, bodyFieldNames[t]...)
}

func fixture(t *testing.T, name string) Event {
	t.Helper()
	for _, f := range goldenFixtures {
		if f.name == name {
			return f.ev
		}
	}
	t.Fatalf("no golden fixture %s", name)
	return nil
}

func goldenName(t Type, version uint8) string { return fmt.Sprintf("%s.v%d", t, version) }

// currentFixtures are the fixtures of today's schema versions, one per type.
func currentFixtures(t *testing.T) map[Type]goldenFixture {
	t.Helper()
	out := map[Type]goldenFixture{}
	for _, f := range goldenFixtures {
		if f.name == goldenName(f.ev.Type(), schemaVersion[f.ev.Type()]) {
			out[f.ev.Type()] = f
		}
	}
	return out
}

func readGolden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name+".bin"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// normalize returns a copy of ev in which every empty byte slice is nil: nil and empty
// encode differently but mean the same, and the tests compare meaning.
func normalize(ev Event) Event {
	if ev == nil {
		return nil
	}
	v := reflect.ValueOf(ev).Elem()
	c := reflect.New(v.Type())
	c.Elem().Set(v)
	normalizeValue(c.Elem())
	return c.Interface().(Event)
}

func normalizeValue(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				normalizeValue(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 && v.Len() == 0 {
			v.Set(reflect.Zero(v.Type()))
		}
	}
}

func eventsEqual(a, b Event) bool { return reflect.DeepEqual(normalize(a), normalize(b)) }

func TestGoldenFixturesCoverEveryType(t *testing.T) {
	cur := currentFixtures(t)
	for _, typ := range AllTypes() {
		for v := uint8(1); v <= schemaVersion[typ]; v++ {
			name := goldenName(typ, v)
			found := false
			for _, f := range goldenFixtures {
				if f.name == name {
					found = true
					if f.ev.Type() != typ {
						t.Errorf("fixture %s holds a %s", name, f.ev.Type())
					}
				}
			}
			if !found {
				t.Errorf("no golden fixture %s: add one (never edit an older one)", name)
			}
		}
		if _, ok := cur[typ]; !ok {
			t.Errorf("no fixture for the current schema version of %s", typ)
		}
	}
	seen := map[string]bool{}
	for _, f := range goldenFixtures {
		if seen[f.name] {
			t.Errorf("duplicate fixture %s", f.name)
		}
		seen[f.name] = true
	}
}

// TestGoldenEncode checks that today's encoder writes the golden bytes of the current schema
// versions (with -update, it writes them first).
func TestGoldenEncode(t *testing.T) {
	if *update {
		if err := os.MkdirAll(goldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for typ, f := range currentFixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			b, err := Encode(f.ev)
			if err != nil {
				t.Fatal(err)
			}
			dump, err := hexDump(f.name, b)
			if err != nil {
				t.Fatal(err)
			}
			base := filepath.Join(goldenDir, f.name)
			if *update {
				if err := os.WriteFile(base+".bin", b, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(base+".hex", []byte(dump), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want := readGolden(t, f.name)
			if !bytes.Equal(b, want) {
				i := 0
				for i < len(b) && i < len(want) && b[i] == want[i] {
					i++
				}
				t.Fatalf("encoding of %s differs from %s.bin at byte %d (len %d, golden %d)\n got  %x\n want %x\n"+
					"The wire format must not change: a new encoding needs a new schema version of %s.",
					typ, f.name, i, len(b), len(want), b, want, typ)
			}
			hx, err := os.ReadFile(base + ".hex")
			if err != nil {
				t.Fatal(err)
			}
			if string(hx) != dump {
				t.Errorf("%s.hex is stale; run go test ./events -run Golden -update\n got:\n%s", f.name, dump)
			}
		})
	}
}

// TestGoldenDecode decodes every golden file, of every schema version ever written, and
// compares it with its fixture. It depends only on Decode and the literal fixtures: it must
// pass forever, whatever the encoder does.
func TestGoldenDecode(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no golden files")
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".bin")
		t.Run(name, func(t *testing.T) {
			want := fixture(t, name)
			b := readGolden(t, name)
			for _, seq := range []uint64{0, want.Head().Seq} {
				got, err := Decode(b, seq)
				if err != nil {
					t.Fatalf("Decode(%s, %d): %v", name, seq, err)
				}
				if !eventsEqual(got, want) {
					t.Fatalf("Decode(%s, %d):\n got  %#v\n want %#v", name, seq, got, want)
				}
			}
		})
	}
}

// TestGoldenFilesPresent fails when a known type, at any schema version it can read, has no
// golden file, and when a golden file has no fixture to check it against.
func TestGoldenFilesPresent(t *testing.T) {
	for _, typ := range AllTypes() {
		for v := uint8(1); v <= schemaVersion[typ]; v++ {
			for _, ext := range []string{".bin", ".hex"} {
				p := filepath.Join(goldenDir, goldenName(typ, v)+ext)
				if _, err := os.Stat(p); err != nil {
					t.Errorf("golden file missing for %s schema version %d: %v "+
						"(go test ./events -run Golden -update writes the current ones)", typ, v, err)
				}
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(goldenDir, "*"))
	for _, file := range files {
		base := filepath.Base(file)
		ext := filepath.Ext(base)
		if ext != ".bin" && ext != ".hex" {
			t.Errorf("unexpected file %s", file)
			continue
		}
		name := strings.TrimSuffix(base, ext)
		found := false
		for _, f := range goldenFixtures {
			found = found || f.name == name
		}
		if !found {
			t.Errorf("golden file %s has no fixture", file)
		}
	}
}

// TestWireNumbersStable pins every number that is part of the wire format.
func TestWireNumbersStable(t *testing.T) {
	types := map[string]Type{
		"task_submitted": 1, "task_claimed": 2, "task_settled": 3, "task_cancel_requested": 4,
		"wake_recorded": 5, "wake_claimed": 6, "wake_acked": 7, "task_settle_rejected": 8,
		"wake_ack_rejected": 9, "task_extended": 10, "task_released": 11,
		"task_retried": 12, "kind_policy_set": 13, "schedule_set": 14, "schedule_removed": 15,
		"task_submit_rejected": 16,
	}
	all := AllTypes()
	if len(all) != len(types) {
		t.Fatalf("AllTypes() = %v: %d types, the catalogue pins %d", all, len(all), len(types))
	}
	for i, typ := range all {
		if i > 0 && all[i-1] >= typ {
			t.Errorf("AllTypes() not in number order: %v", all)
		}
		if !typ.Known() {
			t.Errorf("%s listed but not Known", typ)
		}
		if n, ok := types[typ.String()]; !ok || n != typ {
			t.Errorf("type %s has number %d, the wire format says %d", typ, uint8(typ), n)
		}
		if got, ok := TypeByName(typ.String()); !ok || got != typ {
			t.Errorf("TypeByName(%q) = %v, %v", typ.String(), got, ok)
		}
	}
	for _, n := range []int{0, 99, 255} {
		if Type(n).Known() {
			t.Errorf("Type(%d) is Known", n)
		}
		if got := Type(n).String(); got != fmt.Sprintf("type(%d)", n) {
			t.Errorf("Type(%d).String() = %q", n, got)
		}
	}
	if _, ok := TypeByName("nope"); ok {
		t.Error("TypeByName(nope) found a type")
	}
	if StatePending != 0 || StateRunning != 1 || StateSucceeded != 2 || StateFailed != 3 || StateCanceled != 4 {
		t.Error("TaskState numbers changed")
	}
	if WakeRequested != 0 || WakeTaskFinished != 1 {
		t.Error("WakeReason numbers changed")
	}
	if RejectSuperseded != 0 || RejectTokenMismatch != 1 || RejectNotClaimed != 2 {
		t.Error("RejectReason numbers changed")
	}
	if EnvelopeV1 != 1 {
		t.Error("EnvelopeV1 changed")
	}
}

// --- the .hex rendering ---

// msgpackValues splits b, which starts with a msgpack array, into the array header, the
// encoding of each element, and what follows the array.
func msgpackValues(b []byte) (head []byte, elems [][]byte, rest []byte, err error) {
	rd := bytes.NewReader(b)
	dec := msgpack.NewDecoder(rd)
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, nil, nil, err
	}
	pos := len(b) - rd.Len()
	head = b[:pos]
	for i := 0; i < n; i++ {
		if err := dec.Skip(); err != nil {
			return nil, nil, nil, err
		}
		end := len(b) - rd.Len()
		elems = append(elems, b[pos:end])
		pos = end
	}
	return head, elems, b[pos:], nil
}

type hexLine struct {
	b     []byte
	label string
}

// hexDump renders an encoded event with one annotated line (or more, 16 bytes a line) per
// envelope part and body field. The .bin file is authoritative; this is for reviewers.
func hexDump(name string, b []byte) (string, error) {
	if len(b) < headerLen+trailerLen {
		return "", errors.New("too short")
	}
	typ := Type(b[1])
	var lines []hexLine
	add := func(b []byte, label string) { lines = append(lines, hexLine{b, label}) }
	add(b[:headerLen], fmt.Sprintf("envelope: version %d, type %d (%s), schema version %d", b[0], b[1], typ, b[2]))
	head, elems, rest, err := msgpackValues(b[headerLen : len(b)-trailerLen])
	if err != nil {
		return "", err
	}
	names := fieldNames(typ)
	add(head, fmt.Sprintf("body: array of %d fields", len(elems)))
	for i, e := range elems {
		name := fmt.Sprintf("field %d", i)
		if i < len(names) {
			name = names[i]
		}
		if name == "outcome" {
			oh, oe, _, err := msgpackValues(e)
			if err != nil {
				return "", err
			}
			add(oh, fmt.Sprintf("outcome: array of %d fields", len(oe)))
			for j, x := range oe {
				sub := fmt.Sprintf("field %d", j)
				if j < len(outcomeFieldNames) {
					sub = outcomeFieldNames[j]
				}
				add(x, "  outcome."+sub)
			}
			continue
		}
		add(e, name)
	}
	if len(rest) > 0 {
		add(rest, "trailing bytes")
	}
	add(b[len(b)-trailerLen:], "crc32c of all the bytes above, big-endian")

	var sb strings.Builder
	fmt.Fprintf(&sb, "# %s: %d bytes. Generated by `go test ./events -run Golden -update`.\n", name, len(b))
	sb.WriteString("# The .bin file beside this one is authoritative; this is its annotated hex dump.\n")
	for _, l := range lines {
		for i := 0; i == 0 || i < len(l.b); i += 16 {
			chunk := l.b[i:min(i+16, len(l.b))]
			h := hex.EncodeToString(chunk)
			var sp strings.Builder
			for j := 0; j < len(h); j += 2 {
				if j > 0 {
					sp.WriteByte(' ')
				}
				sp.WriteString(h[j : j+2])
			}
			label := ""
			if i == 0 {
				label = l.label
			}
			line := fmt.Sprintf("%-48s  %s", sp.String(), label)
			sb.WriteString(strings.TrimRight(line, " "))
			sb.WriteString("\n")
		}
	}
	return sb.String(), nil
}
