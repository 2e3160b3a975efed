// Package recordcodec is the stored form of the projection's task and wake records (store
// format 1 and later): the value of a task or wake key in a Pebble store, the rec column of
// PostgreSQL's tasks and wakes tables, and the records of replay's snapshot cache. It is the
// one home of that format, so that no backend imports another for it.
package recordcodec

import (
	"errors"
	"fmt"
	"slices"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/msgp"
	"github.com/worklog/worklog/projection"
)

// The task and wake records are msgpack: the array layout that vmihailenco/msgpack's
// reflection encoder wrote for projection.Task and projection.Wake when format 1 was made
// (`as_array`), with its default fixed-width integers (int64 as 0xd3 + 8 bytes, uint64 0xcf,
// uint32 0xce, uint8 0xcc) and the Outcome as a four-entry map keyed by field name. The
// projection's types carry no msgpack tags: this file is the format, written with the msgpack
// primitives shared with the event codec (internal/msgp). testdata/records pins the bytes, and
// TestRecordCodecMatchesMsgpack holds them to the reflection encoder's on a tagged mirror of
// the structs. The decoder accepts every msgpack integer, string and binary width, and arrays
// shorter than today's (fields are only ever appended: a missing field is zero) or longer
// (later fields are skipped only if they are scalars); it refuses nil where a number, bool,
// array or map belongs.

const (
	taskFields = 27
	wakeFields = 17
)

// ErrCorrupt marks a record that does not decode; the error naming the key is a
// *DecodeError.
var ErrCorrupt = errors.New("corrupt projection record")

// DecodeError is a record that does not decode: its key (as the caller named it) and why.
// Its text leaves out ErrCorrupt's, so that a store wraps it in its own sentinel (pebblelog's
// ErrCorruptRecord, postgres's ErrCorruptRow) without repeating itself.
type DecodeError struct {
	Key []byte
	Err error
}

func (e *DecodeError) Error() string        { return fmt.Sprintf("key %q: %v", e.Key, e.Err) }
func (e *DecodeError) Unwrap() error        { return e.Err }
func (e *DecodeError) Is(target error) bool { return target == ErrCorrupt }

func appendOutcome(b []byte, o *events.Outcome) []byte {
	b = msgp.AppendMapLen(b, 4)
	b = msgp.AppendUint8(msgp.AppendStr(b, "State"), uint8(o.State))
	b = msgp.AppendStr(msgp.AppendStr(b, "Summary"), o.Summary)
	b = msgp.AppendBin(msgp.AppendStr(b, "Output"), o.Output)
	return msgp.AppendStr(msgp.AppendStr(b, "Error"), o.Error)
}

// Per-field codec boilerplate: AppendTask, AppendWake, DecodeTask and DecodeWake are one line
// a field, in the order of the layout.

// AppendTask appends the stored record of t to b.
func AppendTask(b []byte, t *projection.Task) []byte {
	b = msgp.AppendArrayLen(b, taskFields)
	b = msgp.AppendStr(b, t.ID)
	b = msgp.AppendStr(b, t.SessionID)
	b = msgp.AppendStr(b, t.Kind)
	b = msgp.AppendBin(b, t.Input)
	b = msgp.AppendBool(b, t.HasRunAt)
	b = msgp.AppendInt64(b, t.RunAt)
	b = msgp.AppendStr(b, t.IdempotencyKey)
	b = msgp.AppendBool(b, t.WakeOnCompletion)
	b = msgp.AppendInt64(b, t.CreatedAt)
	b = msgp.AppendInt64(b, t.ScheduledAt)
	b = msgp.AppendUint64(b, t.SubmitSeq)
	b = msgp.AppendUint8(b, uint8(t.State))
	b = msgp.AppendBool(b, t.CancelRequested)
	b = msgp.AppendInt64(b, t.CancelRequestedAt)
	b = msgp.AppendUint32(b, t.Attempts)
	b = msgp.AppendStr(b, t.LeaseToken)
	b = msgp.AppendInt64(b, t.LeaseExpiresAt)
	b = msgp.AppendInt64(b, t.FinishedAt)
	b = appendOutcome(b, &t.Outcome)
	b = msgp.AppendStr(b, t.SettledToken)
	b = msgp.AppendStr(b, t.CompletionWakeID)
	b = msgp.AppendUint32(b, t.RejectedAttempt)
	b = msgp.AppendUint64(b, t.UpdatedSeq)
	b = msgp.AppendUint32(b, t.AttemptsAtRetry)
	b = msgp.AppendInt64(b, t.Priority)
	b = appendHeaders(b, t.Headers)
	return msgp.AppendUint32(b, t.UnackedEarlierWakes)
}

// appendHeaders writes a task's headers as msgpack's reflection encoder writes a
// map[string]string with sorted keys (SetSortMapKeys): nil when there are none, else a map of
// str to str in key order, so a record's bytes depend only on its contents.
func appendHeaders(b []byte, h map[string]string) []byte {
	if h == nil {
		return append(b, 0xc0)
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = msgp.AppendMapLen(b, len(h))
	for _, k := range keys {
		b = msgp.AppendStr(msgp.AppendStr(b, k), h[k])
	}
	return b
}

// AppendWake appends the record of x.
func AppendWake(b []byte, x *projection.Wake) []byte {
	b = msgp.AppendArrayLen(b, wakeFields)
	b = msgp.AppendStr(b, x.ID)
	b = msgp.AppendStr(b, x.SessionID)
	b = msgp.AppendUint8(b, uint8(x.Reason))
	b = msgp.AppendBin(b, x.Payload)
	b = msgp.AppendStr(b, x.IdempotencyKey)
	b = msgp.AppendStr(b, x.TaskID)
	b = appendOutcome(b, &x.Outcome)
	b = msgp.AppendInt64(b, x.CreatedAt)
	b = msgp.AppendUint64(b, x.RecordSeq)
	b = msgp.AppendUint32(b, x.Attempts)
	b = msgp.AppendStr(b, x.LeaseToken)
	b = msgp.AppendInt64(b, x.LeaseExpiresAt)
	b = msgp.AppendBool(b, x.Acked)
	b = msgp.AppendStr(b, x.AckedToken)
	b = msgp.AppendUint32(b, x.RejectedAttempt)
	b = msgp.AppendUint64(b, x.UpdatedSeq)
	return msgp.AppendInt64(b, x.AckedAt)
}

// recordReader reads a record's fields; the first error sticks and later reads return zero
// values.
type recordReader struct {
	msgp.Reader
	left int // fields of the record's array not yet read
	err  error
}

func (r *recordReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// start reads the record's array header; nil is no record.
func (r *recordReader) start() {
	n, err := r.ArrayLen()
	if err == nil && n < 0 {
		err = &msgp.CodeError{Code: 0xc0, Want: "array"}
	}
	r.fail(err)
	r.left = max(n, 0)
}

// next reports whether the record's array has a field left to read, and takes it: a record of
// an older layout ends early and its missing fields stay zero.
func (r *recordReader) next() bool {
	if r.err != nil || r.left == 0 {
		return false
	}
	r.left--
	return true
}

// end skips the fields of a later layout and checks nothing follows the record.
func (r *recordReader) end() {
	for ; r.left > 0 && r.err == nil; r.left-- {
		r.fail(r.SkipScalar())
	}
	if r.err == nil && r.Left() != 0 {
		r.fail(fmt.Errorf("%d bytes after the record", r.Left()))
	}
}

func (r *recordReader) str() string {
	v, _, err := r.Raw() // nil is ""
	r.fail(err)
	return string(v)
}

// bin copies the bytes out (the record must not alias Pebble's buffer); nil stays nil.
func (r *recordReader) bin() []byte {
	v, isNil, err := r.Raw()
	if isNil || err != nil {
		r.fail(err)
		return nil
	}
	return append(make([]byte, 0, len(v)), v...)
}

// uint reads an integer of any width that fits in bits unsigned bits.
func (r *recordReader) uint(bits int) uint64 {
	v, err := r.Uint(1<<bits - 1) // 1<<64 - 1 is MaxUint64: Go's shift wraps
	r.fail(err)
	return v
}

func (r *recordReader) outcome(o *events.Outcome) {
	n, err := r.MapLen()
	if err == nil && n < 0 {
		err = &msgp.CodeError{Code: 0xc0, Want: "map"}
	}
	r.fail(err)
	for i := 0; i < n && r.err == nil; i++ {
		k, _, err := r.Raw() // a nil key is "", refused below
		r.fail(err)
		switch string(k) { // compared without a copy
		case "State":
			o.State = events.TaskState(r.uint(8))
		case "Summary":
			o.Summary = r.str()
		case "Output":
			o.Output = r.bin()
		case "Error":
			o.Error = r.str()
		default:
			r.fail(fmt.Errorf("unknown outcome field %q", k))
		}
	}
}

func (r *recordReader) fstr() (v string) {
	if r.next() {
		v = r.str()
	}
	return v
}

func (r *recordReader) fbin() (v []byte) {
	if r.next() {
		v = r.bin()
	}
	return v
}

func (r *recordReader) fbool() (v bool) {
	if r.next() {
		var isNil bool
		var err error
		v, isNil, err = r.Bool()
		if err == nil && isNil {
			err = &msgp.CodeError{Code: 0xc0, Want: "bool"}
		}
		r.fail(err)
	}
	return v
}

func (r *recordReader) fint() (v int64) {
	if r.next() {
		var err error
		v, err = r.Int64()
		r.fail(err)
	}
	return v
}

func (r *recordReader) fuint(bits int) (v uint64) {
	if r.next() {
		v = r.uint(bits)
	}
	return v
}

// fheaders reads a task's headers: nil, or a map of str to str of at most
// events.MaxHeaders entries (checked before the map is allocated); an empty map reads as nil.
func (r *recordReader) fheaders() map[string]string {
	if !r.next() {
		return nil
	}
	n, err := r.MapLen()
	if err != nil || n <= 0 {
		r.fail(err)
		return nil
	}
	if n > events.MaxHeaders {
		r.fail(fmt.Errorf("headers: %d entries is more than %d", n, events.MaxHeaders))
		return nil
	}
	h := make(map[string]string, n)
	for i := 0; i < n && r.err == nil; i++ {
		k := r.str()
		h[k] = r.str()
	}
	return h
}

func (r *recordReader) foutcome(o *events.Outcome) {
	if r.next() {
		r.outcome(o)
	}
}

// DecodeTask decodes a task record; an error is a *DecodeError naming key.
func DecodeTask(key, v []byte) (*projection.Task, error) {
	t := new(projection.Task)
	r := &recordReader{Reader: msgp.NewReader(v)}
	r.start()
	t.ID = r.fstr()
	t.SessionID = r.fstr()
	t.Kind = r.fstr()
	t.Input = r.fbin()
	t.HasRunAt = r.fbool()
	t.RunAt = r.fint()
	t.IdempotencyKey = r.fstr()
	t.WakeOnCompletion = r.fbool()
	t.CreatedAt = r.fint()
	t.ScheduledAt = r.fint()
	t.SubmitSeq = r.fuint(64)
	t.State = events.TaskState(r.fuint(8))
	t.CancelRequested = r.fbool()
	t.CancelRequestedAt = r.fint()
	t.Attempts = uint32(r.fuint(32))
	t.LeaseToken = r.fstr()
	t.LeaseExpiresAt = r.fint()
	t.FinishedAt = r.fint()
	r.foutcome(&t.Outcome)
	t.SettledToken = r.fstr()
	t.CompletionWakeID = r.fstr()
	t.RejectedAttempt = uint32(r.fuint(32))
	t.UpdatedSeq = r.fuint(64)
	t.AttemptsAtRetry = uint32(r.fuint(32))
	t.Priority = r.fint()
	t.Headers = r.fheaders()
	t.UnackedEarlierWakes = uint32(r.fuint(32))
	r.end()
	if r.err != nil {
		return nil, &DecodeError{Key: key, Err: r.err}
	}
	return t, nil
}

// DecodeWake decodes a wake record; an error is a *DecodeError naming key.
func DecodeWake(key, v []byte) (*projection.Wake, error) {
	x := new(projection.Wake)
	r := &recordReader{Reader: msgp.NewReader(v)}
	r.start()
	x.ID = r.fstr()
	x.SessionID = r.fstr()
	x.Reason = events.WakeReason(r.fuint(8))
	x.Payload = r.fbin()
	x.IdempotencyKey = r.fstr()
	x.TaskID = r.fstr()
	r.foutcome(&x.Outcome)
	x.CreatedAt = r.fint()
	x.RecordSeq = r.fuint(64)
	x.Attempts = uint32(r.fuint(32))
	x.LeaseToken = r.fstr()
	x.LeaseExpiresAt = r.fint()
	x.Acked = r.fbool()
	x.AckedToken = r.fstr()
	x.RejectedAttempt = uint32(r.fuint(32))
	x.UpdatedSeq = r.fuint(64)
	x.AckedAt = r.fint()
	r.end()
	if r.err != nil {
		return nil, &DecodeError{Key: key, Err: r.err}
	}
	return x, nil
}
