package recordcodec

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/msgp"
	"github.com/worklog/worklog/projection"
)

// Lengths at every msgpack size-class boundary.
var codecLens = []int{0, 1, 15, 31, 32, 255, 256, 65535, 65536}

func randStr(r *rand.Rand) string {
	return strings.Repeat("x", codecLens[r.IntN(len(codecLens))])
}

func randBin(r *rand.Rand) []byte {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []byte{}
	}
	return bytes.Repeat([]byte{0xa5}, codecLens[r.IntN(len(codecLens))])
}

func randInt(r *rand.Rand) int64 {
	return []int64{0, 1, -1, 127, -33, 1 << 40, math.MaxInt64, math.MinInt64, r.Int64()}[r.IntN(9)]
}

func randOutcome(r *rand.Rand) events.Outcome {
	return events.Outcome{State: events.TaskState(r.IntN(256)), Summary: randStr(r), Output: randBin(r), Error: randStr(r)}
}

func randTask(r *rand.Rand) *projection.Task {
	return &projection.Task{
		ID: randStr(r), SessionID: randStr(r), Kind: randStr(r), Input: randBin(r),
		HasRunAt: r.IntN(2) == 0, RunAt: randInt(r), IdempotencyKey: randStr(r),
		WakeOnCompletion: r.IntN(2) == 0, CreatedAt: randInt(r), ScheduledAt: randInt(r),
		SubmitSeq: r.Uint64(), State: events.TaskState(r.IntN(256)), CancelRequested: r.IntN(2) == 0,
		CancelRequestedAt: randInt(r), Attempts: r.Uint32(), LeaseToken: randStr(r),
		LeaseExpiresAt: randInt(r), FinishedAt: randInt(r), Outcome: randOutcome(r),
		SettledToken: randStr(r), CompletionWakeID: randStr(r), RejectedAttempt: r.Uint32(),
		UpdatedSeq: r.Uint64(), AttemptsAtRetry: r.Uint32(), Priority: randInt(r),
		Headers: randHeaders(r), UnackedEarlierWakes: r.Uint32(),
	}
}

func randHeaders(r *rand.Rand) map[string]string {
	n := []int{0, 0, 1, 3, 16, 64}[r.IntN(6)]
	if n == 0 {
		return nil
	}
	h := make(map[string]string, n)
	for i := range n {
		h[strings.Repeat("k", i+1)] = randStr(r)
	}
	return h
}

func randWake(r *rand.Rand) *projection.Wake {
	return &projection.Wake{
		ID: randStr(r), SessionID: randStr(r), Reason: events.WakeReason(r.IntN(256)),
		Payload: randBin(r), IdempotencyKey: randStr(r), TaskID: randStr(r), Outcome: randOutcome(r),
		CreatedAt: randInt(r), RecordSeq: r.Uint64(), Attempts: r.Uint32(), LeaseToken: randStr(r),
		LeaseExpiresAt: randInt(r), Acked: r.IntN(2) == 0, AckedToken: randStr(r),
		RejectedAttempt: r.Uint32(), UpdatedSeq: r.Uint64(),
	}
}

// taskRef and wakeRef are the reference for the record layout: projection.Task and Wake as
// msgpack's reflection encoder writes them with the tag they carried when format 1 was
// written (`as_array`; the projection's types carry no storage tags now). The fields are
// inlined, so a field added to Task changes the reference too and this test fails until the
// codec writes it.
type taskRef struct {
	//lint:ignore U1000 msgpack reads the field's tag, not the field
	_msgpack        struct{} `msgpack:",as_array"`
	projection.Task `msgpack:",inline"`
}

type wakeRef struct {
	//lint:ignore U1000 msgpack reads the field's tag, not the field
	_msgpack        struct{} `msgpack:",as_array"`
	projection.Wake `msgpack:",inline"`
}

// refMarshal is msgpack's reflection encoding of a record.
func refMarshal[T projection.Task | projection.Wake](rec *T) ([]byte, error) {
	switch rec := any(rec).(type) {
	case *projection.Task:
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.SetSortMapKeys(true) // headers: the codec writes them in key order
		err := enc.Encode(&taskRef{Task: *rec})
		return buf.Bytes(), err
	case *projection.Wake:
		return msgpack.Marshal(&wakeRef{Wake: *rec})
	}
	panic("unreachable")
}

// TestRecordCodecMatchesMsgpack: the hand-written codec writes the bytes the msgpack
// reflection encoder writes (stores written before it stay byte-identical) and both decoders
// read both encodings to the same record.
func TestRecordCodecMatchesMsgpack(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 400 {
		task := randTask(r)
		want, err := refMarshal(task)
		if err != nil {
			t.Fatal(err)
		}
		got := AppendTask(nil, task)
		if !bytes.Equal(got, want) {
			t.Fatalf("task %d: hand encoding differs from msgpack:\n got %x\nwant %x", i, head(got), head(want))
		}
		back, err := DecodeTask([]byte("k"), want)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, task) {
			t.Fatalf("task %d: decode(msgpack) = %+v, want %+v", i, back, task)
		}
		var lib taskRef
		if err := msgpack.Unmarshal(got, &lib); err != nil {
			t.Fatal(err)
		}
		if d := projection.DiffRecords("task", &lib.Task, task); len(d) != 0 {
			t.Fatalf("task %d: msgpack decodes the hand encoding to %+v, want %+v", i, lib.Task, task)
		}

		wake := randWake(r)
		if want, err = refMarshal(wake); err != nil {
			t.Fatal(err)
		}
		if got = AppendWake(nil, wake); !bytes.Equal(got, want) {
			t.Fatalf("wake %d: hand encoding differs from msgpack:\n got %x\nwant %x", i, head(got), head(want))
		}
		wback, err := DecodeWake([]byte("k"), want)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(wback, wake) {
			t.Fatalf("wake %d: decode(msgpack) = %+v, want %+v", i, wback, wake)
		}
	}
}

func head(b []byte) []byte { return b[:min(len(b), 96)] }

// TestRecordCodecCompactIntegers: integers in any msgpack width (another encoder, or msgpack
// with compact ints) decode to the same values; out-of-range ones are refused.
func TestRecordCodecCompactIntegers(t *testing.T) {
	task := &projection.Task{ID: "t1", Attempts: 3, SubmitSeq: 7, CreatedAt: -5, RunAt: 1 << 40, State: events.StateRunning}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(&taskRef{Task: *task}); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeTask([]byte("k"), buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, task) {
		t.Fatalf("compact ints: got %+v, want %+v", got, task)
	}
	// Attempts (uint32) given as a uint64 above 2^32.
	b := AppendTask(nil, task)
	i := bytes.Index(b, []byte{0xce, 0, 0, 0, 3})
	bad := append(append(append([]byte{}, b[:i]...), 0xcf, 0, 0, 0, 1, 0, 0, 0, 3), b[i+5:]...)
	if _, err := DecodeTask([]byte("k"), bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("attempts 2^32+3: err = %v, want ErrCorrupt", err)
	}
}

// TestRecordCodecShortAndLongArrays: a record of an older layout (fewer fields) decodes with
// the missing fields zero; extra scalar fields of a later layout are skipped.
func TestRecordCodecShortAndLongArrays(t *testing.T) {
	short := msgp.AppendStr(msgp.AppendStr(msgp.AppendArrayLen(nil, 2), "t1"), "s1")
	got, err := DecodeTask([]byte("k"), short)
	if err != nil {
		t.Fatal(err)
	}
	if want := (&projection.Task{ID: "t1", SessionID: "s1"}); !reflect.DeepEqual(got, want) {
		t.Fatalf("short: got %+v, want %+v", got, want)
	}
	full := AppendTask(nil, &projection.Task{ID: "t1"})
	long := append([]byte{0xdc, 0, taskFields + 2}, full[3:]...)
	long = msgp.AppendStr(msgp.AppendUint64(long, 9), "later")
	if got, err = DecodeTask([]byte("k"), long); err != nil || got.ID != "t1" {
		t.Fatalf("long: got %+v, %v", got, err)
	}
}

// TestRecordCodecCorrupt: every truncation and every single-byte change of a record either
// decodes or gives ErrCorrupt naming the key; nothing panics.
func TestRecordCodecCorrupt(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	task := &projection.Task{ID: "t1", SessionID: "s", Kind: "k", Input: []byte(`{"a":1}`), Outcome: events.Outcome{Output: []byte("{}")}, LeaseToken: "tok"}
	wake := &projection.Wake{ID: "w1", SessionID: "s", Payload: []byte("{}"), TaskID: "t1"}
	for _, b := range [][]byte{AppendTask(nil, task), AppendWake(nil, wake)} {
		for n := range len(b) {
			if _, err := DecodeTask([]byte("t/x"), b[:n]); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "t/x") {
				t.Fatalf("task prefix %d: err = %v", n, err)
			}
			if _, err := DecodeWake([]byte("w/x"), b[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("wake prefix %d: err = %v", n, err)
			}
		}
		for range 2000 {
			c := bytes.Clone(b)
			c[r.IntN(len(c))] = byte(r.IntN(256))
			if _, err := DecodeTask([]byte("k"), c); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("bit flip: err = %v", err)
			}
			if _, err := DecodeWake([]byte("k"), c); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("bit flip: err = %v", err)
			}
		}
	}
}

// TestRecordDecodeAllocs: decoding a record allocates the record, its non-empty strings and
// its byte strings, nothing more (the outcome's keys are compared, not copied). The store reads
// a record for every command that touches a task.
func TestRecordDecodeAllocs(t *testing.T) {
	task := &projection.Task{ID: "task-1", SessionID: "session-1", Kind: "thumbnail", Input: []byte("{}"), LeaseToken: "token-1"}
	enc := AppendTask(nil, task)
	const want = 1 + 4 + 1 // the Task, four strings, the input
	if n := testing.AllocsPerRun(100, func() {
		if _, err := DecodeTask(nil, enc); err != nil {
			t.Fatal(err)
		}
	}); n != want {
		t.Fatalf("DecodeTask allocates %v times, want %d", n, want)
	}
}

func BenchmarkRecordCodec(b *testing.B) {
	task := &projection.Task{ID: "01JDQ6Y8M2Q0000000000000000", SessionID: "session-001", Kind: "thumbnail",
		Input: bytes.Repeat([]byte("x"), 200), CreatedAt: 1, ScheduledAt: 1, SubmitSeq: 9, LeaseToken: "0123456789abcdef0123456789abcdef"}
	enc := AppendTask(nil, task)
	b.Run("encode/hand", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			buf = AppendTask(buf[:0], task)
		}
	})
	b.Run("encode/msgpack", func(b *testing.B) {
		for b.Loop() {
			if _, err := refMarshal(task); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/hand", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeTask(nil, enc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/msgpack", func(b *testing.B) {
		for b.Loop() {
			var t taskRef
			if err := msgpack.Unmarshal(enc, &t); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// go test ./internal/recordcodec -run RecordGolden -update writes testdata/records from the fixtures.
// Records are a wire format too (store format 1): the files were generated by the encoder of
// format 1 and must never be rewritten for that format; a new layout is a new store format.
var updateRecords = flag.Bool("update", false, "rewrite testdata/records from the fixtures")

const recordGoldenDir = "testdata/records"

// recordFixture is one golden record file: the record it must encode to and decode from,
// forever. The values are literals on purpose, as in events/golden_test.go.
type recordFixture struct {
	name string // testdata/records/<name>.bin
	task *projection.Task
	wake *projection.Wake
}

const (
	gSession = "sess_0192f3a4-0000-7000-8000-00000000abcd"
	gTask    = "task_0192f3a4-7b1c-7d2e-8f90-a1b2c3d4e5f6"
	gWake    = "wake_0192f3a4-8c2d-7e3f-9a01-b2c3d4e5f607"
	gToken   = "lease_9f86d081884c7d659a2feaa0c55ad015"
	gAt      = int64(1767225600123456789) // 2026-01-01T00:00:00.123456789Z
)

// The fixtures cover every field, nil and empty byte strings, and every length class of str
// (fix, 8, 16, 32) and bin (8, 16, 32) the encoder writes.
var recordFixtures = []recordFixture{
	{name: "task_pending", task: &projection.Task{
		ID: gTask, SessionID: gSession, Kind: "email.send",
		Input:    []byte(`{"to":"ada@example.com","subject":"héllo ✓"}`),
		HasRunAt: true, RunAt: gAt + 90e9, IdempotencyKey: "signup-42", WakeOnCompletion: true,
		CreatedAt: gAt, ScheduledAt: gAt + 90e9, SubmitSeq: 1, State: events.StatePending,
		UpdatedSeq: 1,
	}},
	{name: "task_running", task: &projection.Task{
		ID: gTask, SessionID: gSession, Kind: "k", Input: []byte{},
		CreatedAt: gAt, ScheduledAt: gAt, SubmitSeq: 70000, State: events.StateRunning,
		CancelRequested: true, CancelRequestedAt: gAt + 1, Attempts: 3, LeaseToken: gToken,
		LeaseExpiresAt: gAt + 30e9, RejectedAttempt: 2, UpdatedSeq: 70_001,
	}},
	{name: "task_succeeded", task: &projection.Task{
		ID: gTask, SessionID: gSession, Kind: "thumbnail", Input: []byte(`{}`),
		CreatedAt: -1, ScheduledAt: math.MinInt64, SubmitSeq: math.MaxUint64, State: events.StateSucceeded,
		Attempts: math.MaxUint32, LeaseExpiresAt: math.MaxInt64, FinishedAt: gAt + 2e9,
		Outcome:      events.Outcome{State: events.StateSucceeded, Summary: "done", Output: []byte(`{"ok":true}`)},
		SettledToken: gToken, CompletionWakeID: gWake, RejectedAttempt: math.MaxUint32, UpdatedSeq: 1 << 40,
	}},
	{name: "task_retried", task: &projection.Task{
		ID: gTask, SessionID: gSession, Kind: "report", Input: []byte(`{}`),
		CreatedAt: gAt, ScheduledAt: gAt + 60e9, SubmitSeq: 9, State: events.StatePending,
		Attempts: 4, UpdatedSeq: 77, AttemptsAtRetry: 4, Priority: -1000, UnackedEarlierWakes: 2,
	}},
	{name: "task_wide", task: &projection.Task{
		ID: strings.Repeat("i", 31), SessionID: strings.Repeat("s", 32), Kind: strings.Repeat("k", 255),
		Input: bytes.Repeat([]byte{0xa5}, 65536), IdempotencyKey: strings.Repeat("y", 256),
		State: events.StateFailed, LeaseToken: strings.Repeat("t", 300),
		Outcome: events.Outcome{State: events.StateFailed, Summary: strings.Repeat("m", 65536),
			Output: bytes.Repeat([]byte{1}, 256), Error: strings.Repeat("e", 255)},
		AttemptsAtRetry: math.MaxUint32, Priority: 1000, UnackedEarlierWakes: math.MaxUint32,
	}},
	{name: "task_headers", task: &projection.Task{
		ID: gTask, SessionID: gSession, Kind: "email.send", Input: []byte(`{}`),
		CreatedAt: gAt, ScheduledAt: gAt, SubmitSeq: 3, State: events.StatePending, UpdatedSeq: 3,
		Priority: 7, Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tenant":      "acme", "ключ": "", strings.Repeat("h", 40): strings.Repeat("v", 300),
		},
	}},
	{name: "wake_requested", wake: &projection.Wake{
		ID: gWake, SessionID: gSession, Reason: events.WakeRequested, Payload: []byte(`{"n":1}`),
		IdempotencyKey: "nudge-1", CreatedAt: gAt, RecordSeq: 12, UpdatedSeq: 12,
	}},
	{name: "wake_task_finished", wake: &projection.Wake{
		ID: gWake, SessionID: gSession, Reason: events.WakeTaskFinished, TaskID: gTask,
		Outcome:   events.Outcome{State: events.StateFailed, Error: "boom"},
		CreatedAt: gAt, RecordSeq: 300, Attempts: 2, LeaseToken: gToken, LeaseExpiresAt: gAt + 5e9,
		RejectedAttempt: 1, UpdatedSeq: 301,
	}},
	{name: "wake_acked", wake: &projection.Wake{
		ID: gWake, SessionID: gSession, Reason: events.WakeTaskFinished, Payload: bytes.Repeat([]byte{7}, 300),
		TaskID: gTask, Outcome: events.Outcome{State: events.StateCanceled},
		CreatedAt: math.MinInt64, RecordSeq: math.MaxUint64, Attempts: 1, Acked: true, AckedToken: gToken,
		LeaseExpiresAt: -5, UpdatedSeq: math.MaxUint64,
	}},
}

func (f recordFixture) encode() []byte {
	if f.task != nil {
		return AppendTask(nil, f.task)
	}
	return AppendWake(nil, f.wake)
}

// TestRecordGolden: today's encoder writes the golden records byte for byte, and the decoder
// reads each file back to its fixture.
func TestRecordGolden(t *testing.T) {
	if *updateRecords {
		if err := os.MkdirAll(recordGoldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range recordFixtures {
		t.Run(f.name, func(t *testing.T) {
			path := filepath.Join(recordGoldenDir, f.name+".bin")
			got := f.encode()
			if *updateRecords {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				t.Fatalf("record %s differs from %s at byte %d (len %d, golden %d): the record format must not change",
					f.name, path, i, len(got), len(want))
			}
			var lib []byte
			if f.task != nil {
				lib, err = refMarshal(f.task)
			} else {
				lib, err = refMarshal(f.wake)
			}
			if err != nil || !bytes.Equal(lib, want) {
				t.Fatalf("msgpack's reflection encoder writes %s differently (%v)", path, err)
			}
			key := []byte(f.name)
			if f.task != nil {
				back, err := DecodeTask(key, want)
				if err != nil || !reflect.DeepEqual(back, f.task) {
					t.Fatalf("decode %s = %+v, %v; want %+v", path, back, err, f.task)
				}
				return
			}
			back, err := DecodeWake(key, want)
			if err != nil || !reflect.DeepEqual(back, f.wake) {
				t.Fatalf("decode %s = %+v, %v; want %+v", path, back, err, f.wake)
			}
		})
	}
}

// TestRecordGoldenTask23 reads the task records written before AttemptsAtRetry and Priority
// were appended (23 fields, store formats 1–4; testdata/records/task23, never rewritten): they
// decode to their fixtures with the two fields zero, so stores written before still read.
func TestRecordGoldenTask23(t *testing.T) {
	for _, f := range recordFixtures {
		if f.task == nil {
			continue
		}
		path := filepath.Join(recordGoldenDir, "task23", f.name+".bin")
		b, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			continue // a fixture added with a later layout
		}
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != 0xdc || b[1] != 0 || b[2] != 23 {
			t.Fatalf("%s: not a 23-field array (% x)", path, b[:3])
		}
		want := *f.task
		want.AttemptsAtRetry, want.Priority, want.UnackedEarlierWakes = 0, 0, 0
		back, err := DecodeTask([]byte(f.name), b)
		if err != nil || !reflect.DeepEqual(back, &want) {
			t.Fatalf("decode %s = %+v, %v; want %+v", path, back, err, &want)
		}
	}
}

// TestRecordGoldenTask25 reads the task records written before Headers was appended (25
// fields; testdata/records/task25, never rewritten): they decode to their fixtures with no
// headers.
func TestRecordGoldenTask25(t *testing.T) {
	n := 0
	for _, f := range recordFixtures {
		if f.task == nil {
			continue
		}
		path := filepath.Join(recordGoldenDir, "task25", f.name+".bin")
		b, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			continue // a fixture added with the 26-field layout
		}
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != 0xdc || b[1] != 0 || b[2] != 25 {
			t.Fatalf("%s: not a 25-field array (% x)", path, b[:3])
		}
		want := *f.task
		want.Headers, want.UnackedEarlierWakes = nil, 0
		back, err := DecodeTask([]byte(f.name), b)
		if err != nil || !reflect.DeepEqual(back, &want) {
			t.Fatalf("decode %s = %+v, %v; want %+v", path, back, err, &want)
		}
		n++
	}
	if n != 5 {
		t.Fatalf("%d 25-field goldens read, want 5", n)
	}
}

// TestRecordGoldenTask26 reads the task records written before UnackedEarlierWakes was
// appended (26 fields; testdata/records/task26, never rewritten): they decode to their
// fixtures with the count zero, so stores written before still read (a build of that
// layout could never count one: it refused the retry that does).
func TestRecordGoldenTask26(t *testing.T) {
	n := 0
	for _, f := range recordFixtures {
		if f.task == nil {
			continue
		}
		path := filepath.Join(recordGoldenDir, "task26", f.name+".bin")
		b, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			continue // a fixture added with the 27-field layout
		}
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != 0xdc || b[1] != 0 || b[2] != 26 {
			t.Fatalf("%s: not a 26-field array (% x)", path, b[:3])
		}
		want := *f.task
		want.UnackedEarlierWakes = 0
		back, err := DecodeTask([]byte(f.name), b)
		if err != nil || !reflect.DeepEqual(back, &want) {
			t.Fatalf("decode %s = %+v, %v; want %+v", path, back, err, &want)
		}
		n++
	}
	if n != 6 {
		t.Fatalf("%d 26-field goldens read, want 6", n)
	}
}

// TestRecordHeadersCorrupt: a record's headers that claim more entries than the cap are
// refused before anything is allocated for them; nil and an empty map read as none.
func TestRecordHeadersCorrupt(t *testing.T) {
	base := AppendTask(nil, &projection.Task{ID: "t1"})
	base = base[:len(base)-6] // the nil headers and the count after them (0xce and 4 bytes)
	bad := append(append([]byte{}, base...), 0xdf, 0xff, 0xff, 0xff, 0xff)
	if _, err := DecodeTask([]byte("k"), bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("2^32-1 headers: err = %v, want ErrCorrupt", err)
	}
	if n := testing.AllocsPerRun(10, func() { _, _ = DecodeTask([]byte("k"), bad) }); n > 10 {
		t.Errorf("%v allocations", n)
	}
	for _, h := range []byte{0xc0, 0x80} {
		got, err := DecodeTask([]byte("k"), append(append([]byte{}, base...), h, 0xce, 0, 0, 0, 0))
		if err != nil || got.Headers != nil {
			t.Fatalf("% x: %+v, %v", h, got, err)
		}
	}
}
