package events

import (
	"bytes"
	"testing"
)

// A scratch buffer that grew for a large event does not go back to the pool: a pooled
// buffer keeps its capacity, so one 64 MiB input stayed alive in the pool until the garbage
// collector emptied it (TestLargeValueMemory in work measures what that cost).
func TestEncoderPoolDropsLargeBuffers(t *testing.T) {
	ev := &TaskSubmitted{
		Header: Header{Seq: 1, SessionID: "s", At: 1},
		TaskID: "t", Kind: "k", Input: bytes.Repeat([]byte("x"), 1<<20),
	}
	if _, err := Encode(ev); err != nil {
		t.Fatal(err)
	}
	// Several gets: whatever the pool holds must be small.
	var got []*[]byte
	for range 4 {
		p := scratch.Get().(*[]byte)
		got = append(got, p)
		if c := cap(*p); c > maxScratch {
			t.Errorf("the pool holds a %d-byte scratch buffer, above %d", c, maxScratch)
		}
	}
	for _, p := range got {
		scratch.Put(p)
	}
}
