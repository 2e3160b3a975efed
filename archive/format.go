package archive

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	"github.com/worklog/worklog/projection"
)

const (
	segMagic   = "WLARCHV\x00"
	frameMagic = "WLF1"
	// Version is the archive format this package writes and reads.
	Version = 1

	segHeaderLen   = 32
	frameHeaderLen = 52
	sealMagic      = "WLS1"
	sealLen        = 16

	codecNone byte = 0
	codecZstd byte = 1

	// maxFrameRaw bounds a frame's payload, raw and as stored, on both sides: the Writer
	// never writes a larger one (Add refuses a larger event, FrameBytes is at most it, a
	// payload zstd does not shrink is stored raw), and a reader refuses a header that claims
	// more as corrupt before it allocates anything for the frame. A frame is FrameBytes
	// (1 MiB by default) or one event larger than that; an event is at most one value of
	// 64 MiB (work.Options.MaxValueBytes) with its ids, texts (64 KiB each) and headers
	// (16 KiB): 72 MiB holds the largest with room to spare.
	maxFrameRaw = 72 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b ...[]byte) uint32 {
	var c uint32
	for _, x := range b {
		c = crc32.Update(c, castagnoli, x)
	}
	return c
}

// ErrCorrupt is matched (errors.Is) by every error about the archive's bytes: a bad
// checksum, a truncated or unknown header, a record out of order, copies of one sequence
// that differ, a missing segment.
var ErrCorrupt = errors.New("archive: corrupt")

// ErrUnknownVersion: a segment of a newer archive format.
var ErrUnknownVersion = errors.New("archive: unknown format version")

// Error is a damaged archive: the file and the offset of what is wrong.
type Error struct {
	File   string // the segment's path
	Offset int64  // where in the file; -1 for the file as a whole
	Detail string
	Kind   error // ErrCorrupt or ErrUnknownVersion
}

func (e *Error) Error() string {
	if e.Offset < 0 {
		return fmt.Sprintf("%v: %s: %s", e.Kind, e.File, e.Detail)
	}
	return fmt.Sprintf("%v: %s at offset %d: %s", e.Kind, e.File, e.Offset, e.Detail)
}

func (e *Error) Unwrap() error { return e.Kind }

func corrupt(file string, off int64, format string, args ...any) *Error {
	return &Error{File: file, Offset: off, Detail: fmt.Sprintf(format, args...), Kind: ErrCorrupt}
}

// segName is the file name of segment n.
func segName(n uint32) string { return fmt.Sprintf("seg-%06d.wla", n) }

// parseSegName returns the number of a segment's file name.
func parseSegName(name string) (uint32, bool) {
	s, ok := strings.CutPrefix(name, "seg-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".wla")
	if !ok || len(s) < 6 {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 {
		return 0, false
	}
	return uint32(n), true
}

func appendSegHeader(b []byte, n uint32, prevLen uint64) []byte {
	start := len(b)
	b = append(b, segMagic...)
	b = binary.BigEndian.AppendUint16(b, Version)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint32(b, n)
	b = binary.BigEndian.AppendUint64(b, prevLen)
	b = binary.BigEndian.AppendUint32(b, 0)
	return binary.BigEndian.AppendUint32(b, crc(b[start:]))
}

type segHeader struct {
	n       uint32
	prevLen uint64
}

func parseSegHeader(file string, b []byte) (segHeader, error) {
	if len(b) < segHeaderLen {
		return segHeader{}, corrupt(file, 0, "the header is truncated (%d of %d bytes)", len(b), segHeaderLen)
	}
	b = b[:segHeaderLen]
	if string(b[:8]) != segMagic {
		return segHeader{}, corrupt(file, 0, "not an archive segment (magic %q)", b[:8])
	}
	if got, want := binary.BigEndian.Uint32(b[28:]), crc(b[:28]); got != want {
		return segHeader{}, corrupt(file, 28, "header checksum %08x, want %08x", got, want)
	}
	if v := binary.BigEndian.Uint16(b[8:]); v != Version {
		return segHeader{}, &Error{File: file, Offset: 8, Detail: fmt.Sprintf("version %d (this build reads %d)", v, Version), Kind: ErrUnknownVersion}
	}
	return segHeader{n: binary.BigEndian.Uint32(b[12:]), prevLen: binary.BigEndian.Uint64(b[16:])}, nil
}

// frameHeader is a frame as its header and runs index describe it.
type frameHeader struct {
	codec               byte
	count               uint32
	runsLen, stored     uint32
	raw                 uint32
	first, last         uint64
	runsCRC, payloadCRC uint32
}

func (h *frameHeader) size() int64 { return frameHeaderLen + int64(h.runsLen) + int64(h.stored) }

func appendFrameHeader(b []byte, h *frameHeader) []byte {
	start := len(b)
	b = append(b, frameMagic...)
	b = append(b, h.codec, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, h.count)
	b = binary.BigEndian.AppendUint32(b, h.runsLen)
	b = binary.BigEndian.AppendUint32(b, h.stored)
	b = binary.BigEndian.AppendUint32(b, h.raw)
	b = binary.BigEndian.AppendUint64(b, h.first)
	b = binary.BigEndian.AppendUint64(b, h.last)
	b = binary.BigEndian.AppendUint32(b, h.runsCRC)
	b = binary.BigEndian.AppendUint32(b, h.payloadCRC)
	return binary.BigEndian.AppendUint32(b, crc(b[start:]))
}

// parseFrameHeader checks a frame's fixed header; off is where it starts in file.
func parseFrameHeader(file string, off int64, b []byte) (frameHeader, error) {
	if len(b) < frameHeaderLen {
		return frameHeader{}, corrupt(file, off, "frame header truncated (%d of %d bytes)", len(b), frameHeaderLen)
	}
	if string(b[:4]) != frameMagic {
		return frameHeader{}, corrupt(file, off, "no frame here (magic %q)", b[:4])
	}
	if got, want := binary.BigEndian.Uint32(b[48:]), crc(b[:48]); got != want {
		return frameHeader{}, corrupt(file, off+48, "frame header checksum %08x, want %08x", got, want)
	}
	h := frameHeader{
		codec: b[4], count: binary.BigEndian.Uint32(b[8:]), runsLen: binary.BigEndian.Uint32(b[12:]),
		stored: binary.BigEndian.Uint32(b[16:]), raw: binary.BigEndian.Uint32(b[20:]),
		first: binary.BigEndian.Uint64(b[24:]), last: binary.BigEndian.Uint64(b[32:]),
		runsCRC: binary.BigEndian.Uint32(b[40:]), payloadCRC: binary.BigEndian.Uint32(b[44:]),
	}
	switch {
	case h.codec != codecNone && h.codec != codecZstd:
		return h, corrupt(file, off+4, "unknown codec %d", h.codec)
	case h.count == 0 || h.first == 0 || h.last < h.first || uint64(h.count) > h.last-h.first+1:
		return h, corrupt(file, off+8, "%d records in seqs [%d, %d]", h.count, h.first, h.last)
	case h.stored > maxFrameRaw:
		return h, corrupt(file, off+16, "payload of %d bytes stored, more than a frame holds (%d)", h.stored, maxFrameRaw)
	case h.raw > maxFrameRaw:
		return h, corrupt(file, off+20, "payload of %d bytes raw, more than a frame holds (%d)", h.raw, maxFrameRaw)
	case h.codec == codecNone && h.raw != h.stored:
		return h, corrupt(file, off+20, "payload of %d bytes (%d stored)", h.raw, h.stored)
	case uint64(h.count)*recordOverhead > uint64(h.raw):
		return h, corrupt(file, off+8, "%d records in a payload of %d bytes", h.count, h.raw)
	case uint64(h.runsLen) > uint64(h.count)*2*binary.MaxVarintLen64:
		return h, corrupt(file, off+12, "runs index of %d bytes for %d records", h.runsLen, h.count)
	}
	return h, nil
}

func appendRuns(b []byte, runs []projection.SeqRange) []byte {
	var prev uint64
	for _, r := range runs {
		b = binary.AppendUvarint(b, r.From-prev)
		b = binary.AppendUvarint(b, r.To-r.From)
		prev = r.To
	}
	return b
}

// parseRuns decodes and checks a frame's runs index against its header.
func parseRuns(file string, off int64, h *frameHeader, b []byte) ([]projection.SeqRange, error) {
	if got := crc(b); got != h.runsCRC {
		return nil, corrupt(file, off, "runs index checksum %08x, want %08x", got, h.runsCRC)
	}
	var runs []projection.SeqRange
	var prev, n uint64
	for len(b) > 0 {
		d, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, corrupt(file, off, "runs index is truncated")
		}
		b = b[k:]
		l, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, corrupt(file, off, "runs index is truncated")
		}
		b = b[k:]
		from := prev + d
		if (len(runs) > 0 && d < 2) || from == 0 || from+l < from {
			return nil, corrupt(file, off, "runs index out of order at seq %d", from)
		}
		runs = append(runs, projection.SeqRange{From: from, To: from + l})
		prev = from + l
		n += l + 1
	}
	if len(runs) == 0 || n != uint64(h.count) || runs[0].From != h.first || prev != h.last {
		return nil, corrupt(file, off, "runs index holds %d seqs, the header %d in [%d, %d]", n, h.count, h.first, h.last)
	}
	return runs, nil
}

const recordOverhead = 8 + 4 + 4

func appendRecord(b []byte, seq uint64, wire []byte) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, uint32(len(wire)))
	b = append(b, wire...)
	return binary.BigEndian.AppendUint32(b, crc(b[start:]))
}

// appendSeal appends the seal a Writer writes when it closes a segment cleanly: at is the
// seal's own offset. A sealed segment has no torn tail.
func appendSeal(b []byte, at int64) []byte {
	start := len(b)
	b = append(b, sealMagic...)
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	return binary.BigEndian.AppendUint32(b, crc(b[start:]))
}

// isSeal reports whether b (the last sealLen bytes of a segment, at offset at) is its seal.
func isSeal(b []byte, at int64) bool {
	return len(b) == sealLen && string(b[:4]) == sealMagic && binary.BigEndian.Uint64(b[4:]) == uint64(at) &&
		binary.BigEndian.Uint32(b[12:]) == crc(b[:12])
}
