package archive

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/zstd"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// segment is one segment file as a reader sees it.
type segment struct {
	n      uint32
	path   string
	size   int64 // the file's size
	valid  int64 // where its valid frames end: the rest is a torn tail
	frames []frame
}

type frame struct {
	seg  *segment
	off  int64 // the frame header's offset
	h    frameHeader
	runs []projection.SeqRange
}

func (f *frame) payloadOff() int64 { return f.off + frameHeaderLen + int64(f.h.runsLen) }

// scanSegment reads a segment's header and its frames' headers and runs. valid is the
// segment's valid length as the next segment's header records it, or -1 for the last
// segment: then its frames are read whole (payload checksums too) up to the first one that
// is not intact, where its torn tail begins.
func scanSegment(fs vfs.FS, path string, n uint32, valid int64) (*segment, error) {
	s := &segment{n: n, path: path}
	if valid == 0 {
		return s, nil // nothing of it counts (see the package doc); it need not exist
	}
	f, err := openRegular(fs, path)
	if err != nil {
		if valid < 0 && errors.Is(err, os.ErrNotExist) {
			return s, nil
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("archive: %s: %w", path, err)
	}
	s.size = st.Size()
	last := valid < 0
	if last && s.size >= segHeaderLen+sealLen {
		// A segment its writer closed is sealed: no torn tail, damage anywhere is refused.
		b := make([]byte, sealLen)
		if _, err := f.ReadAt(b, s.size-sealLen); err != nil {
			return nil, fmt.Errorf("archive: reading %s: %w", path, err)
		}
		if isSeal(b, s.size-sealLen) {
			last, valid = false, s.size
		}
	}
	if !last && s.size < valid {
		return nil, corrupt(path, s.size, "the segment ends at %d bytes; the next segment's header says %d were written", s.size, valid)
	}
	end := valid
	if last {
		end = s.size
	}
	hdr := make([]byte, segHeaderLen)
	if _, err := f.ReadAt(hdr[:min(int64(segHeaderLen), end)], 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("archive: reading %s: %w", path, err)
	}
	h, herr := parseSegHeader(path, hdr[:min(int64(segHeaderLen), end)])
	if herr == nil && h.n != n {
		herr = corrupt(path, 12, "the header says segment %d", h.n)
	}
	if herr != nil {
		if last && !errors.Is(herr, ErrUnknownVersion) {
			return s, nil // a segment whose header never reached the disk
		}
		return nil, herr
	}
	off := int64(segHeaderLen)
	buf := make([]byte, frameHeaderLen)
	for off < end {
		if end-off == sealLen {
			b := make([]byte, sealLen)
			if _, err := f.ReadAt(b, off); err != nil {
				return nil, fmt.Errorf("archive: reading %s at offset %d: %w", path, off, err)
			}
			if isSeal(b, off) {
				off = end
				break
			}
		}
		fr, torn, ferr := readFrame(f, path, off, end, last, buf)
		if ferr != nil {
			if last && torn {
				break // the torn tail
			}
			return nil, ferr
		}
		fr.seg = s
		s.frames = append(s.frames, fr)
		off += fr.h.size()
	}
	s.valid = off
	if len(s.frames) == 0 && last {
		s.valid = 0
	}
	return s, nil
}

// readFrame reads the frame at off, which must end by end; whole reads its payload and
// checks its checksum. torn reports an error a write that never completed can leave (bytes
// missing, or not the ones written: a checksum fails): in the last segment that is its torn
// tail. A header whose checksum holds was written whole; what it claims is then the frame
// as written, and a claim no Writer makes (a length past maxFrameRaw, a runs index at odds
// with its header) is damage wherever it is.
func readFrame(f vfs.File, path string, off, end int64, whole bool, buf []byte) (fr frame, torn bool, err error) {
	if end-off < frameHeaderLen {
		return frame{}, true, corrupt(path, off, "frame header truncated (%d of %d bytes)", end-off, frameHeaderLen)
	}
	if _, err := f.ReadAt(buf, off); err != nil {
		return frame{}, false, fmt.Errorf("archive: reading %s at offset %d: %w", path, off, err)
	}
	if string(buf[:4]) != frameMagic || binary.BigEndian.Uint32(buf[48:]) != crc(buf[:48]) {
		_, err := parseFrameHeader(path, off, buf)
		return frame{}, true, err
	}
	h, err := parseFrameHeader(path, off, buf)
	if err != nil {
		return frame{}, false, err
	}
	if off+h.size() > end {
		return frame{}, true, corrupt(path, off, "frame of %d bytes runs past the segment's end at %d", h.size(), end)
	}
	rb := make([]byte, h.runsLen)
	if _, err := f.ReadAt(rb, off+frameHeaderLen); err != nil {
		return frame{}, false, fmt.Errorf("archive: reading %s at offset %d: %w", path, off, err)
	}
	if got := crc(rb); got != h.runsCRC {
		return frame{}, true, corrupt(path, off+frameHeaderLen, "runs index checksum %08x, want %08x", got, h.runsCRC)
	}
	runs, err := parseRuns(path, off+frameHeaderLen, &h, rb)
	if err != nil {
		return frame{}, false, err
	}
	fr = frame{off: off, h: h, runs: runs}
	if whole {
		p := make([]byte, h.stored)
		if _, err := f.ReadAt(p, fr.payloadOff()); err != nil {
			return frame{}, false, fmt.Errorf("archive: reading %s at offset %d: %w", path, fr.payloadOff(), err)
		}
		if got := crc(p); got != h.payloadCRC {
			return frame{}, true, corrupt(path, fr.payloadOff(), "payload checksum %08x, want %08x", got, h.payloadCRC)
		}
	}
	return fr, false, nil
}

// Reader reads an archive. Open it with Open or OpenFS; it is safe for concurrent use.
type Reader struct {
	fs     vfs.FS
	dir    string
	segs   []*segment
	frames []*frame // every frame, by first seq
	ranges projection.SeqRanges

	mu     sync.Mutex // guards the last frame Get loaded
	cached *cursor
	dec    *zstd.Decoder
}

// Open opens the archive in dir on the OS's filesystem.
func Open(dir string) (*Reader, error) { return OpenFS(vfs.Default, dir) }

// OpenFS opens the archive in dir: it reads every segment's header and its frames' headers
// and runs indexes (the last segment's frames whole), so that Ranges and Segments answer
// at once and Read finds the frames it needs. A damaged header or index is an *Error.
func OpenFS(fs vfs.FS, dir string) (*Reader, error) {
	nums, err := listSegments(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("archive: listing %s: %w", dir, err)
	}
	r := &Reader{fs: fs, dir: dir}
	valid := int64(-1)
	for i := len(nums) - 1; i >= 0; i-- {
		n := nums[i]
		if i < len(nums)-1 && nums[i+1] != n+1 {
			return nil, &Error{File: fs.PathJoin(dir, segName(n+1)), Offset: -1, Kind: ErrCorrupt,
				Detail: fmt.Sprintf("the segment is missing (%s and %s exist)", segName(n), segName(nums[i+1]))}
		}
		s, err := scanSegment(fs, fs.PathJoin(dir, segName(n)), n, valid)
		if err != nil {
			return nil, err
		}
		r.segs = append(r.segs, s)
		// The previous segment's valid length, from this one's header; when the last
		// segment's header never reached the disk, the previous one was the last one
		// written to (a segment is fsynced with its header before anything counts in it).
		valid = -1
		hdr := make([]byte, segHeaderLen)
		if err := readAt(fs, s.path, hdr, 0); err == nil {
			h, herr := parseSegHeader(s.path, hdr)
			if herr == nil && h.n != n {
				herr = corrupt(s.path, 12, "the header says segment %d", h.n)
			}
			if herr == nil {
				valid = int64(h.prevLen)
			} else if i < len(nums)-1 {
				return nil, herr
			}
		} else if i < len(nums)-1 {
			return nil, err
		}
	}
	slices.Reverse(r.segs)
	var all []projection.SeqRange
	for _, s := range r.segs {
		for i := range s.frames {
			r.frames = append(r.frames, &s.frames[i])
			all = append(all, s.frames[i].runs...)
		}
	}
	slices.SortStableFunc(r.frames, func(a, b *frame) int { return cmp.Compare(a.h.first, b.h.first) })
	r.ranges = union(all)
	return r, nil
}

// openRegular opens a segment for reading, refusing anything but a regular file before
// opening it: opening a FIFO blocks until someone writes into it, a device reads forever.
func openRegular(fs vfs.FS, path string) (vfs.File, error) {
	if err := checkRegular(fs, path); err != nil {
		return nil, err
	}
	f, err := fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("archive: opening %s: %w", path, err)
	}
	return f, nil
}

// checkRegular refuses a segment that is not a regular file (ErrCorrupt naming it).
func checkRegular(fs vfs.FS, path string) error {
	st, err := fs.Stat(path)
	if err != nil {
		return fmt.Errorf("archive: opening %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return &Error{File: path, Offset: -1, Kind: ErrCorrupt, Detail: fmt.Sprintf("not a regular file (%s)", st.Mode().Type())}
	}
	return nil
}

func readAt(fs vfs.FS, path string, b []byte, off int64) error {
	f, err := openRegular(fs, path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(b, off); err != nil {
		return fmt.Errorf("archive: reading %s at offset %d: %w", path, off, err)
	}
	return nil
}

// union coalesces possibly overlapping ranges.
func union(rs []projection.SeqRange) projection.SeqRanges {
	slices.SortFunc(rs, func(a, b projection.SeqRange) int { return cmp.Compare(a.From, b.From) })
	var out projection.SeqRanges
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].To+1 >= r.From {
			out[n-1].To = max(out[n-1].To, r.To)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Dir returns the archive's directory.
func (r *Reader) Dir() string { return r.dir }

// Ranges returns the sequences the archive holds, as sorted, coalesced ranges.
func (r *Reader) Ranges() projection.SeqRanges { return slices.Clone(r.ranges) }

// Events is the number of distinct sequences the archive holds.
func (r *Reader) Events() uint64 { return r.ranges.Count() }

// SegmentInfo describes one segment.
type SegmentInfo struct {
	Name      string // the file's name in the archive's directory
	Bytes     int64  // its size on disk
	TornBytes int64  // bytes after its last valid frame (a write a crash interrupted)
	Frames    int
	Records   uint64 // records, copies of a sequence included
}

// Segments describes the archive's segments, in order.
func (r *Reader) Segments() []SegmentInfo {
	out := make([]SegmentInfo, 0, len(r.segs))
	for _, s := range r.segs {
		si := SegmentInfo{Name: segName(s.n), Bytes: s.size, Frames: len(s.frames), TornBytes: s.size - s.valid}
		for _, f := range s.frames {
			si.Records += uint64(f.h.count)
		}
		out = append(out, si)
	}
	return out
}

// Size is the archive's size on disk: the sum of its segments' sizes.
func (r *Reader) Size() int64 {
	var n int64
	for _, s := range r.segs {
		n += s.size
	}
	return n
}

// Missing returns the sequences of want the archive does not hold (want: a store's pruned
// ranges, to check that every pruned event was archived).
func (r *Reader) Missing(want projection.SeqRanges) projection.SeqRanges {
	var out projection.SeqRanges
	for _, w := range want {
		from := w.From
		for _, h := range r.ranges {
			if h.To < from || h.From > w.To {
				continue
			}
			if h.From > from {
				out = append(out, projection.SeqRange{From: from, To: h.From - 1})
			}
			from = h.To + 1
			if from > w.To || from == 0 {
				break
			}
		}
		if from <= w.To && from != 0 {
			out = append(out, projection.SeqRange{From: from, To: w.To})
		}
	}
	return out
}

// Read calls fn with each archived sequence in [from, to] (to 0: the end) and its wire
// bytes, in ascending order, each once, until fn returns an error. wire is valid only
// during the call. Every frame it reads is checked (payload checksum, each record's
// checksum, order and runs); copies of a sequence must be byte-identical.
func (r *Reader) Read(ctx context.Context, from, to uint64, fn func(seq uint64, wire []byte) error) error {
	if to == 0 {
		to = ^uint64(0)
	}
	var dec *zstd.Decoder
	defer func() {
		if dec != nil {
			dec.Close()
		}
	}()
	var h cursorHeap
	var lastSeq uint64
	var lastWire []byte
	var lastFrom *frame
	emitBelow := func(limit uint64) error {
		for len(h) > 0 && h[0].seq() < limit {
			c := h[0]
			seq, wire := c.seq(), c.wire()
			if lastFrom != nil && seq == lastSeq {
				if !bytes.Equal(wire, lastWire) {
					return corrupt(c.f.seg.path, c.f.off, "seq %d differs from its copy in %s at offset %d", seq, lastFrom.seg.path, lastFrom.off)
				}
			} else {
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := fn(seq, wire); err != nil {
					return err
				}
			}
			lastSeq, lastWire, lastFrom = seq, wire, c.f
			if c.next() {
				heap.Fix(&h, 0)
			} else {
				heap.Pop(&h)
			}
		}
		return nil
	}
	for _, f := range r.frames {
		if f.h.last < from || f.h.first > to {
			continue
		}
		if err := emitBelow(f.h.first); err != nil {
			return err
		}
		if dec == nil && f.h.codec == codecZstd {
			var err error
			if dec, err = newDecoder(); err != nil {
				return err
			}
		}
		c, err := r.load(f, dec, from, to)
		if err != nil {
			return err
		}
		if c != nil {
			heap.Push(&h, c)
		}
	}
	return emitBelow(^uint64(0))
}

// Get returns a copy of the wire bytes of seq and whether the archive holds it. It keeps the
// last frame it read, so that a walk over nearby sequences (one session's events) reads
// each frame once.
func (r *Reader) Get(seq uint64) ([]byte, bool, error) {
	if !r.ranges.Contains(seq) {
		return nil, false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.cached; c != nil {
		if w, ok := c.find(seq); ok {
			return bytes.Clone(w), true, nil
		}
	}
	for _, f := range r.frames {
		if seq < f.h.first || seq > f.h.last || !projection.SeqRanges(f.runs).Contains(seq) {
			continue
		}
		if r.dec == nil && f.h.codec == codecZstd {
			var err error
			if r.dec, err = newDecoder(); err != nil {
				return nil, false, err
			}
		}
		c, err := r.load(f, r.dec, 0, ^uint64(0))
		if err != nil {
			return nil, false, err
		}
		r.cached = c
		if w, ok := c.find(seq); ok {
			return bytes.Clone(w), true, nil
		}
	}
	return nil, false, nil
}

// find returns the wire bytes of seq in c's records.
func (c *cursor) find(seq uint64) ([]byte, bool) {
	i, ok := slices.BinarySearchFunc(c.recs, seq, func(r record, s uint64) int { return cmp.Compare(r.seq, s) })
	if !ok {
		return nil, false
	}
	return c.recs[i].wire, true
}

// Close releases the reader's decoder.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dec != nil {
		r.dec.Close()
		r.dec = nil
	}
	r.cached = nil
	return nil
}

// ReadEvents is Read with each event decoded (events.Decode, which checks the event's own
// checksum and its sequence).
func (r *Reader) ReadEvents(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return r.Read(ctx, from, to, func(seq uint64, wire []byte) error {
		ev, err := events.Decode(wire, seq)
		if err != nil {
			return fmt.Errorf("archive %s: %w", r.dir, err)
		}
		return fn(ev)
	})
}

// Check reads and decodes every archived event: every checksum, every copy.
func (r *Reader) Check(ctx context.Context) error {
	return r.ReadEvents(ctx, 0, 0, func(events.Event) error { return nil })
}

// record is one record of a loaded frame.
type record struct {
	seq  uint64
	wire []byte
}

// cursor walks a loaded frame's records in [from, to].
type cursor struct {
	f    *frame
	recs []record
	i    int
}

func (c *cursor) seq() uint64      { return c.recs[c.i].seq }
func (c *cursor) wire() []byte     { return c.recs[c.i].wire }
func (c *cursor) next() bool       { c.i++; return c.i < len(c.recs) }
func (h cursorHeap) Len() int      { return len(h) }
func (h cursorHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h cursorHeap) Less(i, j int) bool {
	return cmp.Or(cmp.Compare(h[i].seq(), h[j].seq()), cmp.Compare(h[i].f.off, h[j].f.off)) < 0
}
func (h *cursorHeap) Push(x any) { *h = append(*h, x.(*cursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

type cursorHeap []*cursor

// load reads, checks and decodes f's records in [from, to]; nil when it has none there.
func (r *Reader) load(f *frame, dec *zstd.Decoder, from, to uint64) (*cursor, error) {
	path := f.seg.path
	stored := make([]byte, f.h.stored)
	if err := readAt(r.fs, path, stored, f.payloadOff()); err != nil {
		return nil, err
	}
	if got := crc(stored); got != f.h.payloadCRC {
		return nil, corrupt(path, f.payloadOff(), "payload checksum %08x, want %08x", got, f.h.payloadCRC)
	}
	raw := stored
	if f.h.codec == codecZstd {
		var err error
		if raw, err = inflate(dec, stored, f.h.raw); err != nil {
			return nil, corrupt(path, f.payloadOff(), "the payload of the frame at offset %d does not decompress to its %d bytes: %v", f.off, f.h.raw, err)
		}
	}
	recs := make([]record, 0, f.h.count)
	runs := f.runs
	var prev uint64
	for off := 0; off < len(raw); {
		at := f.payloadOff() // offsets inside a compressed payload are not file offsets
		if f.h.codec == codecNone {
			at += int64(off)
		}
		if len(raw)-off < recordOverhead {
			return nil, corrupt(path, at, "record truncated")
		}
		seq := binary.BigEndian.Uint64(raw[off:])
		n := int(binary.BigEndian.Uint32(raw[off+8:]))
		if len(raw)-off-recordOverhead < n {
			return nil, corrupt(path, at, "record of seq %d truncated", seq)
		}
		end := off + 12 + n
		if got, want := crc(raw[off:end]), binary.BigEndian.Uint32(raw[end:]); got != want {
			return nil, corrupt(path, at, "record of seq %d: checksum %08x, want %08x", seq, got, want)
		}
		for len(runs) > 0 && runs[0].To < seq {
			runs = runs[1:]
		}
		if seq <= prev || len(runs) == 0 || runs[0].From > seq {
			return nil, corrupt(path, at, "record of seq %d is out of order or not in the frame's runs", seq)
		}
		prev = seq
		if seq >= from && seq <= to {
			recs = append(recs, record{seq, raw[off+12 : end]})
		}
		off = end + 4
	}
	if n := countRecords(raw); n != int(f.h.count) || prev != f.h.last {
		return nil, corrupt(path, f.off, "frame holds %d records up to seq %d, its header says %d up to %d", n, prev, f.h.count, f.h.last)
	}
	if len(recs) == 0 {
		return nil, nil
	}
	return &cursor{f: f, recs: recs}, nil
}

// newDecoder returns the decoder of frames' payloads. DecodeAll stops at the capacity of the
// buffer it is given (inflate gives the frame's declared raw length): a payload that inflates
// further, a zstd bomb, is refused having decoded at most one block (128 KiB) past it,
// instead of growing its output to the decoder's memory limit. Its window and memory are
// bounded by the largest frame (maxFrameRaw), whatever a zstd frame declares.
func newDecoder() (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxFrameRaw),
		zstd.WithDecoderMaxWindow(maxFrameRaw), zstd.WithDecodeAllCapLimit(true))
}

// inflate decompresses a frame's payload, which its header says holds raw bytes: exactly
// that many, or an error. A zstd frame that declares another content size is refused before
// anything is decoded; one that declares none, or lies, is stopped at raw bytes (newDecoder).
func inflate(dec *zstd.Decoder, stored []byte, raw uint32) ([]byte, error) {
	var zh zstd.Header
	if err := zh.Decode(stored); err != nil {
		return nil, err
	}
	if zh.HasFCS && zh.FrameContentSize != uint64(raw) {
		return nil, fmt.Errorf("its zstd frame declares %d bytes", zh.FrameContentSize)
	}
	out, err := dec.DecodeAll(stored, make([]byte, 0, raw))
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrFrameSizeExceeded) || len(out) > int(raw) {
		return nil, fmt.Errorf("it inflates past them")
	}
	if err != nil {
		return nil, err
	}
	if len(out) != int(raw) {
		return nil, fmt.Errorf("it decompresses to %d", len(out))
	}
	return out, nil
}

func countRecords(raw []byte) int {
	n := 0
	for off := 0; off+recordOverhead <= len(raw); n++ {
		off += recordOverhead + int(binary.BigEndian.Uint32(raw[off+8:]))
	}
	return n
}
