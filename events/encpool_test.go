package events

import (
	"bytes"
	"testing"
)

// An encoder whose buffer grew for a large event does not go back to the pool: a pooled
// buffer keeps its capacity, so one 64 MiB input stayed alive in the pool until the garbage
// collector emptied it (TestLargeValueMemory in work measures what that cost).
func TestEncoderPoolDropsLargeBuffers(t *testing.T) {
	ev := &TaskSubmitted{
		Header: Header{Seq: 1, SessionID: "s", At: 1},
		TaskID: "t", Kind: "k", Input: bytes.Repeat([]byte("x"), 1<<20),
	}
	if _, err := Append(nil, ev); err != nil {
		t.Fatal(err)
	}
	// Several gets: whatever the pool holds must be small.
	var got []*encoder
	for range 4 {
		w := encPool.Get().(*encoder)
		got = append(got, w)
		if c := w.buf.Cap(); c > maxPooledEncoder {
			t.Errorf("the pool holds an encoder with a %d-byte buffer, above %d", c, maxPooledEncoder)
		}
	}
	for _, w := range got {
		encPool.Put(w)
	}
}
