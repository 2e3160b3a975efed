package archive

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/worklog/worklog/projection"
)

// zstdBomb is a hand-made zstd frame of RLE blocks: n blocks of 128 KiB each from 4 stored
// bytes, so 8 KiB inflate to 256 MiB. fcs, when not 0, is the content size the frame
// declares (a lie when it differs from n*128 KiB).
func zstdBomb(n int, fcs uint32) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd} // the zstd frame magic, little-endian
	if fcs != 0 {
		b = append(b, 0x80, 7<<3) // a 4-byte content size; window 128 KiB
		b = binary.LittleEndian.AppendUint32(b, fcs)
	} else {
		b = append(b, 0x00, 7<<3) // no content size; window 128 KiB
	}
	const blockMax = 128 << 10
	for i := range n {
		hdr := uint32(1<<1) | blockMax<<3 // an RLE block of 128 KiB
		if i == n-1 {
			hdr |= 1 // the last block
		}
		b = append(b, byte(hdr), byte(hdr>>8), byte(hdr>>16), 'A')
	}
	return b
}

// bombSegment writes an archive of one sealed segment whose one frame, every checksum valid,
// declares raw bytes of payload and stores payload (zstd).
func bombSegment(t *testing.T, raw uint32, payload []byte) string {
	t.Helper()
	dir := t.TempDir()
	b := appendSegHeader(nil, 1, 0)
	runs := appendRuns(nil, []projection.SeqRange{{From: 1, To: 1}})
	h := frameHeader{codec: codecZstd, count: 1, runsLen: uint32(len(runs)), stored: uint32(len(payload)), raw: raw,
		first: 1, last: 1, runsCRC: crc(runs), payloadCRC: crc(payload)}
	b = appendFrameHeader(b, &h)
	b = append(b, runs...)
	b = append(b, payload...)
	b = appendSeal(b, int64(len(b)))
	if err := os.WriteFile(filepath.Join(dir, segName(1)), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestZstdBombRefused: a frame whose payload inflates far past the raw length its header
// declares is refused as corrupt, naming the segment and the frame, having decoded no more
// than about that length (bounded allocation, not time: the test holds under load).
func TestZstdBombRefused(t *testing.T) {
	const inflated = 2048 // blocks of 128 KiB: 256 MiB
	for _, tc := range []struct {
		name    string
		payload []byte
	}{
		{"no content size", zstdBomb(inflated, 0)},
		{"content size of the frame", zstdBomb(inflated, 1<<20)},
		{"content size of the bomb", zstdBomb(inflated, inflated*128<<10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := bombSegment(t, 1<<20, tc.payload)
			r, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			for _, op := range []struct {
				name string
				fn   func() error
			}{
				{"Check", func() error { return r.Check(context.Background()) }},
				{"Get", func() error { _, _, err := r.Get(1); return err }},
			} {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				err := op.fn()
				runtime.ReadMemStats(&after)
				var ae *Error
				if !errors.As(err, &ae) || !errors.Is(err, ErrCorrupt) || ae.File != filepath.Join(dir, segName(1)) {
					t.Fatalf("%s: got %v, want an *Error of kind ErrCorrupt naming %s", op.name, err, segName(1))
				}
				if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
					t.Errorf("%s: allocated %d MiB to refuse a frame declaring 1 MiB (want at most 16 MiB)", op.name, alloc>>20)
				}
				if !strings.Contains(err.Error(), "frame at offset 32") {
					t.Errorf("%s: %v does not name the frame (at offset 32)", op.name, err)
				}
			}
		})
	}
}

// TestFIFOSegmentRefused: a FIFO where a segment should be is refused, not opened: opening
// it would block until something writes into it. The guard fails the test instead of
// hanging it when that regresses.
func TestFIFOSegmentRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int // the segments written before the FIFO
	}{{"only segment", 0}, {"after a segment", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.n > 0 {
				w, err := OpenWriter(dir, nil)
				if err != nil {
					t.Fatal(err)
				}
				commit(t, w, 1, 2, 3)
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			fifo := filepath.Join(dir, segName(uint32(tc.n+1)))
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			done := make(chan error, 1)
			go func() {
				r, err := Open(dir)
				if err == nil {
					r.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				var ae *Error
				if !errors.As(err, &ae) || ae.File != fifo || !strings.Contains(err.Error(), "not a regular file") {
					t.Fatalf("got %v, want an *Error naming %s: not a regular file", err, fifo)
				}
			case <-time.After(time.Minute):
				t.Fatal("Open blocked on the FIFO")
			}
		})
	}
}

// lyingSegment writes an archive of one segment whose one frame, every checksum valid,
// carries payload and a header edited by lie; sealed or not (an unsealed segment is the
// last one written, whose tail a crash may have torn).
func lyingSegment(t *testing.T, sealed bool, payload []byte, lie func(*frameHeader)) string {
	t.Helper()
	dir := t.TempDir()
	b := appendSegHeader(nil, 1, 0)
	runs := appendRuns(nil, []projection.SeqRange{{From: 1, To: 1}})
	h := frameHeader{codec: codecZstd, count: 1, runsLen: uint32(len(runs)), stored: uint32(len(payload)), raw: 1 << 10,
		first: 1, last: 1, runsCRC: crc(runs), payloadCRC: crc(payload)}
	lie(&h)
	if h.runsLen != uint32(len(runs)) {
		runs = appendRuns(nil, []projection.SeqRange{{From: h.first, To: h.last}})
		h.runsLen, h.runsCRC = uint32(len(runs)), crc(runs)
	}
	b = appendFrameHeader(b, &h)
	b = append(b, runs...)
	b = append(b, payload...)
	if sealed {
		b = appendSeal(b, int64(len(b)))
	}
	if err := os.WriteFile(filepath.Join(dir, segName(1)), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLyingLengthsRefused: a frame header, its checksum valid, that claims a length no
// Writer writes (a raw payload of 1e9 or 4e9 bytes, a stored one of 1e9 or 4e9 bytes, 1e7
// records in a few bytes) is refused as corrupt, naming the file and the offset of the
// field, before anything is allocated for the frame (the bytes allocated by Open, Check and
// Get together stay under 1 MiB); in a sealed segment and in the last, unsealed one alike,
// where a header whose checksum holds is not a torn write.
func TestLyingLengthsRefused(t *testing.T) {
	small := zstdBomb(1, 0) // 128 KiB of 'A', no content size: a decoder knows only the header's raw
	for _, tc := range []struct {
		name    string
		payload []byte
		lie     func(*frameHeader)
		field   int64 // the offset of the field in the frame header
	}{
		{"raw 1e9", small, func(h *frameHeader) { h.raw = 1e9 }, 20},
		{"raw 4e9", small, func(h *frameHeader) { h.raw = 4e9 }, 20},
		{"stored 1e9", small, func(h *frameHeader) { h.stored = 1e9 }, 16},
		{"stored 4e9", small, func(h *frameHeader) { h.stored = 4e9 }, 16},
		{"records 1e7", []byte("0123456789abcdef"), func(h *frameHeader) {
			h.codec, h.raw, h.stored, h.count, h.last, h.runsLen = codecNone, 16, 16, 1e7, 1e7, 0
		}, 8},
	} {
		for _, sealed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/sealed=%v", tc.name, sealed), func(t *testing.T) {
				dir := lyingSegment(t, sealed, tc.payload, tc.lie)
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				r, err := Open(dir)
				if err == nil {
					err = r.Check(context.Background())
					if _, _, gerr := r.Get(1); err == nil {
						err = gerr
					}
					r.Close()
				}
				runtime.ReadMemStats(&after)
				if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
					t.Errorf("allocated %d KiB to refuse the frame (want at most 1 MiB)", alloc>>10)
				}
				var ae *Error
				if !errors.As(err, &ae) || !errors.Is(err, ErrCorrupt) || ae.File != filepath.Join(dir, segName(1)) || ae.Offset != segHeaderLen+tc.field {
					t.Errorf("got %v, want an *Error of kind ErrCorrupt naming %s at offset %d", err, segName(1), segHeaderLen+tc.field)
				}
			})
		}
	}
}
