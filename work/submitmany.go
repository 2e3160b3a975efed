package work

import (
	"context"
	"fmt"
	"time"

	engineapi "github.com/worklog/worklog/internal/engine"
)

// MaxSubmitMany is the most requests one SubmitMany takes.
const MaxSubmitMany = 10000

// MaxSubmitManyBytes is the most bytes one SubmitMany takes, on every backend: the sum over
// its requests of each one's input, kind, idempotency key, and headers' keys and values.
// Each request keeps its own limits besides (an input at most the queue's MaxValueBytes).
// A batch of this size succeeds on every backend (NewInMemory, Open's Pebble store,
// PostgreSQL) with the process's peak memory growing by at most 4x its bytes, the caller's
// own requests included.
const MaxSubmitManyBytes = 64 << 20

// requestBytes is what r counts toward MaxSubmitManyBytes: the bytes of its input, kind,
// idempotency key and headers (each key and value), what the stored task holds of the
// request beyond fixed-size fields. Invalid requests count too: the limit bounds what the
// caller hands over, checked before anything else.
func requestBytes(r *TaskRequest) int {
	n := len(r.Input) + len(r.Kind) + len(r.IdempotencyKey)
	for k, v := range r.Headers {
		n += len(k) + len(v)
	}
	return n
}

// SubmitResult is what one request of SubmitMany did: the task, or this request's error.
type SubmitResult struct {
	Task Task
	Err  error // nil, or this item's error (e.g. ErrIdempotencyConflict); the others still apply
}

// SubmitMany submits a batch at the queue's clock's time.
func (s *Session) SubmitMany(ctx context.Context, rs []TaskRequest) ([]SubmitResult, error) {
	return s.SubmitManyAt(ctx, rs, s.q.now())
}

// SubmitManyAt submits rs as if each were given to SubmitAt, one after another in order, in
// one atomic, durable step: one fsync on a queue from Open, one transaction on PostgreSQL.
// It returns one result per request, in order, each exactly what SubmitAt would have
// answered: a new task, the task an equal request with the same key made (earlier in the
// batch too: a key repeated in the batch names the first request's task), or this request's
// own error (ErrInvalidRequest for a request SubmitAt would refuse, ErrIdempotencyConflict),
// while the others still apply. Every task of the batch has now as its submit time. A
// result's Task.Input longer than 4 KiB may share the bytes of its request's Input (the
// store copied them: the caller may change them afterwards, and no read changes).
//
// The batch is one command of the queue's single writer: a call queued behind it (a Submit
// of another goroutine) waits for the batch's write, so for about as long as the batch
// itself takes, which MaxSubmitManyBytes bounds. Larger sets go in several batches.
//
// The error is for the batch as a whole, and then nothing was recorded: an empty rs, more
// than MaxSubmitMany requests or more than MaxSubmitManyBytes bytes (ErrInvalidRequest,
// field "requests", checked before the store is touched), a blank session, a now out of
// range, a context that ended, a store that failed.
func (s *Session) SubmitManyAt(ctx context.Context, rs []TaskRequest, now time.Time) ([]SubmitResult, error) {
	if err := s.q.begin(ctx); err != nil {
		return nil, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return nil, err
	}
	switch {
	case len(rs) == 0:
		return nil, invalid("requests", "must not be empty")
	case len(rs) > MaxSubmitMany:
		return nil, invalid("requests", fmt.Sprintf("has %d requests, more than the limit of %d", len(rs), MaxSubmitMany))
	}
	size := 0
	for i := range rs {
		size += requestBytes(&rs[i])
	}
	if size > MaxSubmitManyBytes {
		return nil, invalid("requests", fmt.Sprintf("has %d bytes (inputs, kinds, keys, headers), more than the limit of %d", size, MaxSubmitManyBytes))
	}
	if _, err := nanos("now", now); err != nil {
		return nil, err
	}
	sb, serr := s.q.sessionOps()
	if serr != nil {
		return nil, serr
	}
	// Each request is validated as SubmitAt validates it; an invalid one gets its error and
	// is not passed on (the backend sees the valid ones, in order).
	out := make([]SubmitResult, len(rs))
	valid := make([]TaskRequest, 0, len(rs))
	index := make([]int, 0, len(rs))
	for i := range rs {
		r := rs[i]
		if err := validateTaskRequest(&r, s.q.maxValue); err != nil {
			out[i].Err = err
			continue
		}
		valid = append(valid, r)
		index = append(index, i)
	}
	if len(valid) == 0 {
		return out, nil
	}
	res, err := sb.SubmitMany(ctx, s.id, valid, now)
	if err != nil {
		return nil, wrap(err)
	}
	if len(res) != len(valid) {
		return nil, backendErr(fmt.Errorf("work: SubmitMany returned %d results for %d requests", len(res), len(valid)))
	}
	for j, i := range index {
		out[i] = SubmitResult{Task: res[j].Task, Err: wrapItem(res[j].Err)}
	}
	return out, nil
}

// wrapItem is wrap for one item's error (nil stays nil).
func wrapItem(err error) error {
	if err == nil {
		return nil
	}
	return wrap(err)
}

// SubmitMany is the batch command: every request's submit is decided in one Update, so the
// batch is one command of the engine (one Pebble batch under one fsync, one PostgreSQL
// transaction), and each request sees the ones before it, as separate submits would.
func (b *logBackend) SubmitMany(ctx context.Context, sessionID string, rs []TaskRequest, now time.Time) ([]SubmitResult, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return nil, verr
	}
	ids := make([]string, len(rs))
	if err := b.ids.ids("task", at, ids); err != nil {
		return nil, backendErr(err)
	}
	ps := make([]preparedSubmit, len(rs))
	inputs := make([][]byte, len(rs))
	for i := range rs {
		p, err := prepareRequest(&rs[i])
		if err != nil {
			return nil, err
		}
		p.newID = ids[i]
		ps[i] = p
		inputs[i] = rs[i].Input
	}
	release, staged, serr := b.stage(inputs...)
	if serr != nil {
		return nil, serr
	}
	defer release()
	for i := range ps {
		ps[i].input = b.ownInput(rs[i].Input, staged)
		ps[i].borrowed = len(rs[i].Input) > 0 && &ps[i].input[0] == &rs[i].Input[0]
	}
	var keys []string
	size := 0
	for i := range rs {
		if k := rs[i].IdempotencyKey; k != "" {
			keys = append(keys, k)
		}
		if len(rs[i].Input) < stageMin || !staged { // a staged input is a reference in the batch
			size += requestBytes(&rs[i])
		} else {
			size += requestBytes(&rs[i]) - len(rs[i].Input)
		}
	}
	out := make([]SubmitResult, len(rs))
	err := b.update(ctx, func(tx txn) error {
		if err := prefetchNewTaskKeys(tx, sessionID, keys); err != nil {
			return err
		}
		if r, ok := engineTxn(tx).(engineapi.SubmitReserver); ok {
			r.ReserveSubmits(len(ps), size)
		}
		for i := range ps { // fn may run twice: every result is set afresh
			t, derr, err := b.submitIn(tx, sessionID, &ps[i], at)
			if err != nil {
				return err
			}
			out[i] = SubmitResult{Task: t, Err: derr}
		}
		return nil
	})
	if err != nil {
		return nil, backendErr(err)
	}
	return out, nil
}

// prefetchNewTaskKeys tells tx's engine the keys a batch is about to look up, when its
// transaction reads them cheaper together (engineapi.NewKeyPrefetcher: PostgreSQL read
// each key of a batch in a round trip of its own under the log head's lock).
func prefetchNewTaskKeys(tx txn, sessionID string, keys []string) error {
	if len(keys) < 2 {
		return nil
	}
	if p, ok := engineTxn(tx).(engineapi.NewKeyPrefetcher); ok {
		return p.PrefetchNewTaskKeys(sessionID, keys)
	}
	return nil
}
