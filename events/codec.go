package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// EnvelopeV1 is the only envelope version so far.
const EnvelopeV1 = 1

// schemaVersion is the body version written for each type today. Reading accepts every
// version from 1 to this one.
var schemaVersion = [...]uint8{
	TypeTaskSubmitted:       1,
	TypeTaskClaimed:         1,
	TypeTaskSettled:         1,
	TypeTaskCancelRequested: 1,
	TypeWakeRecorded:        1,
	TypeWakeClaimed:         1,
	TypeWakeAcked:           1,
	TypeTaskSettleRejected:  1,
	TypeWakeAckRejected:     1,
}

const (
	headerLen  = 3
	trailerLen = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors returned by Decode, always inside a *DecodeError. Check with errors.Is.
var (
	ErrCorrupt        = errors.New("events: corrupt event")
	ErrUnknownType    = errors.New("events: unknown event type")
	ErrUnknownVersion = errors.New("events: unknown version")
)

// DecodeError says what could not be decoded and where.
type DecodeError struct {
	Seq    uint64 // the log sequence the bytes were read at; 0 when unknown
	Type   Type   // 0 when the type byte itself was not readable
	Field  string // the body field being read, or the envelope part
	Kind   error  // ErrCorrupt, ErrUnknownType or ErrUnknownVersion
	Detail string
}

func (e *DecodeError) Error() string {
	var b bytes.Buffer
	b.WriteString(e.Kind.Error())
	if e.Seq != 0 {
		fmt.Fprintf(&b, " at seq %d", e.Seq)
	}
	if e.Type != 0 {
		fmt.Fprintf(&b, " (%s)", e.Type)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": field %s", e.Field)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

func (e *DecodeError) Unwrap() error { return e.Kind }

var encPool = sync.Pool{New: func() any {
	buf := new(bytes.Buffer)
	enc := msgpack.NewEncoder(buf)
	return &encoder{buf: buf, enc: enc}
}}

type encoder struct {
	buf *bytes.Buffer
	enc *msgpack.Encoder
	err error
}

func (w *encoder) arr(n int)    { w.check(w.enc.EncodeArrayLen(n)) }
func (w *encoder) u64(v uint64) { w.check(w.enc.EncodeUint(v)) }
func (w *encoder) i64(v int64)  { w.check(w.enc.EncodeInt(v)) }
func (w *encoder) str(v string) { w.check(w.enc.EncodeString(v)) }
func (w *encoder) bin(v []byte) { w.check(w.enc.EncodeBytes(v)) }
func (w *encoder) bool(v bool)  { w.check(w.enc.EncodeBool(v)) }
func (w *encoder) check(err error) {
	if w.err == nil {
		w.err = err
	}
}

// Append encodes e and appends the encoding to dst.
func Append(dst []byte, e Event) ([]byte, error) {
	t := e.Type()
	if !t.Known() {
		return dst, fmt.Errorf("events: cannot encode %s", t)
	}
	w := encPool.Get().(*encoder)
	defer encPool.Put(w)
	w.buf.Reset()
	w.err = nil
	w.buf.Write([]byte{EnvelopeV1, byte(t), schemaVersion[t]})
	h := e.Head()
	switch e := e.(type) {
	case *TaskSubmitted:
		w.arr(10)
		w.header(h)
		w.str(e.TaskID)
		w.str(e.Kind)
		w.bin(e.Input)
		w.bool(e.HasRunAt)
		w.i64(e.RunAt)
		w.str(e.IdempotencyKey)
		w.bool(e.WakeOnCompletion)
	case *TaskClaimed:
		w.arr(7)
		w.header(h)
		w.str(e.TaskID)
		w.u64(uint64(e.Attempt))
		w.str(e.LeaseToken)
		w.i64(e.LeaseExpiresAt)
	case *TaskSettled:
		w.arr(7)
		w.header(h)
		w.str(e.TaskID)
		w.u64(uint64(e.Attempt))
		w.str(e.LeaseToken)
		w.outcome(&e.Outcome)
	case *TaskCancelRequested:
		w.arr(4)
		w.header(h)
		w.str(e.TaskID)
	case *WakeRecorded:
		w.arr(9)
		w.header(h)
		w.str(e.WakeID)
		w.u64(uint64(e.Reason))
		w.bin(e.Payload)
		w.str(e.IdempotencyKey)
		w.str(e.TaskID)
		w.outcome(&e.Outcome)
	case *WakeClaimed:
		w.arr(7)
		w.header(h)
		w.str(e.WakeID)
		w.u64(uint64(e.Attempt))
		w.str(e.LeaseToken)
		w.i64(e.LeaseExpiresAt)
	case *WakeAcked:
		w.arr(6)
		w.header(h)
		w.str(e.WakeID)
		w.u64(uint64(e.Attempt))
		w.str(e.LeaseToken)
	case *TaskSettleRejected:
		w.arr(6)
		w.header(h)
		w.str(e.TaskID)
		w.u64(uint64(e.Attempt))
		w.u64(uint64(e.Reason))
	case *WakeAckRejected:
		w.arr(6)
		w.header(h)
		w.str(e.WakeID)
		w.u64(uint64(e.Attempt))
		w.u64(uint64(e.Reason))
	default:
		return dst, fmt.Errorf("events: cannot encode %T", e)
	}
	if w.err != nil {
		return dst, fmt.Errorf("events: encoding %s: %w", t, w.err)
	}
	dst = append(dst, w.buf.Bytes()...)
	start := len(dst) - w.buf.Len()
	sum := crc32.Checksum(dst[start:], castagnoli)
	return binary.BigEndian.AppendUint32(dst, sum), nil
}

// Encode returns the encoding of e.
func Encode(e Event) ([]byte, error) { return Append(nil, e) }

func (w *encoder) header(h *Header) {
	w.u64(h.Seq)
	w.str(h.SessionID)
	w.i64(h.At)
}

// An outcome is a nested array: [state, summary, output, error].
func (w *encoder) outcome(o *Outcome) {
	w.arr(4)
	w.u64(uint64(o.State))
	w.str(o.Summary)
	w.bin(o.Output)
	w.str(o.Error)
}

var decPool = sync.Pool{New: func() any {
	r := &decoder{rd: bytes.NewReader(nil)}
	r.dec = msgpack.NewDecoder(r.rd)
	return r
}}

type decoder struct {
	rd   *bytes.Reader
	dec  *msgpack.Decoder
	err  *DecodeError
	seq  uint64
	typ  Type
	left int // fields left in the current body array
}

func (r *decoder) fail(field string, err error) {
	if r.err == nil {
		r.err = &DecodeError{Seq: r.seq, Type: r.typ, Field: field, Kind: ErrCorrupt, Detail: err.Error()}
	}
}

func (r *decoder) next(field string) bool {
	if r.err != nil {
		return false
	}
	if r.left <= 0 {
		r.fail(field, errors.New("body has too few fields"))
		return false
	}
	r.left--
	return true
}

func (r *decoder) u64(field string, max uint64) uint64 {
	if !r.next(field) {
		return 0
	}
	v, err := r.dec.DecodeUint64()
	if err != nil {
		r.fail(field, err)
		return 0
	}
	if v > max {
		r.fail(field, fmt.Errorf("value %d out of range (max %d)", v, max))
		return 0
	}
	return v
}

func (r *decoder) i64(field string) int64 {
	if !r.next(field) {
		return 0
	}
	v, err := r.dec.DecodeInt64()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *decoder) str(field string) string {
	if !r.next(field) {
		return ""
	}
	v, err := r.dec.DecodeString()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *decoder) bin(field string) []byte {
	if !r.next(field) {
		return nil
	}
	v, err := r.dec.DecodeBytes()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *decoder) bool(field string) bool {
	if !r.next(field) {
		return false
	}
	v, err := r.dec.DecodeBool()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *decoder) header(h *Header) {
	h.Seq = r.u64("seq", 1<<64-1)
	h.SessionID = r.str("session_id")
	h.At = r.i64("at")
}

func (r *decoder) outcome(field string, o *Outcome) {
	if !r.next(field) {
		return
	}
	n, err := r.dec.DecodeArrayLen()
	if err != nil {
		r.fail(field, err)
		return
	}
	if n < 4 {
		r.fail(field, fmt.Errorf("outcome has %d fields, want 4", n))
		return
	}
	outer := r.left
	r.left = n
	o.State = TaskState(r.u64(field+".state", uint64(StateCanceled)))
	o.Summary = r.str(field + ".summary")
	o.Output = r.bin(field + ".output")
	o.Error = r.str(field + ".error")
	r.skipRest(field)
	r.left = outer
}

// skipRest skips fields appended by a newer minor revision of the same schema version.
func (r *decoder) skipRest(field string) {
	for r.err == nil && r.left > 0 {
		r.left--
		if err := r.dec.Skip(); err != nil {
			r.fail(field, err)
		}
	}
}

// Decode decodes one event. seq is the log position the bytes were read at (0 when unknown);
// it is named in errors and, when non-zero, must equal the sequence inside the event.
//
// Decode never panics on any input: truncated, corrupt, unknown-type or unknown-version bytes
// give a *DecodeError that names the field or envelope part.
func Decode(b []byte, seq uint64) (ev Event, err error) {
	if len(b) < headerLen+trailerLen+1 {
		return nil, &DecodeError{Seq: seq, Field: "envelope", Kind: ErrCorrupt,
			Detail: fmt.Sprintf("%d bytes is shorter than the smallest event", len(b))}
	}
	if b[0] != EnvelopeV1 {
		return nil, &DecodeError{Seq: seq, Field: "envelope", Kind: ErrUnknownVersion,
			Detail: fmt.Sprintf("envelope version %d (this build reads %d)", b[0], EnvelopeV1)}
	}
	t := Type(b[1])
	body := b[headerLen : len(b)-trailerLen]
	want := binary.BigEndian.Uint32(b[len(b)-trailerLen:])
	if got := crc32.Checksum(b[:len(b)-trailerLen], castagnoli); got != want {
		return nil, &DecodeError{Seq: seq, Type: t, Field: "checksum", Kind: ErrCorrupt,
			Detail: fmt.Sprintf("crc32c %08x, stored %08x", got, want)}
	}
	if !t.Known() {
		return nil, &DecodeError{Seq: seq, Field: "type", Kind: ErrUnknownType,
			Detail: fmt.Sprintf("type byte %d", b[1])}
	}
	if v := b[2]; v == 0 || v > schemaVersion[t] {
		return nil, &DecodeError{Seq: seq, Type: t, Field: "schema_version", Kind: ErrUnknownVersion,
			Detail: fmt.Sprintf("schema version %d (this build reads 1..%d)", v, schemaVersion[t])}
	}

	r := decPool.Get().(*decoder)
	defer decPool.Put(r)
	r.rd.Reset(body)
	r.dec.Reset(r.rd)
	r.err, r.seq, r.typ = nil, seq, t
	n, derr := r.dec.DecodeArrayLen()
	if derr != nil {
		return nil, &DecodeError{Seq: seq, Type: t, Field: "body", Kind: ErrCorrupt, Detail: derr.Error()}
	}
	r.left = n

	switch t {
	case TypeTaskSubmitted:
		e := &TaskSubmitted{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Kind = r.str("kind")
		e.Input = r.bin("input")
		e.HasRunAt = r.bool("has_run_at")
		e.RunAt = r.i64("run_at")
		e.IdempotencyKey = r.str("idempotency_key")
		e.WakeOnCompletion = r.bool("wake_on_completion")
		ev = e
	case TypeTaskClaimed:
		e := &TaskClaimed{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.LeaseToken = r.str("lease_token")
		e.LeaseExpiresAt = r.i64("lease_expires_at")
		ev = e
	case TypeTaskSettled:
		e := &TaskSettled{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.LeaseToken = r.str("lease_token")
		r.outcome("outcome", &e.Outcome)
		ev = e
	case TypeTaskCancelRequested:
		e := &TaskCancelRequested{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		ev = e
	case TypeWakeRecorded:
		e := &WakeRecorded{}
		r.header(&e.Header)
		e.WakeID = r.str("wake_id")
		e.Reason = WakeReason(r.u64("reason", uint64(WakeTaskFinished)))
		e.Payload = r.bin("payload")
		e.IdempotencyKey = r.str("idempotency_key")
		e.TaskID = r.str("task_id")
		r.outcome("outcome", &e.Outcome)
		ev = e
	case TypeWakeClaimed:
		e := &WakeClaimed{}
		r.header(&e.Header)
		e.WakeID = r.str("wake_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.LeaseToken = r.str("lease_token")
		e.LeaseExpiresAt = r.i64("lease_expires_at")
		ev = e
	case TypeWakeAcked:
		e := &WakeAcked{}
		r.header(&e.Header)
		e.WakeID = r.str("wake_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.LeaseToken = r.str("lease_token")
		ev = e
	case TypeTaskSettleRejected:
		e := &TaskSettleRejected{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.Reason = RejectReason(r.u64("reason", uint64(RejectNotClaimed)))
		ev = e
	case TypeWakeAckRejected:
		e := &WakeAckRejected{}
		r.header(&e.Header)
		e.WakeID = r.str("wake_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.Reason = RejectReason(r.u64("reason", uint64(RejectNotClaimed)))
		ev = e
	}
	r.skipRest("body")
	if r.err == nil && r.rd.Len() != 0 {
		r.fail("body", fmt.Errorf("%d trailing bytes after the body", r.rd.Len()))
	}
	if r.err == nil {
		r.err = check(ev, seq)
	}
	if r.err != nil {
		r.err.Seq, r.err.Type = seq, t
		return nil, r.err
	}
	return ev, nil
}

// check validates what the fields mean, beyond their types: the pair assertion to the checks
// made before an event is appended.
func check(ev Event, seq uint64) *DecodeError {
	h := ev.Head()
	bad := func(field, detail string) *DecodeError {
		return &DecodeError{Field: field, Kind: ErrCorrupt, Detail: detail}
	}
	if h.Seq == 0 {
		return bad("seq", "must be positive")
	}
	if seq != 0 && h.Seq != seq {
		return bad("seq", fmt.Sprintf("event says %d, stored at %d", h.Seq, seq))
	}
	if h.SessionID == "" {
		return bad("session_id", "must not be empty")
	}
	taskID, wakeID := ev.Subject()
	if taskID == "" && wakeID == "" {
		return bad("subject", "event names no task or wake")
	}
	switch e := ev.(type) {
	case *TaskClaimed:
		if e.Attempt == 0 {
			return bad("attempt", "must be positive")
		}
	case *TaskSettled:
		if !e.Outcome.State.Terminal() {
			return bad("outcome.state", "must be terminal")
		}
	case *WakeRecorded:
		if e.Reason == WakeTaskFinished && (e.TaskID == "" || !e.Outcome.State.Terminal()) {
			return bad("outcome", "a task-finished wake needs a task id and a terminal outcome")
		}
	case *WakeClaimed:
		if e.Attempt == 0 {
			return bad("attempt", "must be positive")
		}
	}
	return nil
}

// Redacted is what tools print in place of a lease token.
const Redacted = "[redacted]"
