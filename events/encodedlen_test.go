package events

import (
	"bytes"
	"fmt"
	"testing"
)

// TestEncodedLen: EncodedLen is len(Append) for every type, with every value field at the
// lengths where msgpack's bin header changes width (and nil, which is not a bin at all), and
// ValueLen counts exactly the value bytes it leaves out.
func TestEncodedLen(t *testing.T) {
	sizes := []int{-1, 0, 1, 255, 256, 65535, 65536, 1 << 20} // -1: nil
	value := func(n int) []byte {
		if n < 0 {
			return nil
		}
		return bytes.Repeat([]byte{'a'}, n)
	}
	check := func(name string, ev Event, values int) {
		t.Helper()
		b, err := Append(nil, ev)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n, err := EncodedLen(ev)
		if err != nil || n != len(b) {
			t.Errorf("%s: EncodedLen %d, %v; Append wrote %d", name, n, err, len(b))
		}
		if got := ValueLen(ev); got != values {
			t.Errorf("%s: ValueLen %d, want %d", name, got, values)
		}
		again, _ := Append(nil, ev) // EncodedLen left the event as it was
		if !bytes.Equal(again, b) {
			t.Errorf("%s: EncodedLen changed the event", name)
		}
	}
	for _, typ := range AllTypes() {
		ev := eventOf(t, typ)
		check(typ.String(), ev, ValueLen(ev))
	}
	for _, a := range sizes {
		for _, c := range sizes {
			va, vc := max(a, 0), max(c, 0)
			name := fmt.Sprintf("%d,%d", a, c)
			check("task_submitted "+name, &TaskSubmitted{TaskID: "t", Kind: "k", Input: value(a)}, va)
			check("task_settled "+name, &TaskSettled{TaskID: "t", Outcome: Outcome{State: StateSucceeded, Output: value(a)}}, va)
			check("wake_recorded "+name, &WakeRecorded{WakeID: "w", Payload: value(a),
				Outcome: Outcome{State: StateSucceeded, Output: value(c)}}, va+vc)
		}
	}
}
