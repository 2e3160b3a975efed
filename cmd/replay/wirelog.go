package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// The wire log: how `replay export --wire` writes a store's whole log and `replay import`
// reads it. It carries each event's stored bytes as they are (events' versioned wire format,
// each with its own CRC-32C and its sequence number inside), so nothing is lost or
// re-encoded: the lease tokens that fence workers, the inputs and outputs byte for byte, and
// an event type this build does not know is refused by the import's decode rather than
// silently dropped. (The JSON lines of `export` are for people and other tools: tokens are
// redacted by default and the values are re-rendered.)
//
// Version 1, a log without pruned ranges (what export writes for a store that has none, so
// that older builds still import it):
//
//	"worklog wire log 1\n"
//	for each event, seq 1, 2, ...: uvarint(len) > 0, the event's bytes
//	the end: uvarint(0), uvarint(the last seq)
//
// Version 2, a log that was pruned (Queue.Prune): the same events, and where the source's
// log has a pruned range, a record for it at its place in the sequence; a zero length
// introduces a tagged record:
//
//	"worklog wire log 2\n"
//	in sequence order, each either
//	  an event: uvarint(len) > 0, the event's bytes
//	  a pruned range: uvarint(0), uvarint(1), uvarint(from), uvarint(to): seqs from..to
//	    (from the next sequence, to >= from) were pruned at the source
//	the end: uvarint(0), uvarint(0), uvarint(the last seq), which a pruned range may reach
//
// Every sequence 1..last is either an event or in a pruned range, so a gap no record
// declares is damage, as in version 1. A build that reads only version 1 refuses a version
// 2 file by its first line instead of misreading it. The end record tells a complete file
// from a truncated one.
const (
	wireMagic  = "worklog wire log 1\n"
	wireMagic2 = "worklog wire log 2\n"
)

// Tags of version 2's records that begin with a zero length.
const (
	wireTagEnd    = 0
	wireTagPruned = 1
)

// maxWireEvent bounds one event's length as read, so a damaged length cannot make the import
// allocate more than an event can hold (a value is at most work's maximum, far below this).
const maxWireEvent = 1 << 30

// errWireFormat: the input is not a wire log, or is damaged or truncated.
var errWireFormat = errors.New("not a complete worklog wire log")

// errUndeclaredGap: the log skips sequences that no pruned range declares (a damaged file
// or store, never what a prune leaves). Its message names the first missing sequence.
var errUndeclaredGap = errors.New("a gap in the log that no pruned range declares")

type wireWriter struct {
	w      *bufio.Writer
	last   uint64               // the last sequence written, an event's or a pruned range's
	pruned projection.SeqRanges // the source's pruned ranges, each written in its place
	next   int                  // the first of pruned not written yet
	tmp    [4 * binary.MaxVarintLen64]byte
}

// newWireWriter starts a wire log of a log whose pruned ranges are pruned: version 2 when
// there are any, else version 1.
func newWireWriter(w io.Writer, pruned projection.SeqRanges) (*wireWriter, error) {
	ww := &wireWriter{w: bufio.NewWriterSize(w, 256<<10), pruned: pruned}
	magic := wireMagic
	if len(pruned) > 0 {
		magic = wireMagic2
	}
	_, err := ww.w.WriteString(magic)
	return ww, err
}

// event writes the event at seq, after the pruned range that fills the gap before it. A gap
// that is not exactly the next pruned range, or an event inside a pruned range, is refused:
// the file would not say what the log is.
func (ww *wireWriter) event(seq uint64, raw []byte) error {
	if seq != ww.last+1 {
		if seq < ww.last+1 || !ww.isNextRange(seq-1) {
			return fmt.Errorf("%w: %w: the log has seq %d after %d", events.ErrCorrupt, errUndeclaredGap, seq, ww.last)
		}
		if err := ww.writeRange(); err != nil {
			return err
		}
	}
	if ww.next < len(ww.pruned) && ww.pruned[ww.next].From <= seq {
		r := ww.pruned[ww.next]
		return fmt.Errorf("%w: event seq %d lies in the pruned range %d..%d", events.ErrCorrupt, seq, r.From, r.To)
	}
	ww.last = seq
	n := binary.PutUvarint(ww.tmp[:], uint64(len(raw)))
	if _, err := ww.w.Write(ww.tmp[:n]); err != nil {
		return err
	}
	_, err := ww.w.Write(raw)
	return err
}

// isNextRange reports whether last+1..to is the next pruned range.
func (ww *wireWriter) isNextRange(to uint64) bool {
	return ww.next < len(ww.pruned) && ww.pruned[ww.next] == projection.SeqRange{From: ww.last + 1, To: to}
}

// writeRange writes the next pruned range.
func (ww *wireWriter) writeRange() error {
	r := ww.pruned[ww.next]
	n := binary.PutUvarint(ww.tmp[:], 0)
	n += binary.PutUvarint(ww.tmp[n:], wireTagPruned)
	n += binary.PutUvarint(ww.tmp[n:], r.From)
	n += binary.PutUvarint(ww.tmp[n:], r.To)
	ww.next++
	ww.last = r.To
	_, err := ww.w.Write(ww.tmp[:n])
	return err
}

// finish writes the end record of a log whose last sequence is head: after the pruned range
// that ends the log, if its newest events were pruned. A pruned range left unwritten (one
// past head, or holding an event) is refused.
func (ww *wireWriter) finish(head uint64) error {
	if ww.last < head && ww.isNextRange(head) {
		if err := ww.writeRange(); err != nil {
			return err
		}
	}
	if ww.last != head {
		return fmt.Errorf("%w: %w: the log ends at seq %d, before its last sequence %d", events.ErrCorrupt, errUndeclaredGap, ww.last, head)
	}
	if ww.next < len(ww.pruned) {
		r := ww.pruned[ww.next]
		return fmt.Errorf("%w: the pruned range %d..%d is not a gap of the log (it ends at seq %d)", events.ErrCorrupt, r.From, r.To, head)
	}
	n := binary.PutUvarint(ww.tmp[:], 0)
	if len(ww.pruned) > 0 {
		n += binary.PutUvarint(ww.tmp[n:], wireTagEnd)
	}
	n += binary.PutUvarint(ww.tmp[n:], head)
	if _, err := ww.w.Write(ww.tmp[:n]); err != nil {
		return err
	}
	return ww.w.Flush()
}

type wireReader struct {
	r       *bufio.Reader
	version int
	next    uint64 // the seq the next event or pruned range must begin at
	done    bool
}

// wireRecord is one record of a wire log: an event, or (ev nil) a pruned range.
type wireRecord struct {
	ev     events.Event
	pruned projection.SeqRange
}

func newWireReader(r io.Reader) (*wireReader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic := make([]byte, len(wireMagic))
	_, err := io.ReadFull(br, magic)
	wr := &wireReader{r: br, next: 1}
	switch {
	case err == nil && string(magic) == wireMagic:
		wr.version = 1
	case err == nil && string(magic) == wireMagic2:
		wr.version = 2
	default:
		return nil, fmt.Errorf("%w: it does not start with %q (or version 2's %q; write one with replay export --wire)",
			errWireFormat, wireMagic[:len(wireMagic)-1], wireMagic2[:len(wireMagic2)-1])
	}
	return wr, nil
}

// read returns the next record: an event, decoded and checked (its checksum, its fields, its
// sequence number against its place in the file), or a pruned range that begins at its place;
// io.EOF after a complete file's end record. An event after a gap that no pruned range
// declares is errUndeclaredGap naming the first missing sequence.
func (wr *wireReader) read() (wireRecord, error) {
	if wr.done {
		return wireRecord{}, io.EOF
	}
	n, err := binary.ReadUvarint(wr.r)
	if err != nil {
		return wireRecord{}, wr.truncated(err)
	}
	if n == 0 {
		tag := uint64(wireTagEnd)
		if wr.version == 2 {
			if tag, err = binary.ReadUvarint(wr.r); err != nil {
				return wireRecord{}, wr.truncated(err)
			}
		}
		switch tag {
		case wireTagEnd:
			return wireRecord{}, wr.end()
		case wireTagPruned:
			return wr.prunedRange()
		}
		return wireRecord{}, fmt.Errorf("%w: a record after seq %d has the unknown tag %d", errWireFormat, wr.next-1, tag)
	}
	if n > maxWireEvent {
		return wireRecord{}, fmt.Errorf("%w: the event after seq %d claims %d bytes", errWireFormat, wr.next-1, n)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(wr.r, raw); err != nil {
		return wireRecord{}, wr.truncated(err)
	}
	// Decode with the sequence the event must have, so that a damaged one is named by its
	// place; when only that check fails, it is a gap (or an event out of order).
	ev, err := events.Decode(raw, wr.next)
	if err != nil {
		if at, aerr := events.Decode(raw, 0); aerr == nil {
			switch seq := at.Head().Seq; {
			case seq > wr.next:
				return wireRecord{}, fmt.Errorf("%w: %w: seq %d is missing (the next event is seq %d)", errWireFormat, errUndeclaredGap, wr.next, seq)
			default:
				return wireRecord{}, fmt.Errorf("%w: event seq %d comes where seq %d belongs", errWireFormat, seq, wr.next)
			}
		}
		return wireRecord{}, err
	}
	wr.next++
	return wireRecord{ev: ev}, nil
}

func (wr *wireReader) prunedRange() (wireRecord, error) {
	from, err := binary.ReadUvarint(wr.r)
	if err != nil {
		return wireRecord{}, wr.truncated(err)
	}
	to, err := binary.ReadUvarint(wr.r)
	if err != nil {
		return wireRecord{}, wr.truncated(err)
	}
	if from != wr.next || to < from || to > math.MaxInt64 { // a sequence fits PostgreSQL's bigint
		return wireRecord{}, fmt.Errorf("%w: a pruned range %d..%d where seq %d belongs", errWireFormat, from, to, wr.next)
	}
	wr.next = to + 1
	return wireRecord{pruned: projection.SeqRange{From: from, To: to}}, nil
}

func (wr *wireReader) end() error {
	last, err := binary.ReadUvarint(wr.r)
	if err != nil {
		return wr.truncated(err)
	}
	if last != wr.next-1 {
		return fmt.Errorf("%w: its end record says the log ends at seq %d, but it holds events up to seq %d", errWireFormat, last, wr.next-1)
	}
	if _, err := wr.r.ReadByte(); err != io.EOF {
		return fmt.Errorf("%w: bytes after its end record", errWireFormat)
	}
	wr.done = true
	return io.EOF
}

func (wr *wireReader) truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: it ends after seq %d without its end record (truncated)", errWireFormat, wr.next-1)
	}
	return err
}
