package pebblelog

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/worklog/worklog/events"
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
		UpdatedSeq: r.Uint64(),
	}
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

// TestRecordCodecMatchesMsgpack: the hand-written codec writes the bytes the msgpack
// reflection encoder writes (stores written before it stay byte-identical) and both decoders
// read both encodings to the same record.
func TestRecordCodecMatchesMsgpack(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 400 {
		task := randTask(r)
		want, err := msgpack.Marshal(task)
		if err != nil {
			t.Fatal(err)
		}
		got := appendTask(nil, task)
		if !bytes.Equal(got, want) {
			t.Fatalf("task %d: hand encoding differs from msgpack:\n got %x\nwant %x", i, head(got), head(want))
		}
		back, err := decodeTask([]byte("k"), want)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, task) {
			t.Fatalf("task %d: decode(msgpack) = %+v, want %+v", i, back, task)
		}
		var lib projection.Task
		if err := msgpack.Unmarshal(got, &lib); err != nil {
			t.Fatal(err)
		}

		wake := randWake(r)
		if want, err = msgpack.Marshal(wake); err != nil {
			t.Fatal(err)
		}
		if got = appendWake(nil, wake); !bytes.Equal(got, want) {
			t.Fatalf("wake %d: hand encoding differs from msgpack:\n got %x\nwant %x", i, head(got), head(want))
		}
		wback, err := decodeWake([]byte("k"), want)
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
	if err := enc.Encode(task); err != nil {
		t.Fatal(err)
	}
	got, err := decodeTask([]byte("k"), buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, task) {
		t.Fatalf("compact ints: got %+v, want %+v", got, task)
	}
	// Attempts (uint32) given as a uint64 above 2^32.
	b := appendTask(nil, task)
	i := bytes.Index(b, []byte{0xce, 0, 0, 0, 3})
	bad := append(append(append([]byte{}, b[:i]...), 0xcf, 0, 0, 0, 1, 0, 0, 0, 3), b[i+5:]...)
	if _, err := decodeTask([]byte("k"), bad); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("attempts 2^32+3: err = %v, want ErrCorruptRecord", err)
	}
}

// TestRecordCodecShortAndLongArrays: a record of an older layout (fewer fields) decodes with
// the missing fields zero; extra scalar fields of a later layout are skipped.
func TestRecordCodecShortAndLongArrays(t *testing.T) {
	short := appendStr(appendStr(appendArrayLen(nil, 2), "t1"), "s1")
	got, err := decodeTask([]byte("k"), short)
	if err != nil {
		t.Fatal(err)
	}
	if want := (&projection.Task{ID: "t1", SessionID: "s1"}); !reflect.DeepEqual(got, want) {
		t.Fatalf("short: got %+v, want %+v", got, want)
	}
	full := appendTask(nil, &projection.Task{ID: "t1"})
	long := append([]byte{0xdc, 0, taskFields + 2}, full[3:]...)
	long = appendStr(appendUint64(long, 9), "later")
	if got, err = decodeTask([]byte("k"), long); err != nil || got.ID != "t1" {
		t.Fatalf("long: got %+v, %v", got, err)
	}
}

// TestRecordCodecCorrupt: every truncation and every single-byte change of a record either
// decodes or gives ErrCorruptRecord naming the key; nothing panics.
func TestRecordCodecCorrupt(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	task := &projection.Task{ID: "t1", SessionID: "s", Kind: "k", Input: []byte(`{"a":1}`), Outcome: events.Outcome{Output: []byte("{}")}, LeaseToken: "tok"}
	wake := &projection.Wake{ID: "w1", SessionID: "s", Payload: []byte("{}"), TaskID: "t1"}
	for _, b := range [][]byte{appendTask(nil, task), appendWake(nil, wake)} {
		for n := range len(b) {
			if _, err := decodeTask([]byte("t/x"), b[:n]); !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), "t/x") {
				t.Fatalf("task prefix %d: err = %v", n, err)
			}
			if _, err := decodeWake([]byte("w/x"), b[:n]); !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("wake prefix %d: err = %v", n, err)
			}
		}
		for range 2000 {
			c := bytes.Clone(b)
			c[r.IntN(len(c))] = byte(r.IntN(256))
			if _, err := decodeTask([]byte("k"), c); err != nil && !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("bit flip: err = %v", err)
			}
			if _, err := decodeWake([]byte("k"), c); err != nil && !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("bit flip: err = %v", err)
			}
		}
	}
}

func BenchmarkRecordCodec(b *testing.B) {
	task := &projection.Task{ID: "01JDQ6Y8M2Q0000000000000000", SessionID: "session-001", Kind: "thumbnail",
		Input: bytes.Repeat([]byte("x"), 200), CreatedAt: 1, ScheduledAt: 1, SubmitSeq: 9, LeaseToken: "0123456789abcdef0123456789abcdef"}
	enc := appendTask(nil, task)
	b.Run("encode/hand", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			buf = appendTask(buf[:0], task)
		}
	})
	b.Run("encode/msgpack", func(b *testing.B) {
		for b.Loop() {
			if _, err := msgpack.Marshal(task); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/hand", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeTask(nil, enc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/msgpack", func(b *testing.B) {
		for b.Loop() {
			var t projection.Task
			if err := msgpack.Unmarshal(enc, &t); err != nil {
				b.Fatal(err)
			}
		}
	})
}
