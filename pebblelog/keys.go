package pebblelog

import (
	"encoding/binary"
	"slices"

	"github.com/worklog/worklog/events"
)

// Key prefixes: one byte each. Part of the store format (FormatVersion); never reuse one.
const (
	prefixMeta      = 'm' // m<name>: store metadata
	prefixEvent     = 'e' // e<seq 8B BE>: encoded event
	prefixSession   = 's' // s<uvarint len><session><seq 8B BE>: per-session event index (empty value)
	prefixTask      = 't' // t<task id>: projection.Task record
	prefixWake      = 'w' // w<wake id>: projection.Wake record
	prefixTaskKey   = 'k' // k<uvarint len><session><key>: task id
	prefixWakeKey   = 'K' // K<uvarint len><session><key>: wake id
	prefixDue       = 'd' // d<priority 8B inverted><at 8B ordered><submit seq 8B BE>: task id (format 6; before: no priority)
	prefixAvailable = 'a' // a<at 8B ordered><record seq 8B BE>: wake id

	// Format 3.
	prefixKindDue     = 'D' // D<uvarint len><kind><priority 8B inverted><at 8B ordered><submit seq 8B BE>: task id (priority: format 6)
	prefixSessionTask = 'l' // l<uvarint len><session><submit seq 8B BE>: task id
	prefixCount       = 'c' // c<uvarint len><kind><state 1B>: number of tasks, 8B BE
	prefixPrunable    = 'r' // r<at 8B ordered><seq 8B BE>: 't' or 'w', then the id: retention index
	prefixPruned      = 'p' // p<from seq 8B BE>: to seq 8B BE: a pruned range of the log
	prefixSubject     = 'x' // x<uvarint len><task or wake id><seq 8B BE>: per-subject event index (empty value)

	// Format 4.
	prefixBlob = 'b' // b<uvarint len><task or wake id><blob name>: blob index (empty value): blob.go

	// Format 5.
	prefixSessionWake = 'W' // W<uvarint len><session><at 8B ordered><record seq 8B BE>: wake id: session_wakes.go

	// Format 7 (state_kind_policies.go).
	prefixKindPolicy = 'P' // P<kind>: the kind's policy and token bucket (encodePolicy)
	prefixKindLease  = 'L' // L<uvarint len><kind><at 8B ordered><submit seq 8B BE>: task id: running tasks by lease expiry
	// Format 8.
	prefixSchedule    = 'h' // h<uvarint len><session><name>: projection.Schedule (JSON): state_schedules.go
	prefixScheduleDue = 'H' // H<at 8B ordered><uvarint len><session><name>: empty: the schedule index
)

var (
	keyFormat  = []byte("mformat")  // value: formatMagic + version byte
	keyLastSeq = []byte("mlastseq") // value: 8B BE sequence of the last applied event
)

// projectionPrefixes are the keyspaces derived from the log: Verify rebuilds and compares
// them (the last sequence too).
var projectionPrefixes = []byte{prefixSession, prefixTask, prefixWake, prefixTaskKey, prefixWakeKey, prefixDue, prefixAvailable,
	prefixKindDue, prefixSessionTask, prefixCount, prefixPrunable, prefixSubject, prefixBlob, prefixSessionWake,
	prefixKindPolicy, prefixKindLease, prefixSchedule, prefixScheduleDue}

func eventKey(seq uint64) []byte {
	k := make([]byte, 9)
	k[0] = prefixEvent
	binary.BigEndian.PutUint64(k[1:], seq)
	return k
}

func sessionPrefix(session string) []byte {
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(session)+8)
	k = append(k, prefixSession)
	k = binary.AppendUvarint(k, uint64(len(session)))
	return append(k, session...)
}

func sessionEventKey(session string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(sessionPrefix(session), seq)
}

func idKey(prefix byte, id string) []byte {
	k := make([]byte, 0, 1+len(id))
	return append(append(k, prefix), id...)
}

func scopedKey(prefix byte, session, key string) []byte {
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(session)+len(key))
	k = append(k, prefix)
	k = binary.AppendUvarint(k, uint64(len(session)))
	k = append(k, session...)
	return append(k, key...)
}

// orderedTime maps an int64 to a uint64 whose big-endian bytes sort like the int64.
func orderedTime(at int64) uint64 { return uint64(at) ^ (1 << 63) }

func indexKey(prefix byte, at int64, seq uint64) []byte {
	k := make([]byte, 17)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:], orderedTime(at))
	binary.BigEndian.PutUint64(k[9:], seq)
	return k
}

func parseIndexKey(k []byte) (at int64, seq uint64, ok bool) {
	return parseIndexTail(k, 1)
}

// parseIndexTail parses an index key whose (at, seq) follow a head of head bytes: the
// prefix, and for the kind index the kind.
func parseIndexTail(k []byte, head int) (at int64, seq uint64, ok bool) {
	if len(k) != head+16 {
		return 0, 0, false
	}
	return int64(binary.BigEndian.Uint64(k[head:]) ^ (1 << 63)), binary.BigEndian.Uint64(k[head+8:]), true
}

// Format 6: the due index and the per-kind due index are keyed by priority first, so that
// byte order is claim order: higher priority first, then at, then submit seq. A priority's
// entries are a run in time order; a claim walks a run while its entries are due and seeks
// to the next run (reader.scanDue).

// orderedPriority maps a priority to a uint64 whose big-endian bytes sort higher priorities
// first: the sign-flipped value (ascending, as orderedTime), inverted.
func orderedPriority(p int64) uint64 { return ^orderedTime(p) }

// appendDueTail appends (priority, at, seq) to a due index's head (its prefix; the kind).
func appendDueTail(head []byte, pri, at int64, seq uint64) []byte {
	head = binary.BigEndian.AppendUint64(head, orderedPriority(pri))
	head = binary.BigEndian.AppendUint64(head, orderedTime(at))
	return binary.BigEndian.AppendUint64(head, seq)
}

// priorityStart is the first key of priority pri's run under head.
func priorityStart(head []byte, pri int64) []byte {
	return binary.BigEndian.AppendUint64(slices.Clip(head), orderedPriority(pri))
}

// parseDueTail parses a due-index key whose (priority, at, seq) follow a head of head
// bytes.
func parseDueTail(k []byte, head int) (pri, at int64, seq uint64, ok bool) {
	if len(k) != head+24 {
		return 0, 0, 0, false
	}
	pri = int64(^binary.BigEndian.Uint64(k[head:]) ^ (1 << 63))
	at, seq, ok = parseIndexTail(k[head+8:], 0)
	return pri, at, seq, ok
}

// sessionTaskPrefix is the start of one session's task list.
func sessionTaskPrefix(session string) []byte {
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(session)+8)
	k = append(k, prefixSessionTask)
	k = binary.AppendUvarint(k, uint64(len(session)))
	return append(k, session...)
}

func sessionTaskKey(session string, submitSeq uint64) []byte {
	return binary.BigEndian.AppendUint64(sessionTaskPrefix(session), submitSeq)
}

func countKey(kind string, state events.TaskState) []byte {
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(kind)+1)
	k = append(k, prefixCount)
	k = binary.AppendUvarint(k, uint64(len(kind)))
	return append(append(k, kind...), byte(state))
}

// parseCountKey returns the kind and state a count key names.
func parseCountKey(k []byte) (kind string, state events.TaskState, ok bool) {
	kind, rest, ok := splitScoped(k)
	if !ok || len(rest) != 1 {
		return "", 0, false
	}
	return kind, events.TaskState(rest[0]), true
}

// prefixEnd is the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// subjectPrefix is the start of one task's or wake's part of the per-subject event index.
func subjectPrefix(id string) []byte {
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(id)+8)
	k = append(k, prefixSubject)
	k = binary.AppendUvarint(k, uint64(len(id)))
	return append(k, id...)
}

// subjectEventKey is the per-subject index entry of the event seq of ev's subject.
func subjectEventKey(ev events.Event, seq uint64) []byte {
	return appendSubjectEventKey(nil, ev, seq)
}

// appendSubjectEventKey appends subjectEventKey(ev, seq) to k.
func appendSubjectEventKey(k []byte, ev events.Event, seq uint64) []byte {
	taskID, wakeID := ev.Subject()
	id := taskID + wakeID // one of them is set
	k = append(k, prefixSubject)
	k = binary.AppendUvarint(k, uint64(len(id)))
	k = append(k, id...)
	return binary.BigEndian.AppendUint64(k, seq)
}
