package events

// The reference decoder: the original implementation of Decode (commit fd9b309), on
// msgpack's Decoder. The hand-written Decode must accept exactly what it accepts and give
// exactly the same events, and reject exactly what it rejects, with the same kind, type and
// field (TestDecodeMatchesReference, FuzzDecode). Two patches, marked, keep it from
// allocating what a forged length claims; neither changes what it accepts or returns.

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
)

func newRefDecoder() *refDecoder {
	r := &refDecoder{rd: bytes.NewReader(nil)}
	r.dec = msgpack.NewDecoder(r.rd)
	return r
}

type refDecoder struct {
	rd   *bytes.Reader
	dec  *msgpack.Decoder
	err  *DecodeError
	seq  uint64
	typ  Type
	left int // fields left in the current body array
}

func (r *refDecoder) fail(field string, err error) {
	if r.err == nil {
		r.err = &DecodeError{Seq: r.seq, Type: r.typ, Field: field, Kind: ErrCorrupt, Detail: err.Error()}
	}
}

func (r *refDecoder) next(field string) bool {
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

func (r *refDecoder) u64(field string, max uint64) uint64 {
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

func (r *refDecoder) i64(field string) int64 {
	if !r.next(field) {
		return 0
	}
	v, err := r.dec.DecodeInt64()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *refDecoder) str(field string) string {
	if !r.next(field) {
		return ""
	}
	v, err := r.dec.DecodeString()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *refDecoder) bin(field string) []byte {
	if !r.next(field) {
		return nil
	}
	// Patched from the original: the length is checked against the bytes left before
	// allocating, so a forged length fails like a short read without the allocation.
	n, err := r.dec.DecodeBytesLen()
	if err != nil {
		r.fail(field, err)
		return nil
	}
	if n == -1 {
		return nil
	}
	if n > r.rd.Len() {
		r.fail(field, io.ErrUnexpectedEOF)
		return nil
	}
	v := make([]byte, n)
	if err := r.dec.ReadFull(v); err != nil {
		r.fail(field, err)
		return nil
	}
	return v
}

// headers is not in the original (task_submitted v2 came later): the same rules as the
// hand-written decoder's, on msgpack's Decoder.
func (r *refDecoder) headers(field string) map[string]string {
	if !r.next(field) {
		return nil
	}
	n, err := r.dec.DecodeMapLen()
	if err != nil {
		r.fail(field, err)
		return nil
	}
	if n <= 0 {
		return nil
	}
	if n > MaxHeaders {
		r.fail(field, fmt.Errorf("%d entries is more than %d", n, MaxHeaders))
		return nil
	}
	h := make(map[string]string, n)
	prev := ""
	for i := range n {
		k, err := r.dec.DecodeString()
		if err != nil {
			r.fail(field, err)
			return nil
		}
		v, err := r.dec.DecodeString()
		if err != nil {
			r.fail(field, err)
			return nil
		}
		if i > 0 && k <= prev {
			r.fail(field, fmt.Errorf("key %q is not after %q", k, prev))
			return nil
		}
		prev = k
		h[k] = v
	}
	return h
}

func (r *refDecoder) f64(field string) float64 {
	if !r.next(field) {
		return 0
	}
	v, err := r.dec.DecodeFloat64()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *refDecoder) bool(field string) bool {
	if !r.next(field) {
		return false
	}
	v, err := r.dec.DecodeBool()
	if err != nil {
		r.fail(field, err)
	}
	return v
}

func (r *refDecoder) header(h *Header) {
	h.Seq = r.u64("seq", 1<<64-1)
	h.SessionID = r.str("session_id")
	h.At = r.i64("at")
}

func (r *refDecoder) outcome(field string, o *Outcome) {
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
func (r *refDecoder) skipRest(field string) {
	for r.err == nil && r.left > 0 {
		r.left--
		if err := r.dec.Skip(); err != nil {
			r.fail(field, err)
		}
	}
}

// refDecode is Decode as first written, on msgpack's Decoder (commit fd9b309), kept as
// the reference the hand-written decoder is checked against. Decode decodes one event. seq is the log position the bytes were read at (0 when unknown);
// it is named in errors and, when non-zero, must equal the sequence inside the event.
//
// Decode never panics on any input: truncated, corrupt, unknown-type or unknown-version bytes
// give a *DecodeError that names the field or envelope part.
func refDecode(b []byte, seq uint64) (ev Event, err error) {
	t, body, envErr := openEnvelope(b, seq)
	if envErr != nil {
		return nil, envErr
	}

	// Patched from the original: a fresh decoder each time. A pooled one keeps msgpack's
	// read buffer, which a forged string length grows by 1 MiB a time, for good.
	r := newRefDecoder()
	r.rd.Reset(body)
	r.dec.Reset(r.rd)
	r.err, r.seq, r.typ = nil, seq, t
	ver := b[2] // openEnvelope checked it
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
		if ver >= 2 {
			e.Priority = r.i64("priority")
			e.Headers = r.headers("headers")
		}
		if ver >= 3 {
			e.Schedule = r.str("schedule")
			e.Tick = r.i64("tick")
			e.ScheduleNext = r.i64("schedule_next")
		}
		ev = e
	case TypeTaskClaimed:
		e := &TaskClaimed{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.LeaseToken = r.str("lease_token")
		e.LeaseExpiresAt = r.i64("lease_expires_at")
		if ver >= 2 {
			e.Worker = r.str("worker")
		}
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
		if ver >= 2 {
			e.Worker = r.str("worker")
		}
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
	case TypeTaskExtended: // added with the type, after fd9b309, in the same style
		e := &TaskExtended{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.LeaseExpiresAt = r.i64("lease_expires_at")
		ev = e
	case TypeTaskReleased: // added with the type, after fd9b309, in the same style
		e := &TaskReleased{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Attempt = uint32(r.u64("attempt", 1<<32-1))
		e.RunAt = r.i64("run_at")
		e.Reason = r.str("reason")
		ev = e
	case TypeTaskRetried: // added with the type, in the same style
		e := &TaskRetried{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.Attempts = uint32(r.u64("attempts", 1<<32-1))
		e.RunAt = r.i64("run_at")
		ev = e
	case TypeKindPolicySet: // added with the type, in the same style
		e := &KindPolicySet{}
		r.header(&e.Header)
		e.Kind = r.str("kind")
		e.Paused = r.bool("paused")
		e.MaxRunning = r.i64("max_running")
		e.Rate = r.f64("rate")
		e.Burst = r.i64("burst")
		if ver >= 2 {
			e.FairSessions = r.bool("fair_sessions")
			e.MaxRunningPerSession = r.i64("max_running_per_session")
		}
		ev = e
	case TypeScheduleSet: // added with the type, in the same style
		e := &ScheduleSet{}
		r.header(&e.Header)
		e.Name = r.str("name")
		e.Cron = r.str("cron")
		e.TimeZone = r.str("time_zone")
		e.Catchup = uint8(r.u64("catchup", 1))
		e.Kind = r.str("kind")
		e.Input = r.bin("input")
		e.Priority = r.i64("priority")
		e.Headers = r.headers("headers")
		e.WakeOnCompletion = r.bool("wake_on_completion")
		e.From = r.i64("from")
		e.Next = r.i64("next")
		ev = e
	case TypeScheduleRemoved:
		e := &ScheduleRemoved{}
		r.header(&e.Header)
		e.Name = r.str("name")
		ev = e
	case TypeTaskSubmitRejected: // added with the type, in the same style
		e := &TaskSubmitRejected{}
		r.header(&e.Header)
		e.TaskID = r.str("task_id")
		e.IdempotencyKey = r.str("idempotency_key")
		e.Field = r.str("field")
		e.Kind = r.str("kind")
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
