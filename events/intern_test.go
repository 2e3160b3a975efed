package events

import (
	"fmt"
	"sync"
	"testing"
)

// TestDecodeConcurrentShared decodes, from several goroutines at once, events whose sessions
// and kinds repeat (the shared strings of internTable hit) and events whose sessions never do
// (they thrash its slots): every event decodes to itself. Run with -race.
func TestDecodeConcurrentShared(t *testing.T) {
	g := newGen(7)
	types := AllTypes()
	var evs []Event
	var encs [][]byte
	for i := range 4000 {
		ev := g.event(types[i%len(types)], uint64(i+1))
		if _, ok := ev.(*KindPolicySet); ok {
			// a kind's event has no session
		} else if i%2 == 0 {
			ev.Head().SessionID = fmt.Sprintf("sess_%d", i%5)
			if e, ok := ev.(*TaskSubmitted); ok {
				e.Kind = "email.send"
			}
		} else {
			ev.Head().SessionID = fmt.Sprintf("sess_once_%d", i)
		}
		evs = append(evs, ev)
		encs = append(encs, mustEncode(t, ev))
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for k := range encs {
				i := (k + w*997) % len(encs)
				got, err := Decode(encs[i], uint64(i+1))
				if err != nil {
					t.Errorf("Decode %d: %v", i, err)
					return
				}
				if !eventsEqual(got, evs[i]) {
					t.Errorf("event %d:\n got  %#v\n want %#v", i, got, evs[i])
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestDecodeStringsIndependent: the strings of one event share an allocation, its byte
// strings do not: changing or growing a decoded Input, Payload or Output changes nothing else.
func TestDecodeStringsIndependent(t *testing.T) {
	ev := &WakeRecorded{Header: Header{Seq: 1, SessionID: "session"}, WakeID: "wake", Payload: []byte("payload"),
		IdempotencyKey: "key", TaskID: "task",
		Outcome: Outcome{State: StateSucceeded, Summary: "summary", Output: []byte("output"), Error: "error"}}
	got, err := Decode(mustEncode(t, ev), 1)
	if err != nil {
		t.Fatal(err)
	}
	w := got.(*WakeRecorded)
	for _, b := range [][]byte{w.Payload, w.Outcome.Output} {
		for i := range b {
			b[i] = 'X'
		}
		_ = append(b, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"...)
	}
	if w.SessionID != "session" || w.WakeID != "wake" || w.IdempotencyKey != "key" || w.TaskID != "task" ||
		w.Outcome.Summary != "summary" || w.Outcome.Error != "error" ||
		string(w.Payload) != "XXXXXXX" || string(w.Outcome.Output) != "XXXXXX" {
		t.Errorf("decoded event changed: %#v", w)
	}
}
