// Package inspect is the read-only inspection endpoint of a store held by a running process
// (docs/design.md §1, "The read-only source"): work.Open serves the store's source.Source on
// a Unix socket found from the store directory (Serve), and the replay tool reads a held
// store through it (Dial) as it reads a store nobody holds: every replay command and the
// console of replay serve just get a remote source.
//
// The protocol is worklog's own and private to this package (both ends are built from the
// same module): one connection per call. The client sends one request frame (a 4-byte
// big-endian length, then JSON, at most maxRequest bytes); the server answers with a stream
// of gob-encoded replies, the last one with Done set. A View is one connection too: the
// server holds one Pebble snapshot while the client sends one request per Reader call.
// Only read operations exist: there is no request that writes.
package inspect

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// maxRequest bounds one request frame: a request names a few ids and numbers.
const maxRequest = 64 << 10

// The operations. Every one of them reads.
const (
	opLastSeq      = "last_seq"
	opEvent        = "event" // RawEvent
	opRawLog       = "raw_log"
	opSessionLog   = "session_log"
	opSessions     = "sessions"
	opSessionSeqs  = "session_seqs"
	opScanTasks    = "scan_tasks"
	opScanWakes    = "scan_wakes"
	opPrunedRanges = "pruned_ranges"
	opDiskUsage    = "disk_usage"
	opVerify       = "verify"
	opFollow       = "follow"
	opView         = "view"

	// Inside a view: the projection.Reader's methods, and the end of the view.
	opTask           = "task"
	opWake           = "wake"
	opTaskKey        = "task_key"
	opWakeKey        = "wake_key"
	opScanIndex      = "scan_index"
	opViewLastSeq    = "view_last_seq"
	opSessionTasks   = "session_tasks"
	opCounts         = "counts"
	opSchedule       = "schedule"
	opSessionScheds  = "session_schedules"
	opScheduleDue    = "schedule_due"
	opKindPolicy     = "kind_policy"
	opKindPolicies   = "kind_policies"
	opEnd            = "end"
	opMore, opStop   = "more", "stop" // the client's answer to a batch with More set
	protocolVersion  = 2              // 2: a batch's events packed in one byte string (appendEvent)
	defaultBatchSize = 256
)

// request is a client's frame. Which fields count depends on Op.
type request struct {
	V       int    `json:"v"`
	Op      string `json:"op"`
	From    uint64 `json:"from,omitempty"`
	To      uint64 `json:"to,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
	Session string `json:"session,omitempty"`
	ID      string `json:"id,omitempty"`
	Key     string `json:"key,omitempty"`
	Index   uint8  `json:"index,omitempty"`
	Part    string `json:"part,omitempty"`
	Min     int64  `json:"min,omitempty"`
	Max     int64  `json:"max,omitempty"`
}

// reply is one gob frame of an answer. Done marks the last frame; More a batch after which
// the server waits for the client's more or stop (scans inside a view, which the client may
// end early without ending the view).
type reply struct {
	Done bool
	More bool
	Err  *wireError

	U64      uint64
	I64      int64
	OK       bool
	Str      string
	Bytes    []byte
	Strs     []string
	Seqs     []uint64
	Events   []byte // events, packed (appendEvent): one byte string for a whole batch
	Tasks    []*projection.Task
	Wakes    []*projection.Wake
	Entries  []projection.IndexEntry
	Counts   []countRow
	Scheds   []*projection.Schedule
	SchedDue []projection.ScheduleEntry
	Policies []*projection.KindPolicy
	Ranges   projection.SeqRanges
}

// appendEvent packs one event of a batch into dst: its sequence and length as uvarints,
// then its wire bytes. A batch of events is one byte string, not one value per event: gob
// copies it as it is, and the client walks it without an allocation per event (eachEvent).
func appendEvent(dst []byte, seq uint64, raw []byte) []byte {
	dst = binary.AppendUvarint(dst, seq)
	dst = binary.AppendUvarint(dst, uint64(len(raw)))
	return append(dst, raw...)
}

// eachEvent calls fn with every event packed in b, in order; raw is b's (valid until fn
// returns). A batch that does not parse, or whose sequences do not increase (after the
// batch's first, above after), is an error: the endpoint's reply was garbled. It returns
// the last sequence seen (after when b is empty).
func eachEvent(b []byte, after uint64, fn func(seq uint64, raw []byte) error) (uint64, error) {
	for len(b) > 0 {
		seq, n := binary.Uvarint(b)
		if n <= 0 {
			return after, errBadBatch
		}
		b = b[n:]
		size, n := binary.Uvarint(b)
		if n <= 0 || size > uint64(len(b)-n) {
			return after, errBadBatch
		}
		b = b[n:]
		if seq <= after {
			return after, fmt.Errorf("%w: seq %d after %d", errBadBatch, seq, after)
		}
		after = seq
		if err := fn(seq, b[:size:size]); err != nil {
			return after, err
		}
		b = b[size:]
	}
	return after, nil
}

var errBadBatch = errors.New("inspect: a garbled batch of events from the endpoint")

type countRow struct {
	Kind  string
	State events.TaskState
	N     int64
}

// wireError is an error of the serving side. Kind keeps what the client's callers test
// with errors.Is: a corrupt log.
type wireError struct {
	Msg  string
	Kind string // "", "corrupt"
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	we := &wireError{Msg: err.Error()}
	if errors.Is(err, events.ErrCorrupt) || isCorruptRecord(err) {
		we.Kind = "corrupt"
	}
	return we
}

// RemoteError is an error the serving process answered with.
type RemoteError struct {
	Msg  string
	kind error
}

func (e *RemoteError) Error() string { return e.Msg }
func (e *RemoteError) Unwrap() error { return e.kind }

func (we *wireError) err() error {
	if we == nil {
		return nil
	}
	e := &RemoteError{Msg: we.Msg}
	if we.Kind == "corrupt" {
		e.kind = events.ErrCorrupt
	}
	return e
}

// isCorruptRecord tells pebblelog's ErrCorruptRecord by its text: this package does not
// import pebblelog (it serves any Store).
func isCorruptRecord(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "pebblelog: corrupt projection record" {
			return true
		}
	}
	return false
}

// ErrBadRequest is what the server answers a frame it cannot read with, before it closes
// the connection.
var ErrBadRequest = errors.New("inspect: bad request")

func writeRequest(w io.Writer, r request) error {
	r.V = protocolVersion
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	_, err = w.Write(append(hdr[:], b...))
	return err
}

// readRequest reads one frame of at most maxRequest bytes and decodes it; anything else is
// ErrBadRequest.
func readRequest(r io.Reader) (request, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return request{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > maxRequest {
		return request{}, fmt.Errorf("%w: a frame of %d bytes (at most %d)", ErrBadRequest, n, maxRequest)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return request{}, err
	}
	var req request
	if err := json.Unmarshal(b, &req); err != nil {
		return request{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if req.V != protocolVersion {
		return request{}, fmt.Errorf("%w: protocol version %d, this process speaks %d", ErrBadRequest, req.V, protocolVersion)
	}
	return req, nil
}
