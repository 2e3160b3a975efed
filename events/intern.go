package events

import (
	"hash/maphash"
	"sync/atomic"
)

// internTable remembers strings of one field that many events repeat (session ids, kinds),
// so that decoding the same bytes again returns the same string without copying them. It is a
// direct-mapped cache: a slot holds one string, and a string that hashes to a taken slot
// replaces it only now and then (on one sequence number in eight), so that a burst of
// one-off strings costs little and cannot evict the hot ones for long. Decoders in any number
// of goroutines share it: a slot is one atomic pointer to an immutable string.
type internTable [internSlots]atomic.Pointer[string]

const (
	internSlots  = 1 << 12 // a power of two
	internMaxLen = 128     // longer strings are not worth a slot
)

var (
	internSeed = maphash.MakeSeed()
	sessionIDs internTable // Header.SessionID
	kinds      internTable // TaskSubmitted.Kind
)

// lookup returns the string with the bytes b when the table holds it. When it does not, it
// may store a copy of b for the next events (seq decides, see internTable).
func (t *internTable) lookup(b []byte, seq uint64) (string, bool) {
	if len(b) > internMaxLen {
		return "", false
	}
	slot := &t[maphash.Bytes(internSeed, b)&(internSlots-1)]
	p := slot.Load()
	if p != nil && *p == string(b) {
		return *p, true
	}
	if p == nil || seq%8 == 0 {
		s := string(b) // its own copy: the table must not keep the rest of an event alive
		slot.Store(&s)
	}
	return "", false
}
