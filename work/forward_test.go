package work

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestForwardedErrorsKeepTheirKind: an error crosses processes as its kind and fields, so
// errors.Is and errors.As work on the sender as on a local call; an ErrBackend error keeps
// its message and loses its cause: the elected process's ErrClosed or ctx error must not
// read, on the sender, as its own queue closed or its own ctx ended.
func TestForwardedErrorsKeepTheirKind(t *testing.T) {
	cases := []error{
		invalid("output", "not JSON"),
		notFound("t1"),
		conflict("k", "input", "t2"),
		&Error{Kind: ErrStaleDelivery, ID: "t3"},
		&Error{Kind: ErrInvalidTransition, Message: "settled"},
	}
	for _, want := range cases {
		var a fwdAnswer
		a.Err = toFwdError(want)
		b, err := encodeForward(&a)
		if err != nil {
			t.Fatal(err)
		}
		var back fwdAnswer
		if err := decodeForward(b, &back); err != nil {
			t.Fatal(err)
		}
		got := back.Err.err()
		var we, ge *Error
		errors.As(want, &we)
		if !errors.As(got, &ge) || ge.Kind != we.Kind || ge.Field != we.Field || ge.ID != we.ID || ge.Key != we.Key ||
			ge.Message != we.Message || got.Error() != want.Error() {
			t.Errorf("%v came back as %#v", want, got)
		}
	}
	for _, cause := range []error{ErrClosed, context.Canceled, context.DeadlineExceeded, errors.New("disk on fire")} {
		got := toFwdError(backendErr(cause)).err()
		if !errors.Is(got, ErrBackend) || errors.Is(got, ErrClosed) || errors.Is(got, context.Canceled) ||
			errors.Is(got, context.DeadlineExceeded) {
			t.Errorf("ErrBackend of %v came back as %v", cause, got)
		}
	}
	if got := toFwdError(errors.New("plain")).err(); !errors.Is(got, ErrBackend) {
		t.Errorf("a plain error came back as %v", got)
	}
}

// TestForwardedRoundRefusedUnread: a round of another version, or bytes that are not a
// round, are refused before anything runs (the sender then runs the round itself).
func TestForwardedRoundRefusedUnread(t *testing.T) {
	b := &logBackend{}
	for _, req := range [][]byte{nil, {}, {forwardVersion + 1, 0x90}, {forwardVersion, 0xc1}} {
		if _, err := b.serveForwarded(context.Background(), req); !errors.Is(err, errForwardRefused) {
			t.Errorf("round %x: %v, want errForwardRefused", req, err)
		}
	}
	// A round's deliveries keep their lease tokens and times across the wire.
	r := fwdRound{Settles: []fwdSettle{{Delivery: toFwdDelivery(TaskDelivery{Task: Task{ID: "t"}, Attempt: 2,
		LeaseExpiresAt: time.Unix(5, 6), leaseToken: "secret"})}}, Now: time.Unix(7, 8), LeaseFor: time.Minute, Limit: 3}
	enc, err := encodeForward(&r)
	if err != nil {
		t.Fatal(err)
	}
	var back fwdRound
	if err := decodeForward(enc, &back); err != nil {
		t.Fatal(err)
	}
	d := back.Settles[0].Delivery.delivery()
	if d.LeaseToken() != "secret" || d.Attempt != 2 || !d.LeaseExpiresAt.Equal(time.Unix(5, 6)) || !back.Now.Equal(time.Unix(7, 8)) ||
		back.LeaseFor != time.Minute || back.Limit != 3 || d.Task.ID != "t" {
		t.Fatalf("round came back as %+v (delivery %+v)", back, d)
	}
}
