package inspect

import (
	"errors"
	"testing"
)

// TestEachEvent: a packed batch gives back its events in order; a batch that is cut short,
// claims more bytes than it holds, or sends a sequence not above the one before (in it or in
// the batch before) is refused, and fn sees nothing past the fault.
func TestEachEvent(t *testing.T) {
	var b []byte
	b = appendEvent(b, 5, []byte("five"))
	b = appendEvent(b, 6, nil)
	b = appendEvent(b, 9, []byte("nine"))
	var got []string
	last, err := eachEvent(b, 4, func(seq uint64, raw []byte) error {
		got = append(got, string(rune('0'+seq))+":"+string(raw))
		return nil
	})
	if err != nil || last != 9 || len(got) != 3 || got[0] != "5:five" || got[1] != "6:" || got[2] != "9:nine" {
		t.Fatalf("eachEvent = %v, %d, %v", got, last, err)
	}
	for name, c := range map[string]struct {
		b     []byte
		after uint64
	}{
		"cut short":           {b[:len(b)-1], 4},
		"no length":           {b[:1], 4},
		"repeated across":     {b, 5},
		"repeated within":     {appendEvent(appendEvent(nil, 7, nil), 7, nil), 0},
		"length past the end": {append(appendEvent(nil, 1, nil)[:1], 0xff, 0x01), 0},
	} {
		n := 0
		_, err := eachEvent(c.b, c.after, func(uint64, []byte) error { n++; return nil })
		if !errors.Is(err, errBadBatch) {
			t.Errorf("%s: %v, want errBadBatch", name, err)
		}
		if name == "repeated across" && n != 0 {
			t.Errorf("%s: fn saw %d events before the fault", name, n)
		}
	}
}
