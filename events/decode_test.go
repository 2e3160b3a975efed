package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// --- building encodings by hand ---

// withCRC returns a copy of b with its trailer recomputed over the bytes before it.
func withCRC(b []byte) []byte {
	c := slices.Clone(b)
	n := len(c) - trailerLen
	binary.BigEndian.PutUint32(c[n:], crc32.Checksum(c[:n], castagnoli))
	return c
}

// envelope frames a body: envelope version 1, the type and schema version, a valid CRC.
func envelope(typ Type, version uint8, body []byte) []byte {
	b := append([]byte{EnvelopeV1, byte(typ), version}, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// mp encodes values with msgpack, one after the other, without an array header. Values of
// type msgpack.RawMessage are copied as they are.
func mp(t testing.TB, vals ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	for _, v := range vals {
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// arrayHead is the msgpack header of an array of n elements, in the smallest form.
func arrayHead(n int) []byte {
	var buf bytes.Buffer
	_ = msgpack.NewEncoder(&buf).EncodeArrayLen(n)
	return buf.Bytes()
}

// split returns the type, the body fields and the nested outcome fields (if any) of b.
func split(t testing.TB, b []byte) (Type, [][]byte) {
	t.Helper()
	_, elems, rest, err := msgpackValues(b[headerLen : len(b)-trailerLen])
	if err != nil || len(rest) != 0 {
		t.Fatalf("split: %v, %d trailing bytes", err, len(rest))
	}
	return Type(b[1]), elems
}

func join(head []byte, elems [][]byte, extra ...[]byte) []byte {
	out := slices.Clone(head)
	for _, e := range elems {
		out = append(out, e...)
	}
	for _, e := range extra {
		out = append(out, e...)
	}
	return out
}

func mustEncode(t testing.TB, ev Event) []byte {
	t.Helper()
	b, err := Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeErr decodes b, which must fail, and checks the error's kind, seq and field.
// field "" accepts any field.
func decodeErr(t *testing.T, b []byte, seq uint64, kind error, field string) *DecodeError {
	t.Helper()
	ev, err := Decode(b, seq)
	if err == nil {
		t.Fatalf("Decode succeeded: %#v", ev)
	}
	if ev != nil {
		t.Errorf("Decode returned an event with its error: %#v", ev)
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %T is not a *DecodeError: %v", err, err)
	}
	if !errors.Is(err, kind) {
		t.Errorf("error %q is not %q", err, kind)
	}
	for _, k := range []error{ErrCorrupt, ErrUnknownType, ErrUnknownVersion} {
		if k != kind && errors.Is(err, k) {
			t.Errorf("error %q is also %q", err, k)
		}
	}
	if de.Seq != seq {
		t.Errorf("error names seq %d, want %d: %v", de.Seq, seq, err)
	}
	if field != "" && de.Field != field {
		t.Errorf("error names field %q, want %q: %v", de.Field, field, err)
	}
	if de.Field == "" {
		t.Errorf("error names no field: %v", err)
	}
	if !strings.HasPrefix(err.Error(), kind.Error()) {
		t.Errorf("message %q does not start with %q", err, kind)
	}
	return de
}

// knownFields are the Field values Decode may name for an event of type typ.
func knownFields(typ Type) []string {
	out := append(fieldNames(typ), "envelope", "checksum", "type", "schema_version", "body", "subject")
	for _, f := range outcomeFieldNames {
		out = append(out, "outcome."+f)
	}
	return out
}

// --- envelope ---

func TestDecodeTruncated(t *testing.T) {
	for typ, f := range currentFixtures(t) {
		b := readGolden(t, f.name)
		seq := f.ev.Head().Seq
		for n := 0; n < len(b); n++ {
			de := decodeErr(t, b[:n], seq, ErrCorrupt, "")
			if n < headerLen+trailerLen+1 && de.Field != "envelope" || n >= headerLen+trailerLen+1 && de.Field != "checksum" {
				t.Errorf("%s cut to %d bytes: field %q", typ, n, de.Field)
			}
		}
		// The body cut short under a valid checksum: the body parser must notice.
		_, elems := split(t, b)
		body := b[headerLen : len(b)-trailerLen]
		for n := 0; n < len(body); n++ {
			de := decodeErr(t, envelope(typ, 1, body[:n]), seq, ErrCorrupt, "")
			if !slices.Contains(knownFields(typ), de.Field) {
				t.Errorf("%s body cut to %d bytes: field %q", typ, n, de.Field)
			}
		}
		if len(elems) != len(fieldNames(typ)) {
			t.Errorf("%s has %d fields, want %d", typ, len(elems), len(fieldNames(typ)))
		}
	}
}

// TestDecodeBitFlips flips every bit of every golden encoding. The CRC catches each one,
// except in the envelope version byte, which is read before the checksum because a future
// envelope may frame its checksum differently.
func TestDecodeBitFlips(t *testing.T) {
	for typ, f := range currentFixtures(t) {
		b := readGolden(t, f.name)
		seq := f.ev.Head().Seq
		var fixedOK, fixedErr int
		for i := range b {
			for bit := 0; bit < 8; bit++ {
				c := slices.Clone(b)
				c[i] ^= 1 << bit
				if i == 0 {
					decodeErr(t, c, seq, ErrUnknownVersion, "envelope")
				} else {
					decodeErr(t, c, seq, ErrCorrupt, "checksum")
				}
				// Under a recomputed checksum the flip reaches the body parser, which must
				// not panic; many flips still give a valid event (a changed letter).
				if i >= len(b)-trailerLen {
					continue
				}
				ev, err := Decode(withCRC(c), 0)
				var de *DecodeError
				switch {
				case err == nil:
					fixedOK++
					if _, err := Encode(ev); err != nil {
						t.Errorf("%s byte %d bit %d: decoded %#v does not encode: %v", typ, i, bit, ev, err)
					}
				case errors.As(err, &de):
					fixedErr++
				default:
					t.Errorf("%s byte %d bit %d: %T %v", typ, i, bit, err, err)
				}
			}
		}
		if fixedErr == 0 {
			t.Errorf("%s: no bit flip under a valid checksum was rejected (%d decoded)", typ, fixedOK)
		}
	}
}

func TestDecodeEnvelopeVersion(t *testing.T) {
	f := fixture(t, "task_claimed.v1")
	b := readGolden(t, "task_claimed.v1")
	for _, v := range []byte{0, 2, 255} {
		c := slices.Clone(b)
		c[0] = v
		for _, c := range [][]byte{c, withCRC(c)} {
			de := decodeErr(t, c, f.Head().Seq, ErrUnknownVersion, "envelope")
			if de.Type != 0 {
				t.Errorf("envelope error names type %s", de.Type)
			}
		}
	}
}

func TestDecodeUnknownType(t *testing.T) {
	b := readGolden(t, "task_claimed.v1")
	for _, typ := range []byte{0, 99, 128, 255} {
		c := slices.Clone(b)
		c[1] = typ
		decodeErr(t, c, 200, ErrCorrupt, "checksum") // without recomputing the checksum
		de := decodeErr(t, withCRC(c), 200, ErrUnknownType, "type")
		if de.Type != 0 {
			t.Errorf("unknown type error names type %s", de.Type)
		}
		if want := "type byte " + itoa(int(typ)); !strings.Contains(de.Error(), want) {
			t.Errorf("message %q does not say %q", de, want)
		}
	}
}

func TestDecodeSchemaVersion(t *testing.T) {
	for typ, f := range currentFixtures(t) {
		b := readGolden(t, f.name)
		for _, v := range []byte{0, schemaVersion[typ] + 1, 255} {
			c := slices.Clone(b)
			c[2] = v
			decodeErr(t, c, f.ev.Head().Seq, ErrCorrupt, "checksum")
			de := decodeErr(t, withCRC(c), f.ev.Head().Seq, ErrUnknownVersion, "schema_version")
			if de.Type != typ {
				t.Errorf("schema version error names type %s, want %s", de.Type, typ)
			}
		}
	}
}

// --- body ---

func TestDecodeTooFewFields(t *testing.T) {
	for typ, f := range currentFixtures(t) {
		_, elems := split(t, readGolden(t, f.name))
		names := fieldNames(typ)
		seq := f.ev.Head().Seq
		for k := 0; k < len(elems); k++ {
			b := envelope(typ, schemaVersion[typ], join(arrayHead(k), elems[:k]))
			de := decodeErr(t, b, seq, ErrCorrupt, names[k])
			if de.Type != typ {
				t.Errorf("%s with %d fields: error names type %s", typ, k, de.Type)
			}
			if !strings.Contains(de.Detail, "too few fields") {
				t.Errorf("%s with %d fields: detail %q", typ, k, de.Detail)
			}
		}
		// A nil body reads as an array with no fields.
		decodeErr(t, envelope(typ, schemaVersion[typ], []byte{0xc0}), seq, ErrCorrupt, "seq")
		// A body that is not an array.
		decodeErr(t, envelope(typ, schemaVersion[typ], mp(t, map[string]int{"seq": 1})), seq, ErrCorrupt, "body")
		decodeErr(t, envelope(typ, schemaVersion[typ], mp(t, "x")), seq, ErrCorrupt, "body")

		// An outcome with fewer than four fields.
		i := slices.Index(names, "outcome")
		if i < 0 {
			continue
		}
		_, oe, _, err := msgpackValues(elems[i])
		if err != nil || len(oe) != 4 {
			t.Fatalf("outcome of %s: %v, %d fields", typ, err, len(oe))
		}
		for k := 0; k < 4; k++ {
			out := slices.Clone(elems)
			out[i] = join(arrayHead(k), oe[:k])
			decodeErr(t, envelope(typ, schemaVersion[typ], join(arrayHead(len(out)), out)), seq, ErrCorrupt, "outcome")
		}
		out := slices.Clone(elems)
		out[i] = []byte{0xc0}
		decodeErr(t, envelope(typ, schemaVersion[typ], join(arrayHead(len(out)), out)), seq, ErrCorrupt, "outcome")
	}
}

func TestDecodeTrailingBytes(t *testing.T) {
	for typ, f := range currentFixtures(t) {
		b := readGolden(t, f.name)
		body := b[headerLen : len(b)-trailerLen]
		for _, extra := range [][]byte{{0xc0}, {0x00}, body} {
			de := decodeErr(t, envelope(typ, schemaVersion[typ], join(body, nil, extra)), f.ev.Head().Seq, ErrCorrupt, "body")
			if !strings.Contains(de.Detail, "trailing") {
				t.Errorf("%s: detail %q", typ, de.Detail)
			}
		}
	}
}

// TestDecodeExtraFields: a newer minor revision may append fields to the body array and to
// the outcome array; this build skips them.
func TestDecodeExtraFields(t *testing.T) {
	extras := [][]byte{
		mp(t, uint64(7), "a field from the future", []byte{1, 2, 3}, nil, true, -1.5, int64(-1<<40)),
		mp(t, map[string]any{"nested": []any{1, "two", map[string]any{"three": nil}}}),
		mp(t, []any{[]any{[]any{}}, map[string]any{}}),
		{0xd4, 0x01, 0x02},             // fixext1
		{0xc7, 0x03, 0x05, 1, 2, 3},    // ext8
		{0xca, 0x3f, 0x80, 0x00, 0x00}, // float32 1.0
	}
	for typ, f := range currentFixtures(t) {
		_, elems := split(t, readGolden(t, f.name))
		seq := f.ev.Head().Seq
		check := func(what string, body []byte) {
			t.Helper()
			got, err := Decode(envelope(typ, schemaVersion[typ], body), seq)
			if err != nil {
				t.Fatalf("%s %s: %v", typ, what, err)
			}
			if !eventsEqual(got, f.ev) {
				t.Fatalf("%s %s:\n got  %#v\n want %#v", typ, what, got, f.ev)
			}
		}
		for i, x := range extras {
			check("one extra "+itoa(i), join(arrayHead(len(elems)+countValues(t, x)), elems, x))
		}
		all := join(nil, extras)
		n := len(elems) + countValues(t, all)
		check("all extras", join(arrayHead(n), elems, all))
		// The same fields under the array16 and array32 headers a different encoder may use.
		check("array16 header", join([]byte{0xdc, byte(n >> 8), byte(n)}, elems, all))
		check("array32 header", join([]byte{0xdd, 0, 0, byte(n >> 8), byte(n)}, elems, all))
		check("array16 header, no extras", join([]byte{0xdc, 0, byte(len(elems))}, elems))

		if i := slices.Index(fieldNames(typ), "outcome"); i >= 0 {
			_, oe, _, _ := msgpackValues(elems[i])
			out := slices.Clone(elems)
			out[i] = join(arrayHead(4+2), oe, mp(t, "outcome field 5", map[string]int{"six": 6}))
			check("extra outcome fields", join(arrayHead(len(out)), out))
			out[i] = join([]byte{0xdc, 0, 4}, oe)
			check("outcome under an array16 header", join(arrayHead(len(out)), out))
		}
	}
}

func countValues(t testing.TB, b []byte) int {
	t.Helper()
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	n := 0
	for dec.Skip() == nil {
		n++
	}
	return n
}

// TestDecodeNonCanonical: integers, strings, byte strings and arrays written in a wider form
// than this encoder chooses, and nil byte strings, all decode. Another msgpack writer (a
// repair tool, a port) may well choose these forms.
func TestDecodeNonCanonical(t *testing.T) {
	want := &TaskClaimed{
		Header:         Header{Seq: 5, SessionID: "s", At: 7},
		TaskID:         "t",
		Attempt:        1,
		LeaseToken:     "tok",
		LeaseExpiresAt: -3,
	}
	body := join([]byte{0x97},
		[][]byte{
			{0xcf, 0, 0, 0, 0, 0, 0, 0, 5}, // seq: uint64
			{0xdb, 0, 0, 0, 1, 's'},        // session_id: str32
			{0xd3, 0, 0, 0, 0, 0, 0, 0, 7}, // at: int64
			{0xd9, 1, 't'},                 // task_id: str8
			{0xd0, 1},                      // attempt: int8
			{0xda, 0, 3, 't', 'o', 'k'},    // lease_token: str16
			{0xd2, 0xff, 0xff, 0xff, 0xfd}, // lease_expires_at: int32
		})
	got, err := Decode(envelope(TypeTaskClaimed, 1, body), 5)
	if err != nil {
		t.Fatal(err)
	}
	if !eventsEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}

	sub := &TaskSubmitted{Header: Header{Seq: 9, SessionID: "s", At: 1}, TaskID: "t", Kind: "k",
		Input: []byte("{}"), RunAt: 300}
	body = join([]byte{0x9a}, [][]byte{
		{0x09}, {0xa1, 's'}, {0x01}, {0xa1, 't'}, {0xa1, 'k'},
		{0xc6, 0, 0, 0, 2, '{', '}'}, // input: bin32
		{0xc2},                       // has_run_at: false
		{0xcd, 0x01, 0x2c},           // run_at: uint16 300
		{0xc4, 0},                    // idempotency_key: bin8 of length 0... read as a string
		{0xc2},
	})
	got, err = Decode(envelope(TypeTaskSubmitted, 1, body), 9)
	if err != nil {
		t.Fatal(err)
	}
	if !eventsEqual(got, sub) {
		t.Fatalf("got %#v, want %#v", got, sub)
	}

	// A nil input (what the encoder writes for a nil slice) and an empty bin both decode.
	for _, in := range [][]byte{{0xc0}, {0xc4, 0}} {
		body = join([]byte{0x9a}, [][]byte{{0x09}, {0xa1, 's'}, {0x01}, {0xa1, 't'}, {0xa1, 'k'},
			in, {0xc2}, {0x00}, {0xa0}, {0xc3}})
		got, err := Decode(envelope(TypeTaskSubmitted, 1, body), 9)
		if err != nil {
			t.Fatal(err)
		}
		want := &TaskSubmitted{Header: Header{Seq: 9, SessionID: "s", At: 1}, TaskID: "t", Kind: "k",
			WakeOnCompletion: true}
		if !eventsEqual(got, want) {
			t.Fatalf("input %x: got %#v, want %#v", in, got, want)
		}
	}
}

// --- meaning ---

func TestDecodeSeqMismatch(t *testing.T) {
	for typ, f := range currentFixtures(t) {
		b := readGolden(t, f.name)
		seq := f.ev.Head().Seq
		for _, other := range []uint64{seq + 1, seq - 1, seq ^ 1<<63} {
			if other == 0 {
				continue // 0 means the position is unknown: nothing to compare
			}
			de := decodeErr(t, b, other, ErrCorrupt, "seq")
			if de.Type != typ {
				t.Errorf("%s: error names type %s", typ, de.Type)
			}
			if !strings.Contains(de.Error(), "at seq "+utoa(other)) {
				t.Errorf("%s: message %q does not name seq %d", typ, de, other)
			}
		}
	}
}

func TestDecodeChecks(t *testing.T) {
	h := Header{Seq: 3, SessionID: "sess", At: 10}
	fin := Outcome{State: StateSucceeded}
	tests := []struct {
		name  string
		ev    Event
		seq   uint64 // passed to Decode
		field string
	}{
		{"seq 0", &TaskCancelRequested{Header: Header{SessionID: "s"}, TaskID: "t"}, 0, "seq"},
		{"seq 0 stored at 1", &TaskCancelRequested{Header: Header{SessionID: "s"}, TaskID: "t"}, 1, "seq"},
		{"empty session", &TaskCancelRequested{Header: Header{Seq: 3}, TaskID: "t"}, 3, "session_id"},
		{"empty session of a wake", &WakeAcked{Header: Header{Seq: 3}, WakeID: "w", Attempt: 1, LeaseToken: "x"}, 0, "session_id"},
		{"no task id", &TaskSubmitted{Header: h, Kind: "k"}, 3, "subject"},
		{"no wake id", &WakeRecorded{Header: h}, 3, "subject"},
		{"no task id in a rejection", &TaskSettleRejected{Header: h, Attempt: 1}, 3, "subject"},
		{"task claim attempt 0", &TaskClaimed{Header: h, TaskID: "t", LeaseToken: "x", LeaseExpiresAt: 20}, 3, "attempt"},
		{"wake claim attempt 0", &WakeClaimed{Header: h, WakeID: "w", LeaseToken: "x", LeaseExpiresAt: 20}, 3, "attempt"},
		{"task claim worker over 256 bytes", &TaskClaimed{Header: h, TaskID: "t", Attempt: 1, LeaseToken: "x", LeaseExpiresAt: 20,
			Worker: strings.Repeat("w", MaxWorker+1)}, 3, "worker"},
		{"wake claim worker over 256 bytes", &WakeClaimed{Header: h, WakeID: "w", Attempt: 1, LeaseToken: "x", LeaseExpiresAt: 20,
			Worker: strings.Repeat("w", MaxWorker+1)}, 3, "worker"},
		{"settled pending", &TaskSettled{Header: h, TaskID: "t", Attempt: 1, LeaseToken: "x"}, 3, "outcome.state"},
		{"settled running", &TaskSettled{Header: h, TaskID: "t", Attempt: 1, LeaseToken: "x",
			Outcome: Outcome{State: StateRunning}}, 3, "outcome.state"},
		{"finished wake without task", &WakeRecorded{Header: h, WakeID: "w", Reason: WakeTaskFinished, Outcome: fin}, 3, "outcome"},
		{"finished wake of a pending task", &WakeRecorded{Header: h, WakeID: "w", Reason: WakeTaskFinished, TaskID: "t"}, 3, "outcome"},
		{"out of range reason", &WakeRecorded{Header: h, WakeID: "w", Reason: 2}, 3, "reason"},
		{"out of range outcome state", &TaskSettled{Header: h, TaskID: "t", Attempt: 1, LeaseToken: "x",
			Outcome: Outcome{State: 5}}, 3, "outcome.state"},
		{"out of range reject reason", &TaskSettleRejected{Header: h, TaskID: "t", Attempt: 1, Reason: 3}, 3, "reason"},
		{"out of range wake reject reason", &WakeAckRejected{Header: h, WakeID: "w", Attempt: 1, Reason: 255}, 3, "reason"},
		{"no task id in an extension", &TaskExtended{Header: h, Attempt: 1, LeaseExpiresAt: 20}, 3, "subject"},
		{"extension attempt 0", &TaskExtended{Header: h, TaskID: "t", LeaseExpiresAt: 20}, 3, "attempt"},
		{"extension expiring at its time", &TaskExtended{Header: h, TaskID: "t", Attempt: 1, LeaseExpiresAt: 10}, 3, "lease_expires_at"},
		{"extension expiring before its time", &TaskExtended{Header: h, TaskID: "t", Attempt: 1, LeaseExpiresAt: -20}, 3, "lease_expires_at"},
		{"no task id in a release", &TaskReleased{Header: h, Attempt: 1, RunAt: 10}, 3, "subject"},
		{"release attempt 0", &TaskReleased{Header: h, TaskID: "t", RunAt: 10}, 3, "attempt"},
		{"release eligible before its time", &TaskReleased{Header: h, TaskID: "t", Attempt: 1, RunAt: 9}, 3, "run_at"},
		{"release reason over 64 KiB", &TaskReleased{Header: h, TaskID: "t", Attempt: 1, RunAt: 10,
			Reason: strings.Repeat("r", MaxReleaseReason+1)}, 3, "reason"},
		{"priority above 1000", &TaskSubmitted{Header: h, TaskID: "t", Kind: "k", Priority: MaxPriority + 1}, 3, "priority"},
		{"priority below -1000", &TaskSubmitted{Header: h, TaskID: "t", Kind: "k", Priority: MinPriority - 1}, 3, "priority"},
		{"65 headers", &TaskSubmitted{Header: h, TaskID: "t", Kind: "k", Headers: manyHeaders(MaxHeaders + 1)}, 3, "headers"},
		{"empty header key", &TaskSubmitted{Header: h, TaskID: "t", Kind: "k", Headers: map[string]string{"": "v"}}, 3, "headers"},
		{"header key over 256 bytes", &TaskSubmitted{Header: h, TaskID: "t", Kind: "k",
			Headers: map[string]string{strings.Repeat("k", MaxHeaderKey+1): ""}}, 3, "headers"},
		{"headers over 16 KiB", &TaskSubmitted{Header: h, TaskID: "t", Kind: "k",
			Headers: map[string]string{"a": strings.Repeat("v", MaxHeaderBytes)}}, 3, "headers"},
		{"no task id in a retry", &TaskRetried{Header: h, Attempts: 1, RunAt: 10}, 3, "subject"},
		{"retry eligible before its time", &TaskRetried{Header: h, TaskID: "t", Attempts: 1, RunAt: 9}, 3, "run_at"},
		{"submit rejection without a key", &TaskSubmitRejected{Header: h, TaskID: "t", Field: "input"}, 3, "idempotency_key"},
		{"submit rejection without a field", &TaskSubmitRejected{Header: h, TaskID: "t", IdempotencyKey: "k"}, 3, "field"},
		{"kind policy with a session", &KindPolicySet{Header: h, Kind: "k", Paused: true}, 3, "session_id"},
		{"kind policy without a kind", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Paused: true}, 3, "kind"},
		{"kind policy max running negative", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Kind: "k", MaxRunning: -1}, 3, "max_running"},
		{"kind policy rate NaN", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Kind: "k", Rate: math.NaN(), Burst: 1}, 3, "rate"},
		{"kind policy rate +Inf", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Kind: "k", Rate: math.Inf(1), Burst: 1}, 3, "rate"},
		{"kind policy rate negative", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Kind: "k", Rate: -1, Burst: 1}, 3, "rate"},
		{"kind policy rate without burst", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Kind: "k", Rate: 1}, 3, "burst"},
		{"kind policy burst without rate", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Kind: "k", Burst: 1}, 3, "burst"},
		{"kind policy max running per session negative", &KindPolicySet{Header: Header{Seq: 3, At: 10}, Kind: "k", MaxRunningPerSession: -1}, 3, "max_running_per_session"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			de := decodeErr(t, mustEncode(t, tc.ev), tc.seq, ErrCorrupt, tc.field)
			if de.Type != tc.ev.Type() {
				t.Errorf("error names type %s, want %s", de.Type, tc.ev.Type())
			}
		})
	}

	// Values the encoder cannot write: an attempt wider than 32 bits, fields of the wrong
	// msgpack type.
	hdr := [][]byte{{0x03}, {0xa1, 's'}, {0x0a}}
	wrong := []struct {
		name  string
		typ   Type
		elems [][]byte
		field string
	}{
		{"attempt 2^32", TypeTaskClaimed, [][]byte{{0xa1, 't'}, {0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, {0xa1, 'x'}, {0x20}}, "attempt"},
		{"attempt -1", TypeWakeAcked, [][]byte{{0xa1, 'w'}, {0xff}, {0xa1, 'x'}}, "attempt"},
		{"task id an integer", TypeTaskCancelRequested, [][]byte{{0x01}}, "task_id"},
		{"task id an array", TypeTaskCancelRequested, [][]byte{{0x91, 0xa1, 't'}}, "task_id"},
		{"attempt a string", TypeTaskClaimed, [][]byte{{0xa1, 't'}, {0xa1, '1'}, {0xa1, 'x'}, {0x20}}, "attempt"},
		{"lease expiry a float", TypeTaskClaimed, [][]byte{{0xa1, 't'}, {0x01}, {0xa1, 'x'}, {0xca, 0x3f, 0x80, 0, 0}}, "lease_expires_at"},
		{"bool an integer", TypeTaskSubmitted, [][]byte{{0xa1, 't'}, {0xa1, 'k'}, {0xc0}, {0x01}, {0x00}, {0xa0}, {0xc2}}, "has_run_at"},
		{"input an integer", TypeTaskSubmitted, [][]byte{{0xa1, 't'}, {0xa1, 'k'}, {0x07}, {0xc2}, {0x00}, {0xa0}, {0xc2}}, "input"},
		{"outcome a string", TypeTaskSettled, [][]byte{{0xa1, 't'}, {0x01}, {0xa1, 'x'}, {0xa1, 'o'}}, "outcome"},
		{"outcome state a string", TypeTaskSettled, [][]byte{{0xa1, 't'}, {0x01}, {0xa1, 'x'}, {0x94, 0xa1, '2', 0xa0, 0xc0, 0xa0}}, "outcome.state"},
		{"outcome output a bool", TypeWakeRecorded, [][]byte{{0xa1, 'w'}, {0x01}, {0xc0}, {0xa0}, {0xa1, 't'}, {0x94, 0x02, 0xa0, 0xc3, 0xa0}}, "outcome.output"},
		{"reserved code 0xc1", TypeTaskCancelRequested, [][]byte{{0xc1}}, "task_id"},
		{"seq a string", TypeTaskCancelRequested, [][]byte{{0xa1, 't'}}, "seq"},
	}
	for _, tc := range wrong {
		t.Run(tc.name, func(t *testing.T) {
			elems := append(slices.Clone(hdr), tc.elems...)
			if tc.name == "seq a string" {
				elems = [][]byte{{0xa1, '3'}, {0xa1, 's'}, {0x0a}, {0xa1, 't'}}
			}
			decodeErr(t, envelope(tc.typ, 1, join(arrayHead(len(elems)), elems)), 3, ErrCorrupt, tc.field)
		})
	}
}

// TestDecodeChecksAcceptEdges: the values at the edge of each rule of check are valid events
// (an expiry one nanosecond after the heartbeat, a release eligible at once, a reason of
// exactly 64 KiB), so check refuses only what no command appends.
func TestDecodeChecksAcceptEdges(t *testing.T) {
	h := Header{Seq: 3, SessionID: "sess", At: 10}
	for _, ev := range []Event{
		&TaskExtended{Header: h, TaskID: "t", Attempt: 1, LeaseExpiresAt: 11},
		&TaskReleased{Header: h, TaskID: "t", Attempt: 1, RunAt: 10},
		&TaskReleased{Header: h, TaskID: "t", Attempt: 1, RunAt: 10, Reason: strings.Repeat("r", MaxReleaseReason)},
		&TaskRetried{Header: h, TaskID: "t", RunAt: 10}, // a retry of a task canceled before any claim
	} {
		got, err := Decode(mustEncode(t, ev), 3)
		if err != nil {
			t.Fatalf("Decode(%T): %v", ev, err)
		}
		if !eventsEqual(got, ev) {
			t.Fatalf("Decode:\n got  %#v\n want %#v", got, ev)
		}
	}
}

// TestDecodeHugeLengths: a length prefix far beyond the bytes that follow must fail at once,
// without allocating what it claims.
func TestDecodeHugeLengths(t *testing.T) {
	hdr := [][]byte{{0x03}, {0xa1, 's'}, {0x0a}}
	cases := []struct {
		name  string
		typ   Type
		elems [][]byte
		field string
	}{
		{"input bin32", TypeTaskSubmitted, [][]byte{{0xa1, 't'}, {0xa1, 'k'}, {0xc6, 0xff, 0xff, 0xff, 0xf0, 1, 2}}, "input"},
		{"output bin32", TypeTaskSettled, [][]byte{{0xa1, 't'}, {0x01}, {0xa1, 'x'}, {0x94, 0x02, 0xa0, 0xc6, 0x7f, 0xff, 0xff, 0xff}}, "outcome.output"},
		{"task id str32", TypeTaskCancelRequested, [][]byte{{0xdb, 0xff, 0xff, 0xff, 0xf0, 't'}}, "task_id"},
		{"extra field bin32", TypeTaskCancelRequested, [][]byte{{0xa1, 't'}, {0xc6, 0xff, 0xff, 0xff, 0xf0}}, "body"},
		{"extra field array32", TypeTaskCancelRequested, [][]byte{{0xa1, 't'}, {0xdd, 0xff, 0xff, 0xff, 0xf0}}, "body"},
		{"extra field map32", TypeTaskCancelRequested, [][]byte{{0xa1, 't'}, {0xdf, 0xff, 0xff, 0xff, 0xf0}}, "body"},
		{"extra field ext32", TypeTaskCancelRequested, [][]byte{{0xa1, 't'}, {0xc9, 0xff, 0xff, 0xff, 0xf0, 1}}, "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			elems := append(slices.Clone(hdr), tc.elems...)
			b := envelope(tc.typ, 1, join(arrayHead(len(elems)), elems))
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			decodeErr(t, b, 3, ErrCorrupt, tc.field)
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
				t.Errorf("decoding a %d-byte event allocated %d bytes", len(b), n)
			}
		})
	}
	// A body array that claims 2^32-1 fields.
	b := envelope(TypeTaskCancelRequested, 1, join([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, hdr, []byte{0xa1, 't'}))
	decodeErr(t, b, 3, ErrCorrupt, "body")
}

// TestDecodeDeepNesting: deeply nested extra fields are skipped (or refused) without
// exhausting the stack.
func TestDecodeDeepNesting(t *testing.T) {
	const depth = 1 << 21 // the decoder skips without recursion
	body := join([]byte{0x95, 0x03, 0xa1, 's', 0x0a, 0xa1, 't'}, nil, bytes.Repeat([]byte{0x91}, depth), []byte{0xc0})
	ev, err := Decode(envelope(TypeTaskCancelRequested, 1, body), 3)
	if err != nil {
		t.Fatal(err)
	}
	want := &TaskCancelRequested{Header: Header{Seq: 3, SessionID: "s", At: 10}, TaskID: "t"}
	if !eventsEqual(ev, want) {
		t.Fatalf("got %#v", ev)
	}
	// Cut short: every array open.
	body = join([]byte{0x95, 0x03, 0xa1, 's', 0x0a, 0xa1, 't'}, nil, bytes.Repeat([]byte{0x91}, depth))
	decodeErr(t, envelope(TypeTaskCancelRequested, 1, body), 3, ErrCorrupt, "body")
}

func TestDecodeErrorMessage(t *testing.T) {
	e := &DecodeError{Seq: 7, Type: TypeTaskClaimed, Field: "attempt", Kind: ErrCorrupt, Detail: "must be positive"}
	if got, want := e.Error(), "events: corrupt event at seq 7 (task_claimed): field attempt: must be positive"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &DecodeError{Kind: ErrUnknownType}
	if got, want := e.Error(), "events: unknown event type"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, ErrUnknownType) || errors.Is(e, ErrCorrupt) {
		t.Error("Unwrap does not give Kind")
	}
}

// TestDecodeDoesNotAlias: a decoded event owns its bytes; stores decode from buffers they reuse.
func TestDecodeDoesNotAlias(t *testing.T) {
	for _, f := range currentFixtures(t) {
		b := readGolden(t, f.name)
		ev, err := Decode(b, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := range b {
			b[i] = 'X'
		}
		if !eventsEqual(ev, f.ev) {
			t.Errorf("%s changed with the buffer it was decoded from: %#v", f.name, ev)
		}
	}
}

// TestDecoderReuses: a Decoder hands out its own struct for each type, cleared for every
// decode, and what a caller kept of an earlier event (strings, byte strings) stays intact.
func TestDecoderReuses(t *testing.T) {
	full := &TaskSubmitted{Header: Header{Seq: 1, SessionID: "s1", At: 5}, TaskID: "t1", Kind: "k",
		Input: []byte(`{"a":1}`), HasRunAt: true, RunAt: 9, IdempotencyKey: "key", WakeOnCompletion: true}
	bare := &TaskSubmitted{Header: Header{Seq: 2, SessionID: "s2", At: 6}, TaskID: "t2", Kind: "k"}
	claim := &TaskClaimed{Header: Header{Seq: 3, SessionID: "s1", At: 7}, TaskID: "t1", Attempt: 1,
		LeaseToken: "tok", LeaseExpiresAt: 8}
	var d Decoder
	first, err := d.Decode(mustEncode(t, full), 1)
	if err != nil {
		t.Fatal(err)
	}
	kept := first.(*TaskSubmitted)
	id, input := kept.TaskID, kept.Input
	c, err := d.Decode(mustEncode(t, claim), 3)
	if err != nil || !eventsEqual(c, claim) {
		t.Fatalf("claim: %#v, %v", c, err)
	}
	if !eventsEqual(first, full) {
		t.Fatalf("decoding another type changed the first event: %#v", first)
	}
	second, err := d.Decode(mustEncode(t, bare), 2)
	if err != nil {
		t.Fatal(err)
	}
	if second != first {
		t.Errorf("a second TaskSubmitted came in a new struct")
	}
	if !eventsEqual(second, bare) {
		t.Errorf("fields of the first event show through: %#v", second)
	}
	if id != "t1" || string(input) != `{"a":1}` {
		t.Errorf("kept id %q, input %q changed", id, input)
	}
	if _, err := d.Decode([]byte{1, 2, 3}, 4); err == nil {
		t.Fatal("garbage decoded")
	}
	if again, err := d.Decode(mustEncode(t, full), 1); err != nil || !eventsEqual(again, full) {
		t.Fatalf("after an error: %#v, %v", again, err)
	}
}

// --- encoding ---

type alienEvent struct {
	Header
	typ Type
}

func (e *alienEvent) Type() Type                  { return e.typ }
func (e *alienEvent) Subject() (string, string)   { return "t", "" }
func (e *alienEvent) withType(t Type) *alienEvent { e.typ = t; return e }

func TestAppendErrors(t *testing.T) {
	dst := []byte("prefix")
	for _, ev := range []Event{
		(&alienEvent{Header: Header{Seq: 1, SessionID: "s"}}).withType(0),
		(&alienEvent{Header: Header{Seq: 1, SessionID: "s"}}).withType(42),
		(&alienEvent{Header: Header{Seq: 1, SessionID: "s"}}).withType(TypeTaskSubmitted),
	} {
		out, err := Append(dst, ev)
		if err == nil {
			t.Errorf("Append of a %s alien succeeded", ev.Type())
		}
		if string(out) != "prefix" {
			t.Errorf("Append changed dst on error: %q", out)
		}
	}
	// After a failed Append the pooled encoder still encodes correctly.
	f := fixture(t, "task_claimed.v2")
	if b := mustEncode(t, f); !bytes.Equal(b, readGolden(t, "task_claimed.v2")) {
		t.Error("encoding after a failed Append differs from the golden file")
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	var buf []byte
	var offsets []int
	fixtures := goldenFixtures // every version: a claim without a worker is still written as v1
	for _, f := range fixtures {
		offsets = append(offsets, len(buf))
		var err error
		if buf, err = Append(buf, f.ev); err != nil {
			t.Fatal(err)
		}
	}
	offsets = append(offsets, len(buf))
	for i, f := range fixtures {
		if got := buf[offsets[i]:offsets[i+1]]; !bytes.Equal(got, readGolden(t, f.name)) {
			t.Errorf("Append of %s after %d bytes wrote %x", f.name, offsets[i], got)
		}
	}
}

func TestLeaseToken(t *testing.T) {
	for _, f := range goldenFixtures {
		want := ""
		switch f.ev.Type() {
		case TypeTaskClaimed, TypeTaskSettled, TypeWakeClaimed, TypeWakeAcked:
			want = goldenToken
		}
		if got := LeaseToken(f.ev); got != want {
			t.Errorf("LeaseToken(%s) = %q, want %q", f.name, got, want)
		}
	}
}

func itoa(n int) string    { return strconv.Itoa(n) }
func utoa(n uint64) string { return strconv.FormatUint(n, 10) }

// manyHeaders is n distinct small headers.
func manyHeaders(n int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h[fmt.Sprintf("k%03d", i)] = "v"
	}
	return h
}

// TestDecodeHeadersWire: headers the encoder never writes (keys out of order or repeated, a
// map claiming more entries than the cap or than the bytes hold, a value of the wrong type)
// are ErrCorrupt naming "headers", read without allocating what the count claims.
func TestDecodeHeadersWire(t *testing.T) {
	fields := [][]byte{
		{0x03}, {0xa1, 's'}, {0x0a}, {0xa1, 't'}, {0xa1, 'k'}, {0xc4, 0}, {0xc2}, {0x00}, {0xa0}, {0xc2},
		{0x05}, // priority
	}
	body := func(headers []byte) []byte { return join([]byte{0x9c}, fields, headers) }
	cases := map[string][]byte{
		"keys out of order":  {0x82, 0xa1, 'b', 0xa0, 0xa1, 'a', 0xa0},
		"a key repeated":     {0x82, 0xa1, 'a', 0xa0, 0xa1, 'a', 0xa0},
		"count over the cap": {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'a', 0xa0},
		"count over bytes":   {0x83, 0xa1, 'a', 0xa0},
		"value not a string": {0x81, 0xa1, 'a', 0x05},
		"not a map":          {0x91, 0xa1, 'a'},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			b := envelope(TypeTaskSubmitted, 2, body(h))
			decodeErr(t, b, 3, ErrCorrupt, "headers")
			if _, err := refDecode(b, 3); err == nil {
				t.Fatal("the reference decoder accepted it")
			}
			if n := testing.AllocsPerRun(10, func() { _, _ = Decode(b, 3) }); n > 20 {
				t.Errorf("%v allocations for a rejected event", n)
			}
		})
	}
	// nil headers and an empty map both decode as none.
	for _, h := range [][]byte{{0xc0}, {0x80}} {
		ev, err := Decode(envelope(TypeTaskSubmitted, 2, body(h)), 3)
		if err != nil {
			t.Fatal(err)
		}
		if s := ev.(*TaskSubmitted); s.Headers != nil || s.Priority != 5 {
			t.Fatalf("headers %v priority %d", s.Headers, s.Priority)
		}
	}
}

// TestSubmitBodyVersion: a submit with neither priority nor headers is written as version
// 1, byte for byte what older builds wrote; either one makes it version 2.
func TestSubmitBodyVersion(t *testing.T) {
	base := TaskSubmitted{Header: Header{Seq: 1, SessionID: "s", At: 1}, TaskID: "t", Kind: "k"}
	for _, tc := range []struct {
		ev   TaskSubmitted
		want uint8
	}{
		{base, 1},
		{func() TaskSubmitted { e := base; e.Priority = -1; return e }(), 2},
		{func() TaskSubmitted { e := base; e.Headers = map[string]string{"a": ""}; return e }(), 2},
		{func() TaskSubmitted { e := base; e.Headers = map[string]string{}; return e }(), 1},
	} {
		b := mustEncode(t, &tc.ev)
		if b[2] != tc.want {
			t.Errorf("priority %d headers %v: version %d, want %d", tc.ev.Priority, tc.ev.Headers, b[2], tc.want)
		}
		got, err := Decode(b, 1)
		if err != nil {
			t.Fatal(err)
		}
		if g := got.(*TaskSubmitted); g.Priority != tc.ev.Priority || len(g.Headers) != len(tc.ev.Headers) {
			t.Errorf("round trip: %+v", g)
		}
	}
	// The same headers in any insertion order encode to the same bytes.
	a, b := base, base
	a.Headers = map[string]string{"x": "1", "y": "2", "z": "3"}
	b.Headers = map[string]string{"z": "3", "x": "1", "y": "2"}
	if !bytes.Equal(mustEncode(t, &a), mustEncode(t, &b)) {
		t.Error("headers encode depending on the map")
	}
}
