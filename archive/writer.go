package archive

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/zstd"

	"github.com/worklog/worklog/projection"
)

// WriterOptions configures OpenWriter. A nil *WriterOptions means all defaults.
type WriterOptions struct {
	// FS is the filesystem. Default vfs.Default.
	FS vfs.FS
	// SegmentBytes is the size from which the writer starts a new segment. Default 64 MiB.
	SegmentBytes int64
	// FrameBytes is the raw size from which a frame is closed and a new one begun (one
	// event larger than it is a frame of its own). Default 1 MiB; at most 72 MiB, the
	// largest frame a reader accepts (a larger value is taken as 72 MiB).
	FrameBytes int
	// NoCompression stores payloads as they are instead of zstd-compressed.
	NoCompression bool
}

const (
	defaultSegmentBytes = 64 << 20
	defaultFrameBytes   = 1 << 20
)

// lockName is the archive's lock file: one Writer per archive, across processes.
const lockName = "LOCK"

// Writer appends events to an archive. Events are added in ascending sequence within a
// Commit; Commit writes what was added and fsyncs it. A Writer is not safe for concurrent
// use.
type Writer struct {
	fs   vfs.FS
	dir  string
	o    WriterOptions
	lock io.Closer
	enc  *zstd.Encoder

	f         vfs.File // the open segment; nil before the first Add and after a failure
	n         uint32   // the open segment's number
	size      int64    // bytes written to the open segment
	committed int64    // its length at the last successful Commit, 0 before one
	nextN     uint32   // the number of the next segment to create
	nextPrev  uint64   // the valid length of the segment before it, for its header
	dirDirty  bool     // a segment was created since the directory was last synced

	buf  []byte // the current frame's raw records
	seqs []uint64
	last uint64 // the last seq added since Commit
	out  []byte // scratch for a frame as written
	err  error  // a failed write: the next Add starts a new segment
}

// OpenWriter opens the archive in dir for appending, creating dir if needed. It locks the
// archive (ErrLocked if another Writer holds it) and reads its last segment to find where
// its valid frames end: the segment the writer starts records that length in its header
// (see the package doc).
func OpenWriter(dir string, o *WriterOptions) (*Writer, error) {
	var opts WriterOptions
	if o != nil {
		opts = *o
	}
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = defaultSegmentBytes
	}
	if opts.FrameBytes <= 0 {
		opts.FrameBytes = defaultFrameBytes
	}
	opts.FrameBytes = min(opts.FrameBytes, maxFrameRaw)
	fs := opts.FS
	if err := mkdirSynced(fs, dir); err != nil {
		return nil, fmt.Errorf("archive: creating %s: %w", dir, err)
	}
	lock, err := fs.Lock(fs.PathJoin(dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrLocked, fs.PathJoin(dir, lockName), err)
	}
	w := &Writer{fs: fs, dir: dir, o: opts, lock: lock, nextN: 1}
	err = w.findEnd()
	if err == nil && !opts.NoCompression {
		w.enc, err = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
	}
	if err != nil {
		lock.Close()
		return nil, err
	}
	return w, nil
}

// findEnd sets the number and header of the next segment from the last one written: its
// valid length when it has a valid frame; when it has none (a crash before its first Commit)
// its number again, with the header it had or, when that never reached the disk, the valid
// length of the one before. Only the last segments are read: damage in older ones is the
// readers' to report, not a reason to stop archiving; and damage in a sealed last segment
// is kept whole (its length recorded) so that readers refuse it, naming the file.
func (w *Writer) findEnd() error {
	nums, err := listSegments(w.fs, w.dir)
	if err != nil || len(nums) == 0 {
		return err
	}
	last := nums[len(nums)-1]
	path := w.fs.PathJoin(w.dir, segName(last))
	// A last segment that is not a regular file (a FIFO) read as damaged, and its size (0)
	// was taken for its valid length: the next segment claimed the one before it was empty.
	if err := checkRegular(w.fs, path); err != nil {
		return err
	}
	s, err := scanSegment(w.fs, path, last, -1)
	if errors.Is(err, ErrCorrupt) {
		fi, serr := w.fs.Stat(path)
		if serr != nil {
			return serr
		}
		w.nextN, w.nextPrev = last+1, uint64(fi.Size())
		return nil
	}
	if err != nil {
		return err
	}
	if s.valid > 0 {
		w.nextN, w.nextPrev = last+1, uint64(s.valid)
		return nil
	}
	w.nextN = last
	hdr := make([]byte, segHeaderLen)
	if readAt(w.fs, path, hdr, 0) == nil {
		if h, err := parseSegHeader(path, hdr); err == nil && h.n == last {
			w.nextPrev = h.prevLen
			return nil
		}
	}
	if len(nums) > 1 && nums[len(nums)-2] == last-1 {
		if err := checkRegular(w.fs, w.fs.PathJoin(w.dir, segName(last-1))); err != nil {
			return err
		}
		prev, err := scanSegment(w.fs, w.fs.PathJoin(w.dir, segName(last-1)), last-1, -1)
		if err == nil {
			w.nextPrev = uint64(prev.valid)
		} else if errors.Is(err, ErrCorrupt) {
			if fi, serr := w.fs.Stat(w.fs.PathJoin(w.dir, segName(last-1))); serr == nil {
				w.nextPrev = uint64(fi.Size())
			}
		} else {
			return err
		}
	}
	return nil
}

// ErrLocked: another Writer (in this process or another) holds the archive.
var ErrLocked = errors.New("archive: locked by another writer")

// Dir returns the archive's directory.
func (w *Writer) Dir() string { return w.dir }

// Add adds one event (its sequence and wire bytes, which Add copies) to the next Commit.
// Sequences must ascend within a Commit.
func (w *Writer) Add(seq uint64, wire []byte) error {
	if seq == 0 || seq <= w.last {
		return fmt.Errorf("archive: Add of seq %d after %d", seq, w.last)
	}
	if len(wire) > maxFrameRaw-recordOverhead {
		return fmt.Errorf("archive: event %d of %d bytes is too large (a frame holds %d)", seq, len(wire), maxFrameRaw)
	}
	if len(w.buf) > 0 && len(w.buf)+len(wire)+recordOverhead > w.o.FrameBytes {
		if err := w.flushFrame(); err != nil {
			return err
		}
	}
	w.last = seq
	w.buf = appendRecord(w.buf, seq, wire)
	w.seqs = append(w.seqs, seq)
	return nil
}

// Commit writes the frames added since the last Commit and fsyncs the segment (and the
// directory, when the segment is new): once it returns nil they are durable. After an
// error nothing since the last Commit counts; the next Add begins a new segment.
func (w *Writer) Commit() error {
	defer func() { w.last = 0 }()
	if len(w.buf) > 0 {
		if err := w.flushFrame(); err != nil {
			return err
		}
	}
	if w.f == nil || w.committed == w.size {
		return w.err
	}
	if err := w.f.Sync(); err != nil {
		return w.fail(err)
	}
	if w.dirDirty {
		if err := syncDir(w.fs, w.dir); err != nil {
			return w.fail(err)
		}
		w.dirDirty = false
	}
	w.committed = w.size
	if w.size >= w.o.SegmentBytes {
		return w.seal()
	}
	return nil
}

// seal ends the open segment with its seal, fsynced, and closes it: a reader then knows it
// has no torn tail. The next segment starts after it.
func (w *Writer) seal() error {
	if _, err := w.f.Write(appendSeal(nil, w.size)); err != nil {
		return w.fail(err)
	}
	if err := w.f.Sync(); err != nil {
		return w.fail(err)
	}
	w.size += sealLen
	w.committed = w.size
	w.nextN, w.nextPrev = w.n+1, uint64(w.size)
	err := w.f.Close()
	w.f = nil
	if err != nil {
		return w.fail(err)
	}
	return nil
}

// Abort drops what was added since the last Commit and not yet written.
func (w *Writer) Abort() {
	w.buf, w.seqs, w.last = w.buf[:0], w.seqs[:0], 0
}

// Close seals and closes the open segment (when all of it was committed) and releases the
// lock. It does not commit what was added since the last Commit.
func (w *Writer) Close() error {
	var err error
	if w.f != nil && w.committed == w.size && w.committed > 0 {
		err = w.seal()
	} else if w.f != nil {
		err = w.f.Close()
		w.f = nil
	}
	if w.enc != nil {
		err = errors.Join(err, w.enc.Close())
	}
	return errors.Join(err, w.lock.Close())
}

func (w *Writer) fail(err error) error {
	w.err = fmt.Errorf("archive: writing %s: %w", w.fs.PathJoin(w.dir, segName(w.n)), err)
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	if w.committed > 0 { // what follows the last Commit in the segment never counts
		w.nextN, w.nextPrev = w.n+1, uint64(w.committed)
	} // else nothing of it counts: the next segment takes its number again
	w.Abort()
	return w.err
}

// flushFrame writes the current frame into the open segment, starting one if needed.
func (w *Writer) flushFrame() error {
	if w.f == nil {
		if err := w.startSegment(); err != nil {
			return err
		}
	}
	runs := projection.RunsOf(w.seqs)
	h := frameHeader{codec: codecNone, count: uint32(len(w.seqs)), raw: uint32(len(w.buf)),
		first: w.seqs[0], last: w.seqs[len(w.seqs)-1]}
	payload := w.buf
	if w.enc != nil {
		// A payload zstd does not shrink is stored raw: stored is never more than raw.
		if z := w.enc.EncodeAll(w.buf, make([]byte, 0, len(w.buf)/2)); len(z) < len(w.buf) {
			h.codec, payload = codecZstd, z
		}
	}
	out := appendRuns(w.out[:0], runs)
	h.runsLen, h.stored = uint32(len(out)), uint32(len(payload))
	h.runsCRC, h.payloadCRC = crc(out), crc(payload)
	w.out = out
	frame := appendFrameHeader(make([]byte, 0, frameHeaderLen+len(out)+len(payload)), &h)
	frame = append(append(frame, out...), payload...)
	w.buf, w.seqs = w.buf[:0], w.seqs[:0]
	if _, err := w.f.Write(frame); err != nil {
		return w.fail(err)
	}
	w.size += int64(len(frame))
	return nil
}

func (w *Writer) startSegment() error {
	n := w.nextN
	name := w.fs.PathJoin(w.dir, segName(n))
	f, err := w.fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		w.err = fmt.Errorf("archive: creating %s: %w", name, err)
		return w.err
	}
	hdr := appendSegHeader(nil, n, w.nextPrev)
	if _, err := f.Write(hdr); err != nil {
		f.Close()
		w.err = fmt.Errorf("archive: writing %s: %w", name, err)
		return w.err
	}
	w.f, w.n, w.size, w.committed, w.dirDirty, w.err = f, n, int64(len(hdr)), 0, true, nil
	return nil
}

// listSegments returns the numbers of dir's segments, ascending.
func listSegments(fs vfs.FS, dir string) ([]uint32, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	var out []uint32
	for _, name := range names {
		if n, ok := parseSegName(name); ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// mkdirSynced creates dir and syncs its parent when it did not exist.
func mkdirSynced(fs vfs.FS, dir string) error {
	if _, err := fs.Stat(dir); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return syncDir(fs, fs.PathDir(dir))
}
