package events

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// gen draws random events that Decode accepts: every field varies over values that exercise
// each msgpack width, and the few rules check enforces hold.
type gen struct{ r *rand.Rand }

func newGen(seed uint64) *gen { return &gen{rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))} }

// Lengths around every msgpack string and bin length boundary.
var lengths = []int{0, 1, 5, 31, 32, 33, 255, 256, 257, 1000, 65535, 65536}

func (g *gen) n() int {
	if g.r.IntN(8) == 0 {
		return lengths[g.r.IntN(len(lengths))]
	}
	return g.r.IntN(40)
}

const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_-.:{}\"é✓\x00\xff"

func (g *gen) str(nonEmpty bool) string {
	n := g.n()
	if nonEmpty && n == 0 {
		n = 1
	}
	var sb strings.Builder
	for sb.Len() < min(n, 64) {
		sb.WriteByte(alphabet[g.r.IntN(len(alphabet))]) // not always valid UTF-8: strings are bytes
	}
	if n > 64 { // long strings repeat a random 64-byte chunk
		return strings.Repeat(sb.String(), n/64+1)[:n]
	}
	return sb.String()[:n]
}

func (g *gen) bin() []byte {
	switch g.r.IntN(6) {
	case 0:
		return nil
	case 1:
		return []byte{}
	}
	b := make([]byte, g.n())
	for i := range min(len(b), 64) {
		b[i] = byte(g.r.Uint32())
	}
	for i := 64; i < len(b); i++ {
		b[i] = b[i-64]
	}
	return b
}

var edgeInts = []int64{0, 1, -1, 127, 128, -32, -33, 255, 256, -128, -129, 65535, 65536, -32768, -32769,
	math.MaxUint32, math.MaxUint32 + 1, math.MinInt32, math.MinInt32 - 1, math.MaxInt64, math.MinInt64}

func (g *gen) i64() int64 {
	switch g.r.IntN(3) {
	case 0:
		return edgeInts[g.r.IntN(len(edgeInts))]
	case 1:
		return 1_700_000_000_000_000_000 + g.r.Int64N(1e17)
	}
	return int64(g.r.Uint64())
}

func (g *gen) u64() uint64 {
	if g.r.IntN(3) == 0 {
		if x := edgeInts[g.r.IntN(len(edgeInts))]; x > 0 {
			return uint64(x)
		}
		return math.MaxUint64
	}
	return 1 + g.r.Uint64N(1<<uint(1+g.r.IntN(63)))
}

// worker draws a worker identity within MaxWorker bytes (Decode refuses a longer one).
func (g *gen) worker() string {
	w := g.str(false)
	return w[:min(len(w), MaxWorker)]
}

func (g *gen) attempt() uint32 {
	switch g.r.IntN(4) {
	case 0:
		return math.MaxUint32
	case 1:
		return uint32(1 + g.r.IntN(3))
	}
	return 1 + g.r.Uint32N(math.MaxUint32)
}

// after draws a time at or after lo, at every msgpack width where it can.
func (g *gen) after(lo int64) int64 {
	if t := g.i64(); t >= lo {
		return t
	}
	switch g.r.IntN(3) {
	case 0:
		return lo // the edge
	case 1:
		return math.MaxInt64
	}
	// Uniform in [lo, MaxInt64): the span, up to 2^64-1, counted in uint64; the sum wraps
	// back into range.
	if span := uint64(math.MaxInt64) - uint64(lo); span > 0 {
		return lo + int64(g.r.Uint64N(span))
	}
	return lo
}

func (g *gen) outcome() Outcome {
	return Outcome{
		State:   StateSucceeded + TaskState(g.r.IntN(3)),
		Summary: g.str(false),
		Output:  g.bin(),
		Error:   g.str(false),
	}
}

func (g *gen) header(seq uint64) Header {
	return Header{Seq: seq, SessionID: g.str(true), At: g.i64()}
}

// event draws an event of type t at seq (a random positive seq when 0).
func (g *gen) event(t Type, seq uint64) Event {
	if seq == 0 {
		seq = g.u64()
	}
	h := g.header(seq)
	switch t {
	case TypeTaskSubmitted:
		e := &TaskSubmitted{Header: h, TaskID: g.str(true), Kind: g.str(false), Input: g.bin(),
			HasRunAt: g.r.IntN(2) == 0, RunAt: g.i64(), IdempotencyKey: g.str(false), WakeOnCompletion: g.r.IntN(2) == 0}
		if g.r.IntN(2) == 0 { // version 2: a priority, headers
			e.Priority = int64(g.r.IntN(MaxPriority-MinPriority+1) + MinPriority)
			if n := g.r.IntN(4); n > 0 {
				e.Headers = map[string]string{}
				for range n {
					if k := g.str(true); len(k) <= MaxHeaderKey {
						e.Headers[k] = g.str(false)
					}
				}
				if CheckHeaders(e.Headers) != "" || len(e.Headers) == 0 {
					e.Headers = nil
				}
			}
			if g.r.IntN(2) == 0 { // version 3: a schedule's tick
				e.Schedule = "s" + g.str(false)[:0] + strconv.Itoa(g.r.IntN(100))
				e.HasRunAt, e.Tick = true, min(g.i64(), math.MaxInt64-1)
				e.RunAt = e.Tick
				if g.r.IntN(2) == 0 {
					e.ScheduleNext = g.after(e.Tick + 1)
				}
			}
		}
		return e
	case TypeTaskClaimed:
		return &TaskClaimed{Header: h, TaskID: g.str(true), Attempt: g.attempt(), LeaseToken: g.str(false), LeaseExpiresAt: g.i64(), Worker: g.worker()}
	case TypeTaskSettled:
		return &TaskSettled{Header: h, TaskID: g.str(true), Attempt: uint32(g.u64()), LeaseToken: g.str(false), Outcome: g.outcome()}
	case TypeTaskCancelRequested:
		return &TaskCancelRequested{Header: h, TaskID: g.str(true)}
	case TypeWakeRecorded:
		e := &WakeRecorded{Header: h, WakeID: g.str(true), Reason: WakeReason(g.r.IntN(2)), Payload: g.bin(),
			IdempotencyKey: g.str(false), TaskID: g.str(false)}
		if g.r.IntN(2) == 0 {
			e.Outcome = g.outcome()
		}
		if e.Reason == WakeTaskFinished {
			e.TaskID = g.str(true)
			e.Outcome = g.outcome()
		}
		return e
	case TypeWakeClaimed:
		return &WakeClaimed{Header: h, WakeID: g.str(true), Attempt: g.attempt(), LeaseToken: g.str(false), LeaseExpiresAt: g.i64(), Worker: g.worker()}
	case TypeWakeAcked:
		return &WakeAcked{Header: h, WakeID: g.str(true), Attempt: uint32(g.u64()), LeaseToken: g.str(false)}
	case TypeTaskSettleRejected:
		return &TaskSettleRejected{Header: h, TaskID: g.str(true), Attempt: uint32(g.u64()), Reason: RejectReason(g.r.IntN(3))}
	case TypeWakeAckRejected:
		return &WakeAckRejected{Header: h, WakeID: g.str(true), Attempt: uint32(g.u64()), Reason: RejectReason(g.r.IntN(3))}
	case TypeTaskExtended:
		// check: the new expiry is after the heartbeat.
		h.At = min(h.At, math.MaxInt64-1)
		return &TaskExtended{Header: h, TaskID: g.str(true), Attempt: g.attempt(), LeaseExpiresAt: g.after(h.At + 1)}
	case TypeTaskReleased:
		// check: eligible again no earlier than the release; a reason of at most 64 KiB
		// (g.str's longest is 65536, the limit).
		return &TaskReleased{Header: h, TaskID: g.str(true), Attempt: g.attempt(), RunAt: g.after(h.At), Reason: g.str(false)}
	case TypeTaskRetried:
		// check: eligible again no earlier than the retry.
		return &TaskRetried{Header: h, TaskID: g.str(true), Attempts: uint32(g.u64()), RunAt: g.after(h.At)}
	case TypeKindPolicySet:
		// check: no session; a valid policy (a zero one removes the kind's).
		h.SessionID = ""
		e := &KindPolicySet{Header: h, Kind: g.str(true), Paused: g.r.IntN(2) == 0}
		if g.r.IntN(2) == 0 {
			e.MaxRunning = int64(g.u64() >> 1)
		}
		if g.r.IntN(2) == 0 {
			e.Rate = g.r.Float64() * 1e6
			e.Burst = 1 + int64(g.u64()>>2)
		}
		if g.r.IntN(2) == 0 {
			e.FairSessions = g.r.IntN(2) == 0
			e.MaxRunningPerSession = int64(g.u64() >> 1)
		}
		return e
	case TypeScheduleSet:
		e := &ScheduleSet{Header: h, Name: "s" + strconv.Itoa(g.r.IntN(1000)), Cron: "@every " + strconv.Itoa(1+g.r.IntN(100)) + "s",
			TimeZone: g.str(false), Catchup: uint8(g.r.IntN(2)), Kind: g.str(true), Input: g.bin(),
			Priority: int64(g.r.IntN(MaxPriority-MinPriority+1) + MinPriority), WakeOnCompletion: g.r.IntN(2) == 0,
			From: min(g.i64(), math.MaxInt64-1)}
		if g.r.IntN(2) == 0 {
			e.Headers = map[string]string{"k": g.str(false)[:0] + "v"}
		}
		if g.r.IntN(2) == 0 {
			e.Next = g.after(e.From + 1)
		}
		return e
	case TypeScheduleRemoved:
		return &ScheduleRemoved{Header: h, Name: "s" + strconv.Itoa(g.r.IntN(1000))}
	case TypeTaskSubmitRejected:
		// check: the task, the key and the differing field are named.
		return &TaskSubmitRejected{Header: h, TaskID: g.str(true), IdempotencyKey: g.str(true), Field: g.str(true), Kind: g.str(false)}
	}
	panic("unknown type " + t.String())
}

func TestRoundTrip(t *testing.T) {
	g := newGen(1)
	types := AllTypes()
	var buf []byte
	for i := 0; i < 10000; i++ {
		ev := g.event(types[i%len(types)], 0)
		b, err := Encode(ev)
		if err != nil {
			t.Fatalf("Encode(%#v): %v", ev, err)
		}
		for _, seq := range []uint64{0, ev.Head().Seq} {
			got, err := Decode(b, seq)
			if err != nil {
				t.Fatalf("Decode(Encode(%#v), %d): %v", ev, seq, err)
			}
			if !eventsEqual(got, ev) {
				t.Fatalf("round trip:\n got  %#v\n want %#v", got, ev)
			}
		}
		// Append into a buffer with something before it writes the same bytes.
		prefix := len(buf) % 7
		buf = append(buf[:0], "1234567"[:prefix]...)
		if buf, err = Append(buf, ev); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf[prefix:], b) || string(buf[:prefix]) != "1234567"[:prefix] {
			t.Fatalf("Append after %d bytes differs from Encode", prefix)
		}
	}
}

// TestRoundTripNilAndEmpty: the encoding keeps nil and empty byte slices apart, though the
// tests (and the projection) treat them alike.
func TestRoundTripNilAndEmpty(t *testing.T) {
	for _, in := range [][]byte{nil, {}} {
		ev := &TaskSubmitted{Header: Header{Seq: 1, SessionID: "s"}, TaskID: "t", Kind: "k", Input: in}
		got, err := Decode(mustEncode(t, ev), 1)
		if err != nil {
			t.Fatal(err)
		}
		if g := got.(*TaskSubmitted).Input; (g == nil) != (in == nil) || len(g) != 0 {
			t.Errorf("input %#v decoded as %#v", in, g)
		}
	}
}
