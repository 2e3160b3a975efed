package work

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// A worker's round run by another process (engineapi.Forwarder, PostgreSQL's shared writer):
// SettleAndClaim's arguments go to the elected process as bytes, its logBackend runs them
// exactly as a local call would (the same validation, decide code and group commit), and the
// answer comes back as bytes. The encoding is private to this file and versioned: a process
// that cannot read a round (another version) refuses it before running anything, and the
// sender runs it itself. Nothing of it is stored: it is not the log's wire format.

// forwardVersion is the first byte of every forwarded round and answer. Version 2 added
// fwdResult.Seq (an array-encoded struct does not decode with another number of fields).
const forwardVersion = 2

// errForwardRefused is the answer of a process that did not run a round (it is closing, or
// cannot read it): the sender runs the round itself.
var errForwardRefused = errors.New("work: the round was not run")

type fwdDelivery struct {
	Task           Task
	Attempt        uint32
	LeaseExpiresAt time.Time
	Worker         string
	Token          string
}

type fwdSettle struct {
	Delivery fwdDelivery
	Outcome  *Outcome
	Release  *ReleaseRequest
}

type fwdRound struct {
	Settles  []fwdSettle
	Kinds    []string
	Now      time.Time
	LeaseFor time.Duration
	Limit    int
	Worker   string
	Wait     time.Duration // the sender's ctx: how long it still waits (0: no deadline)
}

// fwdError is an *Error without its cause, which does not cross processes: an ErrBackend
// error of the process that ran the round is the sender's ErrBackend with its message.
type fwdError struct {
	Kind                    int8 // 1 + the index in errorKinds
	Field, ID, Key, Message string
}

type fwdResult struct {
	Task Task
	Err  *fwdError
	Seq  uint64
}

type fwdAnswer struct {
	Results []fwdResult
	Claimed []fwdDelivery
	Err     *fwdError
}

var errorKinds = [...]error{ErrInvalidRequest, ErrTaskNotFound, ErrIdempotencyConflict, ErrStaleDelivery, ErrInvalidTransition, ErrBackend}

func toFwdDelivery(d TaskDelivery) fwdDelivery {
	return fwdDelivery{Task: d.Task, Attempt: d.Attempt, LeaseExpiresAt: d.LeaseExpiresAt, Worker: d.Worker, Token: d.leaseToken}
}

func (d *fwdDelivery) delivery() TaskDelivery {
	return TaskDelivery{Task: d.Task, Attempt: d.Attempt, LeaseExpiresAt: d.LeaseExpiresAt, Worker: d.Worker, leaseToken: d.Token}
}

func toFwdError(err error) *fwdError {
	if err == nil {
		return nil
	}
	var we *Error
	if !errors.As(err, &we) {
		return &fwdError{Kind: int8(len(errorKinds)), Message: err.Error()}
	}
	for i, k := range errorKinds {
		if we.Kind == k {
			return &fwdError{Kind: int8(i + 1), Field: we.Field, ID: we.ID, Key: we.Key, Message: we.Message}
		}
	}
	return &fwdError{Kind: int8(len(errorKinds)), Message: err.Error()}
}

func (e *fwdError) err() error {
	if e == nil {
		return nil
	}
	if e.Kind < 1 || int(e.Kind) > len(errorKinds) || errorKinds[e.Kind-1] == ErrBackend {
		msg := "the shared writer failed: " + e.Message
		return &Error{Kind: ErrBackend, Message: msg, cause: errors.New(msg)}
	}
	return &Error{Kind: errorKinds[e.Kind-1], Field: e.Field, ID: e.ID, Key: e.Key, Message: e.Message}
}

func encodeForward(v any) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte(forwardVersion)
	enc := msgpack.NewEncoder(&buf)
	enc.UseArrayEncodedStructs(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decodeForward(b []byte, v any) error {
	if len(b) == 0 || b[0] != forwardVersion {
		return fmt.Errorf("%w: unknown version", errForwardRefused)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(b[1:]))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", errForwardRefused, err)
	}
	return nil
}

// forwarding reports whether a round may go to the engine's elected process now: checked
// before anything is encoded.
func (b *logBackend) forwarding() bool { return b.caps.forward != nil && b.caps.forward.CanForward() }

// forwardRound offers the round to the engine's elected process. ok false: run it here.
func (b *logBackend) forwardRound(ctx context.Context, settles []Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) (res []SettleResult, claimed []TaskDelivery, err error, ok bool) {
	if !b.forwarding() {
		return nil, nil, nil, false
	}
	r := fwdRound{Kinds: kinds, Now: now, LeaseFor: leaseFor, Limit: limit, Worker: workerOf(ctx)}
	if dl, has := ctx.Deadline(); has {
		if r.Wait = time.Until(dl); r.Wait <= 0 {
			return nil, nil, backendErr(context.DeadlineExceeded), true
		}
	}
	r.Settles = make([]fwdSettle, len(settles))
	for i, s := range settles {
		r.Settles[i] = fwdSettle{Delivery: toFwdDelivery(s.Delivery), Outcome: s.Outcome, Release: s.Release}
	}
	req, eerr := encodeForward(&r)
	if eerr != nil {
		return nil, nil, nil, false
	}
	resp, sent, ferr := b.caps.forward.Forward(ctx, req)
	if !sent {
		return nil, nil, nil, false
	}
	if ferr == nil {
		var a fwdAnswer
		if derr := decodeForward(resp, &a); derr != nil {
			ferr = fmt.Errorf("the shared writer's answer: %v", derr) // it ran there; the answer is lost
		} else {
			return answerOf(&a, len(settles))
		}
	}
	if ctx.Err() != nil {
		return nil, nil, backendErr(ferr), true
	}
	// The round was sent and its answer lost (the connection failed): it may have committed
	// there, or not, or may still commit. It is resolved here, as a lost COMMIT is from its
	// commit mark: the round runs again in this process, whose writer takes the log head after
	// any commit of the elected process's. A settle that committed there is found in the
	// task's state (finishIn: the delivery's token settled it; releaseAgainIn), one that did
	// not commits now, and the claims are claimed here (those the lost round may have claimed
	// go back to the queue when their leases expire, as after a crash).
	res, claimed, err = b.settleAndClaimHere(ctx, settles, kinds, now, leaseFor, limit, true)
	return res, claimed, err, true
}

// answerOf is forwardRound's result for a's answer to a round of n settles.
func answerOf(a *fwdAnswer, n int) (res []SettleResult, claimed []TaskDelivery, err error, ok bool) {
	if a.Err != nil {
		return nil, nil, a.Err.err(), true
	}
	if len(a.Results) != n {
		return nil, nil, backendErr(fmt.Errorf("the shared writer answered %d settles of %d", len(a.Results), n)), true
	}
	res = make([]SettleResult, len(a.Results))
	for i := range a.Results {
		res[i] = SettleResult{Task: a.Results[i].Task, Err: a.Results[i].Err.err(), Seq: a.Results[i].Seq}
	}
	claimed = make([]TaskDelivery, len(a.Claimed))
	for i := range a.Claimed {
		claimed[i] = a.Claimed[i].delivery()
	}
	return res, claimed, nil, true
}

// forwardClaim offers a claim (ClaimDue: kinds nil; ClaimKinds) to the elected process as
// a round without settles, which claims as they do (the same scan, validation and events).
func (b *logBackend) forwardClaim(ctx context.Context, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error, bool) {
	if limit <= 0 || !b.forwarding() {
		return nil, nil, false
	}
	_, claimed, err, ok := b.forwardRound(ctx, nil, kinds, now, leaseFor, limit)
	return claimed, err, ok
}

// forwardFinish offers a Finish to the elected process as a round of one settle and no
// claim, which settles as Finish does; the settle's own error is Finish's.
func (b *logBackend) forwardFinish(ctx context.Context, d TaskDelivery, o Outcome, now time.Time) (Task, error, bool) {
	if !b.forwarding() {
		return Task{}, nil, false
	}
	res, _, err, ok := b.forwardRound(ctx, []Settle{{Delivery: d, Outcome: &o}}, nil, now, 0, 0)
	switch {
	case !ok:
		return Task{}, nil, false
	case err != nil:
		return Task{}, err, true
	case res[0].Err != nil:
		return Task{}, res[0].Err, true
	}
	return res[0].Task, nil, true
}

// serveForwarded runs a round another process sent (the engine calls it, on the elected
// process). An error: the round did not run, and its sender runs it itself.
func (b *logBackend) serveForwarded(ctx context.Context, req []byte) ([]byte, error) {
	var r fwdRound
	if err := decodeForward(req, &r); err != nil {
		return nil, err
	}
	if r.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Wait)
		defer cancel()
	}
	if r.Worker != "" {
		ctx = WithWorker(ctx, r.Worker)
	}
	settles := make([]Settle, len(r.Settles))
	for i := range r.Settles {
		s := &r.Settles[i]
		settles[i] = Settle{Delivery: s.Delivery.delivery(), Outcome: s.Outcome, Release: s.Release}
	}
	res, claimed, err := b.settleAndClaimHere(ctx, settles, r.Kinds, r.Now, r.LeaseFor, r.Limit, false)
	var a fwdAnswer
	if err != nil {
		a.Err = toFwdError(err)
	} else {
		a.Results = make([]fwdResult, len(res))
		for i := range res {
			a.Results[i] = fwdResult{Task: res[i].Task, Err: toFwdError(res[i].Err), Seq: res[i].Seq}
		}
		a.Claimed = make([]fwdDelivery, len(claimed))
		for i := range claimed {
			a.Claimed[i] = toFwdDelivery(claimed[i])
		}
	}
	return encodeForward(&a)
}
