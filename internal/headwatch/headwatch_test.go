package headwatch

import (
	"sync"
	"testing"
)

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestAdvanceClosesTheChannelOfEveryEarlierLoad: a reader's channel is closed by the next
// advance, not by a lower or equal value, and a later Load gets a fresh channel.
func TestAdvanceClosesTheChannelOfEveryEarlierLoad(t *testing.T) {
	var h Head
	seq, c1 := h.Load()
	_, c2 := h.Load()
	if seq != 0 || isClosed(c1) || c1 != c2 {
		t.Fatalf("a new Head: seq %d, closed %v, shared %v", seq, isClosed(c1), c1 == c2)
	}
	h.Advance(0)
	if isClosed(c1) {
		t.Fatal("Advance to the same value closed the channel")
	}
	h.Advance(5)
	if !isClosed(c1) {
		t.Fatal("Advance did not close the channel of an earlier Load")
	}
	seq, c3 := h.Load()
	if seq != 5 || isClosed(c3) {
		t.Fatalf("after Advance(5): seq %d, channel closed %v", seq, isClosed(c3))
	}
	h.Advance(3)
	if seq, _ := h.Load(); seq != 5 || isClosed(c3) {
		t.Fatalf("Advance(3) after 5 changed the head to %d or woke readers", seq)
	}
}

// TestStopWakesAndStaysClosed: after Stop every Load's channel is closed.
func TestStopWakesAndStaysClosed(t *testing.T) {
	var h Head
	_, c := h.Load()
	h.Stop()
	if !isClosed(c) {
		t.Fatal("Stop did not wake a reader")
	}
	if _, c := h.Load(); !isClosed(c) {
		t.Fatal("a Load after Stop returned an open channel")
	}
}

// TestNoLostAdvance races readers that load and wait against a writer that advances: a
// reader that saw a value below the last one always finds its channel closed.
func TestNoLostAdvance(t *testing.T) {
	var h Head
	const last = 20000
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seq, c := h.Load()
				if seq == last {
					return
				}
				<-c // must be closed by an advance past seq: a lost one hangs the test
			}
		}()
	}
	for i := uint64(1); i <= last; i++ {
		h.Advance(i)
	}
	wg.Wait()
}
