package archive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// wire returns the wire bytes of a submit at seq (the archive stores any event's bytes).
func wire(t testing.TB, seq uint64) []byte {
	t.Helper()
	b, err := events.Encode(&events.TaskSubmitted{
		Header: events.Header{Seq: seq, SessionID: fmt.Sprintf("s%d", seq%7), At: 1_700_000_000_000_000_000 + int64(seq)*1e6},
		TaskID: fmt.Sprintf("task-%06d", seq), Kind: "email", Input: []byte(fmt.Sprintf(`{"to":"user%d@example.com","n":%d}`, seq%50, seq)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// commit adds seqs (ascending) and commits them.
func commit(t testing.TB, w *Writer, seqs ...uint64) {
	t.Helper()
	for _, s := range seqs {
		if err := w.Add(s, wire(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
}

// readAll returns what r reads in [from, to], checking each event is the one wire makes.
func readAll(t testing.TB, r *Reader, from, to uint64) []uint64 {
	t.Helper()
	var got []uint64
	err := r.Read(context.Background(), from, to, func(seq uint64, b []byte) error {
		if !bytes.Equal(b, wire(t, seq)) {
			return fmt.Errorf("seq %d: bytes differ", seq)
		}
		got = append(got, seq)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func seqs(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	for _, nocomp := range []bool{false, true} {
		t.Run(fmt.Sprintf("nocompression=%v", nocomp), func(t *testing.T) {
			dir := t.TempDir()
			o := &WriterOptions{NoCompression: nocomp, FrameBytes: 1 << 10, SegmentBytes: 2 << 10}
			w, err := OpenWriter(dir, o)
			if err != nil {
				t.Fatal(err)
			}
			// Groups interleave in seq (a later group prunes older seqs), one is archived
			// twice (a crash before the prune's commit), frames and segments roll.
			commit(t, w, append(seqs(1, 40), seqs(100, 130)...)...)
			commit(t, w, seqs(41, 99)...)
			commit(t, w, seqs(41, 60)...)
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			w, err = OpenWriter(dir, o) // a new segment
			if err != nil {
				t.Fatal(err)
			}
			commit(t, w, 200, 202, 204)
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			r, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			want := append(seqs(1, 130), 200, 202, 204)
			if got := readAll(t, r, 0, 0); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("read %v\nwant %v", got, want)
			}
			if got := readAll(t, r, 55, 201); fmt.Sprint(got) != fmt.Sprint(append(seqs(55, 130), 200)) {
				t.Fatalf("read [55, 201]: %v", got)
			}
			wantRanges := projection.SeqRanges{{From: 1, To: 130}, {From: 200, To: 200}, {From: 202, To: 202}, {From: 204, To: 204}}
			if fmt.Sprint(r.Ranges()) != fmt.Sprint(wantRanges) || r.Events() != 133 {
				t.Fatalf("ranges %v (%d events)", r.Ranges(), r.Events())
			}
			if len(r.Segments()) < 3 {
				t.Fatalf("segments %+v: want the writer to roll", r.Segments())
			}
			if m := r.Missing(projection.SeqRanges{{From: 1, To: 210}}); fmt.Sprint(m) != "[{131 199} {201 201} {203 203} {205 210}]" {
				t.Fatalf("missing %v", m)
			}
			if err := r.Check(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestWriterLocked(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := OpenWriter(dir, nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("second writer: %v, want ErrLocked", err)
	}
}

// A copy of a sequence that differs from another is corruption, not a choice.
func TestDifferingCopiesRefused(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, 1, 2, 3)
	if err := w.Add(2, wire(t, 99)); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Read(context.Background(), 0, 0, func(uint64, []byte) error { return nil })
	var ae *Error
	if !errors.As(err, &ae) || !errors.Is(err, ErrCorrupt) || filepath.Base(ae.File) != "seg-000001.wla" {
		t.Fatalf("differing copies: %v", err)
	}
}

// twoSegments writes an archive of two segments (the first closed, the second the last)
// and returns the dir and the first segment's path.
func twoSegments(t *testing.T, nocomp bool) (string, string) {
	dir := t.TempDir()
	o := &WriterOptions{NoCompression: nocomp}
	w, err := OpenWriter(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, seqs(1, 20)...)
	commit(t, w, seqs(21, 40)...)
	w.Close()
	w, err = OpenWriter(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, seqs(41, 60)...)
	w.Close()
	return dir, filepath.Join(dir, "seg-000001.wla")
}

// Damage anywhere in a segment before its recorded end is refused with an *Error naming
// the file, whether Open finds it (headers, runs) or a read does (payload, records).
func TestDamageRefused(t *testing.T) {
	for _, nocomp := range []bool{false, true} {
		dir, seg := twoSegments(t, nocomp)
		orig, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		// Every byte of the headers and the first frame's index, then a sample.
		for off := 0; off < len(orig); off += map[bool]int{true: 1, false: 11}[off < 160] {
			b := bytes.Clone(orig)
			b[off] ^= 0x40
			if err := os.WriteFile(seg, b, 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := Open(dir)
			if err == nil {
				err = r.Check(context.Background())
			}
			var ae *Error
			var de *events.DecodeError
			switch {
			case errors.As(err, &ae):
				if ae.File != seg || !errors.Is(err, ErrCorrupt) {
					t.Fatalf("nocomp=%v flip at %d: %v names %s", nocomp, off, err, ae.File)
				}
			case errors.As(err, &de) && nocomp:
				// a flip inside an event's bytes with the record checksum intact cannot
				// happen (the record checksum covers them); fall through to fail
				t.Fatalf("nocomp=%v flip at %d: decode error %v before the record checksum", nocomp, off, err)
			default:
				t.Fatalf("nocomp=%v flip at %d: %v, want an *archive.Error", nocomp, off, err)
			}
		}
		if err := os.WriteFile(seg, orig[:len(orig)-10], 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(dir); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a closed segment cut short: %v", err)
		}
	}
}

// The last segment's torn tail (a write never fsynced) is dropped; the next writer records
// where its valid part ends, so that the tail is never read as damage.
func TestTornTailDropped(t *testing.T) {
	dir, _ := twoSegments(t, false)
	last := filepath.Join(dir, "seg-000002.wla")
	b, err := os.ReadFile(last)
	if err != nil {
		t.Fatal(err)
	}
	b = b[:len(b)-sealLen] // a crash, not a Close, ended its writer
	// A frame written after the last one, half of it on disk.
	w, err := OpenWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, seqs(61, 80)...)
	w.Close()
	full, _ := os.ReadFile(filepath.Join(dir, "seg-000003.wla"))
	os.Remove(filepath.Join(dir, "seg-000003.wla"))
	torn := append(bytes.Clone(b), full[segHeaderLen:segHeaderLen+(len(full)-segHeaderLen)/2]...)
	if err := os.WriteFile(last, torn, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, r, 0, 0); fmt.Sprint(got) != fmt.Sprint(seqs(1, 60)) {
		t.Fatalf("read %v", got)
	}
	if s := r.Segments(); s[1].TornBytes != int64(len(torn)-len(b)) {
		t.Fatalf("segments %+v", s)
	}
	w, err = OpenWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, seqs(61, 70)...)
	w.Close()
	r, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, r, 0, 0); fmt.Sprint(got) != fmt.Sprint(seqs(1, 70)) {
		t.Fatalf("read %v", got)
	}
	// The torn tail of segment 2 is now known to be one: flipping a byte in it is no damage,
	// flipping one before it is.
	torn[len(torn)-3] ^= 1
	os.WriteFile(last, torn, 0o644)
	if _, err := Open(dir); err != nil {
		t.Fatalf("a flip in a recorded tail: %v", err)
	}
	torn[segHeaderLen+5] ^= 1
	os.WriteFile(last, torn, 0o644)
	if _, err := Open(dir); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a flip before a recorded tail: %v", err)
	}
}

func TestMissingSegmentRefused(t *testing.T) {
	dir := t.TempDir()
	for range 3 {
		w, err := OpenWriter(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		commit(t, w, 1)
		w.Close()
	}
	os.Remove(filepath.Join(dir, "seg-000002.wla"))
	_, err := Open(dir)
	var ae *Error
	if !errors.As(err, &ae) || filepath.Base(ae.File) != "seg-000002.wla" {
		t.Fatalf("missing middle segment: %v", err)
	}
	// An archive whose oldest segments were removed on purpose still opens.
	os.Remove(filepath.Join(dir, "seg-000001.wla"))
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
}

// A crash keeps exactly what was committed: every Commit fsyncs the segment and, for a
// new one, the directory.
func TestCrashKeepsCommitted(t *testing.T) {
	newFS := func() vfs.FS {
		fs := vfs.NewCrashableMem()
		if err := fs.MkdirAll("/a", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syncDir(fs, "/"); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	fs := newFS().(*vfs.MemFS)
	for _, pct := range []int{0, 50, 100} {
		w, err := OpenWriter("/a/arch", &WriterOptions{FS: fs, FrameBytes: 512})
		if err != nil {
			t.Fatal(err)
		}
		commit(t, w, seqs(1, 30)...)
		for _, s := range seqs(31, 60) {
			if err := w.Add(s, wire(t, s)); err != nil {
				t.Fatal(err)
			}
		}
		// Frames of 31..60 are written (FrameBytes is small) but not committed.
		clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(pct), 1))})
		w.Close()
		r, err := OpenFS(clone, "/a/arch")
		if err != nil {
			t.Fatalf("pct %d: %v", pct, err)
		}
		got := readAll(t, r, 0, 0)
		if len(got) < 30 || fmt.Sprint(got[:30]) != fmt.Sprint(seqs(1, 30)) {
			t.Fatalf("pct %d: read %v", pct, got)
		}
		// A writer on the clone goes on after the valid part.
		w2, err := OpenWriter("/a/arch", &WriterOptions{FS: clone})
		if err != nil {
			t.Fatal(err)
		}
		commit(t, w2, seqs(31, 60)...)
		w2.Close()
		r, err = OpenFS(clone, "/a/arch")
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, r, 0, 0); fmt.Sprint(got) != fmt.Sprint(seqs(1, 60)) {
			t.Fatalf("pct %d after a second writer: %v", pct, got)
		}
		fs = newFS().(*vfs.MemFS)
	}
}

func TestGet(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{FrameBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, 1, 2, 3, 10, 11)
	commit(t, w, 5, 6)
	w.Close()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, s := range []uint64{11, 1, 6, 2, 10, 5, 3} {
		b, ok, err := r.Get(s)
		if err != nil || !ok || !bytes.Equal(b, wire(t, s)) {
			t.Fatalf("Get(%d): %v %v", s, ok, err)
		}
	}
	for _, s := range []uint64{0, 4, 7, 12} {
		if _, ok, err := r.Get(s); ok || err != nil {
			t.Fatalf("Get(%d): %v %v", s, ok, err)
		}
	}
}

// A segment its writer closed is sealed: damage in its last frame is refused, not taken
// for a torn tail; without the seal (a crash) the same bytes are a torn tail.
func TestSealedLastSegment(t *testing.T) {
	dir, _ := twoSegments(t, false)
	last := filepath.Join(dir, "seg-000002.wla")
	b, _ := os.ReadFile(last)
	b[len(b)-sealLen-3] ^= 1
	os.WriteFile(last, b, 0o644)
	r, err := Open(dir)
	if err == nil {
		err = r.Check(context.Background())
	}
	var ae *Error
	if !errors.As(err, &ae) || ae.File != last {
		t.Fatalf("damage in a sealed last segment: %v", err)
	}
	os.WriteFile(last, b[:len(b)-sealLen], 0o644)
	r, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, r, 0, 0); fmt.Sprint(got) != fmt.Sprint(seqs(1, 40)) {
		t.Fatalf("read %v", got)
	}
}

// Damage in an archive does not stop its writer: a new segment follows, and readers still
// refuse the damaged bytes, naming the file.
func TestWriterOpensOverDamage(t *testing.T) {
	dir, first := twoSegments(t, false)
	b, _ := os.ReadFile(first)
	b[segHeaderLen+1] ^= 1 // a frame header of a closed segment
	os.WriteFile(first, b, 0o644)
	last := filepath.Join(dir, "seg-000002.wla")
	lb, _ := os.ReadFile(last)
	lb[segHeaderLen+1] ^= 1 // and of the sealed last one
	os.WriteFile(last, lb, 0o644)
	w, err := OpenWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, 100)
	w.Close()
	_, err = Open(dir)
	var ae *Error
	if !errors.As(err, &ae) || (ae.File != first && ae.File != last) {
		t.Fatalf("after a writer went on: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "seg-000003.wla")); err != nil {
		t.Fatal(err)
	}
}

// A payload zstd does not shrink is stored raw: no frame is stored larger than its raw
// bytes, so the reader's one bound (maxFrameRaw) holds for both lengths. Readers read it as
// any frame.
func TestIncompressibleFrameStoredRaw(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	noise := make([]byte, 64<<10)
	for i := range noise {
		noise[i] = byte(rand.Uint32())
	}
	if err := w.Add(1, noise); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, segName(1)))
	if err != nil {
		t.Fatal(err)
	}
	h, err := parseFrameHeader("seg", segHeaderLen, b[segHeaderLen:])
	if err != nil || h.codec != codecNone || h.stored != h.raw {
		t.Fatalf("frame %+v (%v): want codec none, stored = raw", h, err)
	}
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, ok, err := r.Get(1)
	if err != nil || !ok || !bytes.Equal(got, noise) {
		t.Fatalf("Get: %v %v, %d bytes", ok, err, len(got))
	}
}
