package worktest

import (
	"errors"
	"strings"
	"time"

	"github.com/worklog/worklog/work"
)

// wakeScenarios cover direct wakes and acknowledgment.
func wakeScenarios() []scenario {
	return []scenario{
		{"wake/idempotency", wakeIdempotency},
		{"wake/payload_is_stored_as_given_and_nil_is_null", wakePayloadAsGiven},
		{"wake/ack_of_an_unknown_wake", wakeAckUnknown},
		{"wake/ack_ignores_lease_expiry_and_repeats", wakeAckRules},
		{"wake/stale_acks_are_fenced", wakeStaleAcks},
		{"wake/claim_order", wakeClaimOrder},
	}
}

func wakeIdempotency(e *env) {
	const s = "session_wake_keys"
	req := work.WakeRequest{Payload: js(`{"x":1,"y":[1,2]}`), IdempotencyKey: "k"}
	w := e.wake(s, req, at(100))
	n := e.logLen()
	same := e.wake(s, work.WakeRequest{Payload: js(` { "y" : [1, 2], "x" : 1 } `), IdempotencyKey: "k"}, at(200))
	if same.ID != w.ID {
		e.t.Fatalf("an equal payload made wake %s, want %s", same.ID, w.ID)
	}
	e.eqTime("CreatedAt of the repeated wake", same.CreatedAt, at(100))
	e.eqJSON("payload of the repeated wake", same.Reason.Payload, `{"x":1,"y":[1,2]}`)
	e.nothingAppended("an idempotent wake", n)

	for _, differ := range []string{`{"x":2,"y":[1,2]}`, `{"x":1.0,"y":[1,2]}`, `{"x":1}`, `null`} {
		err := e.wakeErr(s, work.WakeRequest{Payload: js(differ), IdempotencyKey: "k"}, at(201))
		e.wantErr("payload "+differ, err, work.ErrIdempotencyConflict)
		var we *work.Error
		if !errors.As(err, &we) {
			e.t.Fatalf("errors.As finds no *work.Error in %v", err)
		}
		if we.Key != "k" {
			e.t.Errorf("conflict names key %q, want k", we.Key)
		}
		if we.Field != "payload" || we.ID != w.ID {
			e.t.Errorf("wake conflict names field %q, wake %q; want payload, %s", we.Field, we.ID, w.ID)
		}
		e.wantText("wake conflict", err, "idempotency key was reused for different work: k (payload differs from "+w.ID+")")
	}
	e.wantErr("a nil payload vs an object", e.wakeErr(s, work.WakeRequest{IdempotencyKey: "k"}, at(201)),
		work.ErrIdempotencyConflict)
	e.nothingAppended("conflicting wakes", n)

	// An acknowledged wake is still what its key names, and is not delivered again.
	d := e.claimWakeOne(at(200))
	e.ok("ack", e.ack(d, at(200)))
	if again := e.wake(s, req, at(300)); again.ID != w.ID {
		e.t.Errorf("the key of an acknowledged wake made %s", again.ID)
	}
	e.claimWakeNone(at(300))

	// nil and explicit null payloads are equal; without a key nothing is deduplicated.
	nw := e.wake(s, work.WakeRequest{IdempotencyKey: "k-nil"}, at(100))
	if got := e.wake(s, work.WakeRequest{Payload: js(`null`), IdempotencyKey: "k-nil"}, at(101)); got.ID != nw.ID {
		e.t.Error("an explicit null payload did not equal a nil one")
	}
	keyless := work.WakeRequest{Payload: req.Payload}
	a, b := e.wake(s, keyless, at(100)), e.wake(s, keyless, at(100))
	if a.ID == b.ID {
		e.t.Error("wakes without a key were deduplicated")
	}
}

func wakePayloadAsGiven(e *env) {
	const s = "session_payload"
	p := `{ "b" : 1,  "a" : [true, null] }`
	w := e.wake(s, work.WakeRequest{Payload: js(p)}, at(100))
	e.eqJSON("recorded payload", w.Reason.Payload, p)
	nw := e.wake(s, work.WakeRequest{}, at(101))
	e.eqJSON("nil payload", nw.Reason.Payload, "null")
	ds := e.claimWakes(at(101), lease, 10)
	if len(ds) != 2 || ds[0].Wake.ID != w.ID || ds[1].Wake.ID != nw.ID {
		e.t.Fatalf("claimed %d wakes", len(ds))
	}
	e.eqJSON("delivered payload", ds[0].Wake.Reason.Payload, p)
	e.eqJSON("delivered nil payload", ds[1].Wake.Reason.Payload, "null")
	e.eqTime("delivered CreatedAt", ds[0].Wake.CreatedAt, at(100))
	if ds[0].Wake.Reason.Outcome != nil || ds[0].Wake.Reason.TaskID != "" {
		e.t.Errorf("a direct wake carries task data: %+v", ds[0].Wake.Reason)
	}
}

func wakeAckUnknown(e *env) {
	e.wake("session_ack", work.WakeRequest{}, at(100))
	n := e.logLen()
	forged := work.NewWakeDelivery(work.Wake{ID: "wake_missing", SessionID: "session_ack"}, 1, at(130), "forged-token")
	err := e.ack(forged, at(101))
	we := e.wantErr("ack of an unknown wake", err, work.ErrStaleDelivery)
	if we.ID != "wake_missing" {
		e.t.Errorf("stale id %q", we.ID)
	}
	e.wantText("ack of an unknown wake", err, "delivery no longer owns wake_missing")
	e.nothingAppended("ack of an unknown wake", n)
}

func wakeAckRules(e *env) {
	const s = "session_ack"
	w := e.wake(s, work.WakeRequest{Payload: js(`1`)}, at(100))
	d := e.claimWakeOne(at(100)) // claimable at once, at its creation time
	if d.Wake.ID != w.ID || d.Attempt != 1 {
		e.t.Fatalf("claimed %s attempt %d", d.Wake.ID, d.Attempt)
	}
	// The lease expired long ago but nobody claimed the wake again: the ack still counts.
	e.ok("late ack", e.ack(d, at(1000)))
	n := e.logLen()
	e.ok("repeated ack", e.ack(d, at(1001)))
	e.ok("repeated ack without a time", e.q.AckWake(e.ctx, d))
	e.nothingAppended("repeated acks", n)
	e.claimWakeNone(at(1000))
	e.claimWakeNone(at(100000))

	for what, f := range map[string]work.WakeDelivery{
		"a forged token":        work.NewWakeDelivery(d.Wake, 1, d.LeaseExpiresAt, "forged-token"),
		"an attempt never made": work.NewWakeDelivery(d.Wake, 2, d.LeaseExpiresAt, "forged-token"),
	} {
		err := e.ack(f, at(1002))
		we := e.wantErr("ack by "+what, err, work.ErrStaleDelivery)
		if we.ID != w.ID {
			e.t.Errorf("ack by %s: stale id %q", what, we.ID)
		}
	}
	e.ok("the genuine ack after forged ones", e.ack(d, at(1003)))
}

func wakeStaleAcks(e *env) {
	const s = "session_stale_ack"
	w := e.wake(s, work.WakeRequest{}, at(100))
	d1 := e.claimWakeOne(at(100))
	d2 := e.claimWakeOne(at(130))
	for what, f := range map[string]work.WakeDelivery{
		"the superseded attempt":   d1,
		"a forged token":           work.NewWakeDelivery(d2.Wake, 2, d2.LeaseExpiresAt, "forged-token"),
		"an empty token":           work.NewWakeDelivery(d2.Wake, 2, d2.LeaseExpiresAt, ""),
		"the old token, attempt 2": work.NewWakeDelivery(d2.Wake, 2, d2.LeaseExpiresAt, d1.LeaseToken()),
		"attempt 0":                work.NewWakeDelivery(d2.Wake, 0, d2.LeaseExpiresAt, d2.LeaseToken()),
	} {
		we := e.wantErr("ack by "+what, e.ack(f, at(131)), work.ErrStaleDelivery)
		if we.ID != w.ID {
			e.t.Errorf("ack by %s: stale id %q", what, we.ID)
		}
	}
	// None of them released the claim: the wake is not delivered before d2's lease ends.
	e.claimWakeNone(at(159))
	e.ok("ack of the current attempt", e.ack(d2, at(140)))
	e.wantErr("the superseded attempt after the ack", e.ack(d1, at(141)), work.ErrStaleDelivery)
	e.claimWakeNone(at(10000))
}

func wakeClaimOrder(e *env) {
	const s = "session_wake_order"
	w1 := e.wake(s, work.WakeRequest{Payload: js(`1`)}, at(200)).ID
	w2 := e.wake(s, work.WakeRequest{Payload: js(`2`)}, at(100)).ID // recorded later, created earlier
	w3 := e.wake(s, work.WakeRequest{Payload: js(`3`)}, at(100)).ID // ties with w2: record order
	names := map[string]string{w1: "w1", w2: "w2", w3: "w3"}

	one := func(now time.Time, leaseFor time.Duration) string {
		e.t.Helper()
		ds := e.claimWakes(now, leaseFor, 1)
		if len(ds) != 1 {
			e.t.Fatalf("ClaimWakesAt(%v) claimed %d", now, len(ds))
		}
		return names[ds[0].Wake.ID]
	}
	got := []string{one(at(300), lease), one(at(310), 50*time.Second), one(at(320), 100*time.Second)}
	if strings.Join(got, " ") != "w2 w3 w1" {
		e.t.Errorf("first claims %v, want [w2 w3 w1]", got)
	}
	// Leases: w2 until 330, w3 until 360, w1 until 420; w4 is created at 380.
	w4 := e.wake(s, work.WakeRequest{Payload: js(`4`)}, at(380)).ID
	names[w4] = "w4"
	got = nil
	for _, d := range e.claimWakes(at(500), lease, 10) {
		got = append(got, names[d.Wake.ID])
	}
	if strings.Join(got, " ") != "w2 w3 w4 w1" {
		e.t.Errorf("claims after expiry %v, want [w2 w3 w4 w1]", got)
	}
}
