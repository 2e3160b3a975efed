package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/worklog/worklog/events"
)

// The wire log: how `replay export --wire` writes a store's whole log and `replay import`
// reads it. It carries each event's stored bytes as they are (events' versioned wire format,
// each with its own CRC-32C and its sequence number inside), so nothing is lost or
// re-encoded: the lease tokens that fence workers, the inputs and outputs byte for byte, and
// an event type this build does not know is refused by the import's decode rather than
// silently dropped. (The JSON lines of `export` are for people and other tools: tokens are
// redacted by default and the values are re-rendered.)
//
//	"worklog wire log 1\n"
//	for each event, seq 1, 2, ...: uvarint(len) > 0, the event's bytes
//	the end: uvarint(0), uvarint(the last seq)
//
// The end record tells a complete file from a truncated one.
const wireMagic = "worklog wire log 1\n"

// maxWireEvent bounds one event's length as read, so a damaged length cannot make the import
// allocate more than an event can hold (a value is at most work's maximum, far below this).
const maxWireEvent = 1 << 30

// errWireFormat: the input is not a wire log, or is damaged or truncated.
var errWireFormat = errors.New("not a complete worklog wire log")

type wireWriter struct {
	w    *bufio.Writer
	last uint64
	tmp  [binary.MaxVarintLen64]byte
}

func newWireWriter(w io.Writer) (*wireWriter, error) {
	ww := &wireWriter{w: bufio.NewWriterSize(w, 256<<10)}
	_, err := ww.w.WriteString(wireMagic)
	return ww, err
}

func (ww *wireWriter) event(seq uint64, raw []byte) error {
	if seq != ww.last+1 {
		return fmt.Errorf("%w: the log has seq %d after %d", events.ErrCorrupt, seq, ww.last)
	}
	ww.last = seq
	n := binary.PutUvarint(ww.tmp[:], uint64(len(raw)))
	if _, err := ww.w.Write(ww.tmp[:n]); err != nil {
		return err
	}
	_, err := ww.w.Write(raw)
	return err
}

func (ww *wireWriter) finish() error {
	n := binary.PutUvarint(ww.tmp[:], 0)
	n += binary.PutUvarint(ww.tmp[n:], ww.last)
	if _, err := ww.w.Write(ww.tmp[:n]); err != nil {
		return err
	}
	return ww.w.Flush()
}

type wireReader struct {
	r    *bufio.Reader
	next uint64 // the seq the next event must have
	done bool
}

func newWireReader(r io.Reader) (*wireReader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic := make([]byte, len(wireMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != wireMagic {
		return nil, fmt.Errorf("%w: it does not start with %q (write one with replay export --wire)", errWireFormat, wireMagic[:len(wireMagic)-1])
	}
	return &wireReader{r: br, next: 1}, nil
}

// read returns the next event, decoded and checked (its checksum, its fields, its sequence
// number against its place in the file), or io.EOF after a complete file's end record.
func (wr *wireReader) read() (events.Event, error) {
	if wr.done {
		return nil, io.EOF
	}
	n, err := binary.ReadUvarint(wr.r)
	if err != nil {
		return nil, wr.truncated(err)
	}
	if n == 0 {
		last, err := binary.ReadUvarint(wr.r)
		if err != nil {
			return nil, wr.truncated(err)
		}
		if last != wr.next-1 {
			return nil, fmt.Errorf("%w: its end record says the log ends at seq %d, but it holds events up to seq %d", errWireFormat, last, wr.next-1)
		}
		if _, err := wr.r.ReadByte(); err != io.EOF {
			return nil, fmt.Errorf("%w: bytes after its end record", errWireFormat)
		}
		wr.done = true
		return nil, io.EOF
	}
	if n > maxWireEvent {
		return nil, fmt.Errorf("%w: the event after seq %d claims %d bytes", errWireFormat, wr.next-1, n)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(wr.r, raw); err != nil {
		return nil, wr.truncated(err)
	}
	ev, err := events.Decode(raw, wr.next)
	if err != nil {
		return nil, err
	}
	wr.next++
	return ev, nil
}

func (wr *wireReader) truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: it ends after seq %d without its end record (truncated)", errWireFormat, wr.next-1)
	}
	return err
}
