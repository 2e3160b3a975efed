package pebblelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/batchrepr"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// WAL damage detection (docs/design.md §7.2, §7.5).
//
// Pebble replays the WALs at Open and stops at the first chunk that does not check out. For
// the newest WAL it then treats that point as the torn tail of writes a crash cut short,
// unless a chunk further on says (in its "synced offset", written since FormatWALSyncChunks)
// that the log had been synced past it. But it only looks for such chunks from the next
// 32 KiB block on, and only up to the first bad chunk of each block: a flipped byte in a WAL
// smaller than one block, or in the last block of any WAL, silently drops every batch after
// it, acknowledged or not. A WAL deleted from the middle of the sequence, or one cut at a
// chunk boundary, is not noticed at all. checkWAL reads the same files before Pebble does and
// refuses the store (ErrCorruptStore, naming the file and the offset) whenever acknowledged
// work may be missing:
//
//   - the MANIFEST (read like Pebble does, but strictly: a bad chunk followed by an intact
//     edit is damage, not a torn tail) gives the oldest live WAL and the last sequence number
//     Pebble assigned before its last version edit;
//   - every live WAL but the newest must read cleanly up to the end-of-log trailer that
//     Pebble writes when it closes a WAL;
//   - the newest WAL may end early only when nothing after the stopping point proves that the
//     log had been synced past it: an intact chunk of this log whose synced offset lies
//     beyond the point, or the end-of-log trailer where it directly follows a chunk of this
//     log (trailerFollowsChunk). Every byte after the point is searched,
//     not only the following blocks (walEvidence);
//   - the batches' sequence numbers run without a gap through the live WALs, starting no
//     later than just after the MANIFEST's last sequence number: a missing WAL, or one cut
//     at a chunk boundary before a later WAL, leaves a gap;
//   - after a clean close, Store.Close records the MANIFEST's size and every live WAL's size
//     (cleanCloseFile). While those files are still current, each must still have that size
//     and read cleanly to its end: this catches what no check inside the WAL can, a newest WAL
//     cut at a chunk boundary, deleted, or damaged in its very last record.
//
// What remains undetectable is in design.md §7.5.

// cleanCloseFile is written by Store.Close after Pebble closed cleanly: the MANIFEST and the
// live WALs as they were then. It is only ever checked against files Pebble does not change
// afterwards (a MANIFEST only grows; a WAL that existed at Open is never written again), so
// a record left over from an earlier close is harmless.
const cleanCloseFile = "WORKLOG.closed"

const cleanCloseHeader = "worklog clean close 1"

// The WAL and MANIFEST chunk format (github.com/cockroachdb/pebble/v2/record, record.go).
const (
	walBlockSize        = 32 << 10
	legacyHeaderLen     = 7  // checksum 4, length 2, type 1
	recyclableHeaderLen = 11 // + log number 4
	walSyncHeaderLen    = 19 // + synced offset 8

	chunkFull, chunkFirst, chunkMiddle, chunkLast = 1, 2, 3, 4 // legacy types; +4 recyclable, +8 WAL sync
	recyclableFull                                = 5
	walSyncLastType                               = 12
)

// pebbleSeqNumStart is the first sequence number Pebble assigns in a new database
// (base.SeqNumStart, internal): the numbers below it are reserved.
const pebbleSeqNumStart = 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// chunkCRC is the masked CRC-32C Pebble stores in a chunk header (internal/crc).
func chunkCRC(b []byte) uint32 {
	c := crc32.Update(0, castagnoli, b)
	return (c>>15 | c<<17) + 0xa282ead8
}

// logEnd says how a scan of a log file ended.
type logEnd int

const (
	endEOF     logEnd = iota // the file ended after a whole record
	endTrailer               // Pebble's end-of-log trailer: the log was closed cleanly
	endInvalid               // a chunk that does not check out, or the file ends inside a record
)

// logScan is what scanLog found in one log file.
type logScan struct {
	size    int64
	end     logEnd
	endOff  int64  // where the scan stopped: the trailer, the end of the file, or the bad chunk
	why     string // for endInvalid: what is wrong at endOff
	records [][]byte
	offs    []int64 // where each record starts
}

// scanLog reads a log file chunk by chunk, as Pebble's record.Reader does but without
// skipping anything: it stops at the first chunk that does not check out. walNum is the
// WAL's number (its recyclable chunks must carry it; a chunk carrying walNum+1 at a record
// start is the end-of-log trailer), or 0 for the MANIFEST, which uses legacy chunks. keep
// is how many bytes of each record to keep (-1: all; a WAL's batch header is enough).
func scanLog(data []byte, walNum uint32, keep int) logScan {
	s := logScan{size: int64(len(data))}
	// A writer pads the end of a block with zeros when the next chunk header would not fit:
	// record.Writer (the MANIFEST) when fewer than legacyHeaderLen bytes are left, Pebble's
	// WAL writer when fewer than its header size are: walSyncHeaderLen, or
	// recyclableHeaderLen for a WAL written before the store's format reached
	// FormatWALSyncChunks (a new store's first WAL is). So a zero header with fewer than
	// walSyncHeaderLen bytes left in the block is padding, as Pebble's reader takes it.
	pad := legacyHeaderLen
	if walNum != 0 {
		pad = walSyncHeaderLen
	}
	var rec []byte
	recStart := int64(-1) // offset of the current record's first chunk; -1 between records
	off := 0
	invalid := func(at int, why string) logScan {
		if recStart >= 0 {
			at = int(recStart) // the whole record is lost with its bad chunk
		}
		s.end, s.endOff, s.why = endInvalid, int64(at), why
		return s
	}
	for {
		blockEnd := (off/walBlockSize + 1) * walBlockSize
		if off == len(data) {
			if recStart >= 0 {
				return invalid(off, "the file ends inside a record")
			}
			s.end, s.endOff = endEOF, int64(off)
			return s
		}
		if rest := data[off:min(blockEnd, len(data))]; len(rest) < legacyHeaderLen ||
			(len(rest) < pad && allZero(rest[:legacyHeaderLen])) {
			if !allZero(rest) {
				return invalid(off, "non-zero bytes in the padding at the end of a block")
			}
			off += len(rest)
			continue
		}
		h := data[off:]
		sum := binary.LittleEndian.Uint32(h[0:4])
		length := int(binary.LittleEndian.Uint16(h[4:6]))
		typ := h[6]
		hlen := legacyHeaderLen
		switch {
		case typ >= 1 && typ <= 4:
		case typ >= 5 && typ <= 8:
			hlen = recyclableHeaderLen
		case typ >= 9 && typ <= walSyncLastType:
			hlen = walSyncHeaderLen
		case sum == 0 && length == 0 && typ == 0:
			return invalid(off, "zeroed chunk header")
		default:
			return invalid(off, fmt.Sprintf("chunk type %d", typ))
		}
		if hlen > legacyHeaderLen {
			if walNum == 0 {
				return invalid(off, "a recyclable chunk in a MANIFEST")
			}
			if len(data)-off < hlen || blockEnd-off < hlen {
				return invalid(off, "a cut chunk header")
			}
			n := binary.LittleEndian.Uint32(h[7:11])
			if n == walNum+1 && recStart < 0 {
				// Pebble's end-of-log trailer (or any chunk of the next log number at a
				// record start, which Pebble's reader also takes for the end).
				s.end, s.endOff = endTrailer, int64(off)
				return s
			}
			if n != walNum {
				return invalid(off, fmt.Sprintf("a chunk of log %d (a recycled file's old contents, or damage)", n))
			}
		}
		end := off + hlen + length
		if end > min(blockEnd, len(data)) {
			return invalid(off, "a chunk longer than its block or the file")
		}
		if chunkCRC(data[off+6:end]) != sum {
			return invalid(off, "checksum mismatch")
		}
		pos := (int(typ)-1)%4 + 1
		switch {
		case recStart < 0 && (pos == chunkFull || pos == chunkFirst):
			recStart = int64(off)
			rec = rec[:0]
		case recStart >= 0 && (pos == chunkMiddle || pos == chunkLast):
		default:
			return invalid(off, "chunks out of order")
		}
		if keep < 0 || len(rec) < keep {
			rec = append(rec, data[off+hlen:end]...)
		}
		if pos == chunkFull || pos == chunkLast {
			if keep >= 0 && len(rec) > keep {
				rec = rec[:keep]
			}
			s.records = append(s.records, slices.Clone(rec))
			s.offs = append(s.offs, recStart)
			recStart = -1
		}
		off = end
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// walEvidence searches every offset after from for proof that the WAL had been synced past
// from, and returns a description of the first found, or "". The proof is an intact WAL sync
// chunk of this log whose synced offset lies beyond from (Pebble writes into each chunk how
// far the log had been synced before it was written), or the end-of-log trailer, which Pebble
// writes only when it closes and syncs the log.
//
// An intact chunk without such proof is no evidence: a machine crash may write back a later
// page of unsynced data and lose an earlier one, which leaves a hole with intact chunks after
// it, all of writes never synced (work's TestCrashClone makes exactly such clones). Pebble's
// read-ahead uses the same proof, but only from the next 32 KiB block on, and only up to the
// first bad chunk of each block; this searches every offset after from.
func walEvidence(data []byte, walNum uint32, from int64) string {
	for q := int(from) + 1; q+recyclableHeaderLen <= len(data); q++ {
		h := data[q:]
		typ := h[6]
		if typ != recyclableFull && (typ < 9 || typ > walSyncLastType) {
			continue
		}
		n := binary.LittleEndian.Uint32(h[7:11])
		sum := binary.LittleEndian.Uint32(h[0:4])
		length := int(binary.LittleEndian.Uint16(h[4:6]))
		if typ == recyclableFull {
			if n == walNum+1 && sum == 0 && length == 0 && trailerFollowsChunk(data, walNum, from, q) {
				return fmt.Sprintf("the end-of-log trailer at offset %d shows the log was closed, and synced, after it", q)
			}
			continue
		}
		blockEnd := (q/walBlockSize + 1) * walBlockSize
		end := q + walSyncHeaderLen + length
		if n != walNum || end > min(blockEnd, len(data)) || chunkCRC(data[q+6:end]) != sum {
			continue
		}
		if synced := binary.LittleEndian.Uint64(h[11:19]); synced > uint64(from) {
			return fmt.Sprintf("an intact chunk at offset %d says the log had been synced up to offset %d", q, synced)
		}
	}
	return ""
}

// trailerFollowsChunk reports whether the trailer-like header at q directly follows a chunk
// of this log, as Pebble's end-of-log trailer always does (it is written where the last chunk
// ends, or at the next block after the zero padding). The header has no checksum: 11 bytes
// (zeros, type 5, walNum+1) can occur anywhere inside a batch's payload, in this log's
// records or in the old contents a recycled WAL file keeps after its new writes, and such a
// match is no proof of anything. The chunk must be intact, or be the damaged chunk itself:
// one reached from the stopping point by following the headers of this log's chunks.
func trailerFollowsChunk(data []byte, walNum uint32, from int64, q int) bool {
	// ends: where the chunk before the trailer may end. At a block start, anywhere in the
	// previous block's padding, which must be zeros.
	ends := []int{q}
	if q%walBlockSize == 0 {
		for e := q - 1; e > q-walSyncHeaderLen && e >= int(from) && data[e] == 0; e-- {
			ends = append(ends, e)
		}
	}
	// header parses a chunk header of this log at c: its end, or -1.
	header := func(c int) (end int, intact bool) {
		if c < 0 || c+recyclableHeaderLen > len(data) {
			return -1, false
		}
		h := data[c:]
		typ := h[6]
		hlen := recyclableHeaderLen
		switch {
		case typ >= 5 && typ <= 8:
		case typ >= 9 && typ <= walSyncLastType:
			hlen = walSyncHeaderLen
		default:
			return -1, false
		}
		if c+hlen > len(data) || binary.LittleEndian.Uint32(h[7:11]) != walNum {
			return -1, false
		}
		end = c + hlen + int(binary.LittleEndian.Uint16(h[4:6]))
		if end > min((c/walBlockSize+1)*walBlockSize, len(data)) {
			return -1, false
		}
		return end, chunkCRC(data[c+6:end]) == binary.LittleEndian.Uint32(h[0:4])
	}
	for _, e := range ends {
		// An intact chunk of this log ending at e.
		for c := max(int(from), (e-1)/walBlockSize*walBlockSize); c+recyclableHeaderLen <= e; c++ {
			if end, intact := header(c); end == e && intact {
				return true
			}
		}
	}
	// The damaged chunk: follow this log's chunk headers from the stopping point.
	for c := int(from); c < q; {
		if rest := walBlockSize - c%walBlockSize; rest < walSyncHeaderLen && allZero(data[c:min(c+rest, len(data))]) {
			c += rest
			continue
		}
		end, _ := header(c)
		if end < 0 {
			return false
		}
		if slices.Contains(ends, end) {
			return true
		}
		c = end
	}
	return false
}

// manifestEvidence reports whether an intact record start (a full or first chunk) follows
// from: the MANIFEST is synced after every edit and only one edit is written at a time, so
// a later edit means the damaged one had been synced.
func manifestEvidence(data []byte, from int64) int64 {
	for q := int(from) + 1; q+legacyHeaderLen <= len(data); q++ {
		h := data[q:]
		if typ := h[6]; typ != chunkFull && typ != chunkFirst {
			continue
		}
		length := int(binary.LittleEndian.Uint16(h[4:6]))
		end := q + legacyHeaderLen + length
		if end > min((q/walBlockSize+1)*walBlockSize, len(data)) {
			continue
		}
		if chunkCRC(data[q+6:end]) == binary.LittleEndian.Uint32(h[0:4]) {
			return int64(q)
		}
	}
	return -1
}

// manifestState is what checkWAL needs from the MANIFEST's version edits.
type manifestState struct {
	name           string // file name, relative to the store's directory
	size           int64
	minUnflushed   uint64 // the oldest WAL not yet flushed: WALs numbered below it are obsolete
	lastSeq        uint64 // the last sequence number assigned when the last edit was written
	cleanEnd       int64  // offset after the last record read
	tornAt         int64  // where an accepted torn tail starts; -1 if none
	tornWhy        string // what was wrong there
	recordsDecoded int
}

// Version edit tags (internal/manifest/version_edit.go). Pebble encodes the comparator, the
// log numbers, the next file number, the backing tables and the last sequence number first,
// in that order, so the fields checkWAL needs are read from each edit's prefix, without
// decoding the rest.
const (
	tagComparator          = 1
	tagLogNumber           = 2
	tagNextFileNumber      = 3
	tagLastSequence        = 4
	tagPrevLogNumber       = 9
	tagCreatedBackingTable = 105
	tagRemovedBackingTable = 106
)

// readManifest reads the MANIFEST and decodes the prefix of every edit. A damaged record
// followed by an intact one is an error; a bad tail with nothing intact after it is the torn
// end of an edit a crash cut short, which Pebble ignores too.
func readManifest(fs vfs.FS, dir, name string) (manifestState, *OpenError) {
	m := manifestState{name: name, tornAt: -1}
	data, err := readFile(fs, fs.PathJoin(dir, name))
	if err != nil {
		// Pebble's Open reports an unreadable MANIFEST.
		return m, nil
	}
	m.size = int64(len(data))
	s := scanLog(data, 0, -1)
	m.cleanEnd = s.endOff
	if s.end == endInvalid {
		if q := manifestEvidence(data, s.endOff); q >= 0 {
			return m, damagedFile(name, s.endOff, fmt.Sprintf("%s, but an intact version edit follows at offset %d: the edits after the damage would be dropped", s.why, q))
		}
		m.tornAt, m.tornWhy = s.endOff, s.why
	}
	for i, rec := range s.records {
		if err := m.decodeEdit(rec); err != nil {
			return m, damagedFile(name, -1, fmt.Sprintf("version edit %d: %v", i+1, err))
		}
		m.recordsDecoded++
	}
	return m, nil
}

func (m *manifestState) decodeEdit(b []byte) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return errors.New("bad tag")
		}
		b = b[n:]
		var vals int
		switch tag {
		case tagComparator:
			l, n := binary.Uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return errors.New("bad comparator name")
			}
			b = b[n+int(l):]
			continue
		case tagLogNumber, tagNextFileNumber, tagLastSequence, tagPrevLogNumber, tagRemovedBackingTable:
			vals = 1
		case tagCreatedBackingTable:
			vals = 2
		default:
			return nil // the rest of the edit: files, blob files; not needed
		}
		var v uint64
		for range vals {
			var n int
			if v, n = binary.Uvarint(b); n <= 0 {
				return fmt.Errorf("bad value of tag %d", tag)
			}
			b = b[n:]
		}
		switch {
		case tag == tagLogNumber && v != 0:
			m.minUnflushed = v
		case tag == tagLastSequence && v != 0:
			m.lastSeq = v
		}
	}
	return nil
}

// cleanClose is the content of cleanCloseFile.
type cleanClose struct {
	manifest     string
	manifestSize int64
	wals         []closedWAL
}

type closedWAL struct {
	num  uint64
	size int64
}

func walName(num uint64) string { return fmt.Sprintf("%06d.log", num) }

// parseWALName parses Pebble's standalone WAL file name (NNNNNN.log).
func parseWALName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, ".log")
	if !ok || base == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(base, 10, 64)
	return n, err == nil && n > 0 && n <= 1<<32-1
}

func parseManifestName(name string) (uint64, bool) {
	base, ok := strings.CutPrefix(name, "MANIFEST-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(base, 10, 64)
	return n, err == nil
}

func damagedFile(file string, off int64, detail string) *OpenError {
	return &OpenError{
		Kind: ErrCorruptStore, File: file, Offset: off, Detail: detail,
		Hint: "acknowledged work may be missing, so the store is not opened; restore it from a checkpoint or a backup",
	}
}

func readFile(fs vfs.FS, path string) ([]byte, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	// Read the size the file has now in one piece (io.ReadAll would grow and copy its buffer
	// a dozen times for a 16 MiB WAL), then anything appended since.
	b := make([]byte, fi.Size())
	n, err := io.ReadFull(f, b)
	if err == io.ErrUnexpectedEOF {
		return b[:n], nil
	}
	if err != nil {
		return nil, err
	}
	rest, err := io.ReadAll(f)
	return append(b, rest...), err
}

// checkWAL checks the store's MANIFEST and WALs before Pebble replays them (see the comment
// at the top of this file). It returns nil when there is no database yet, and leaves what it
// cannot read (a damaged marker, an unreadable file) to Pebble's Open to report. It changes
// nothing.
func checkWAL(fs vfs.FS, dir string) error {
	if err := checkWALFiles(fs, dir); err != nil {
		err.Dir = dir
		return err
	}
	return nil
}

func checkWALFiles(fs vfs.FS, dir string) *OpenError {
	desc, err := pebble.Peek(dir, fs)
	if err != nil || !desc.Exists {
		return nil
	}
	manifestName := fs.PathBase(desc.ManifestFilename)
	closed, cerr := readCleanClose(fs, dir)
	if cerr != nil {
		return cerr
	}
	m, merr := readManifest(fs, dir, manifestName)
	if merr != nil {
		return merr
	}
	if m.size == 0 && m.recordsDecoded == 0 {
		return nil // unreadable or empty: Pebble's Open reports it
	}
	if closed != nil {
		if err := closed.checkManifest(m); err != nil {
			return err
		}
	}

	names, err := fs.List(dir)
	if err != nil {
		return nil
	}
	var live []uint64
	for _, n := range names {
		if num, ok := parseWALName(n); ok && num >= m.minUnflushed {
			live = append(live, num)
		}
	}
	slices.Sort(live)
	closedSizes := map[uint64]int64{}
	if closed != nil && closed.manifest == m.name {
		for _, w := range closed.wals {
			if w.num < m.minUnflushed {
				continue // flushed since: obsolete
			}
			closedSizes[w.num] = w.size
			if _, found := slices.BinarySearch(live, w.num); !found {
				return damagedFile(walName(w.num), -1, fmt.Sprintf("the WAL is missing; it held unflushed batches when the store was last closed (%s)", cleanCloseFile))
			}
		}
	}

	// nextSeq is the sequence number the next batch must carry: Pebble assigns them without
	// a gap. The MANIFEST's last sequence is an upper bound on the numbers assigned when its
	// last edit was written, which may include batches still in the live WALs; but every
	// batch after it is in a live WAL, so the first live batch cannot lie beyond it.
	nextSeq := max(m.lastSeq+1, pebbleSeqNumStart)
	first := true
	prevName := m.name
	for i, num := range live {
		name := walName(num)
		data, err := readFile(fs, fs.PathJoin(dir, name))
		if err != nil {
			return nil // Pebble's Open reports an unreadable WAL
		}
		recordedSize, recorded := closedSizes[num]
		if recorded && int64(len(data)) != recordedSize {
			return damagedFile(name, min(int64(len(data)), recordedSize), fmt.Sprintf("the WAL is %d bytes long, but was %d when the store was last closed (%s)", len(data), recordedSize, cleanCloseFile))
		}
		s := scanLog(data, uint32(num), batchrepr.HeaderLen)
		newest := i == len(live)-1
		switch {
		case s.end == endInvalid && (!newest || recorded):
			return damagedFile(name, s.endOff, s.why+": a WAL that was closed must read cleanly to its end")
		case s.end == endInvalid:
			if ev := walEvidence(data, uint32(num), s.endOff); ev != "" {
				return damagedFile(name, s.endOff, s.why+", but "+ev+": synced batches would be dropped")
			}
			// The torn tail of writes a crash cut short: never synced, never acknowledged.
		case s.end == endEOF && (!newest || recorded):
			return damagedFile(name, s.endOff, "the WAL ends without Pebble's end-of-log trailer although it was closed: it was cut")
		}
		for j, rec := range s.records {
			h, ok := batchrepr.ReadHeader(rec)
			if !ok {
				return damagedFile(name, -1, fmt.Sprintf("record %d is shorter than a batch header", j+1))
			}
			if first && uint64(h.SeqNum) <= nextSeq {
				nextSeq, first = uint64(h.SeqNum), false
			}
			if uint64(h.SeqNum) != nextSeq {
				if j == 0 && uint64(h.SeqNum) > nextSeq {
					return damagedFile(name, 0, fmt.Sprintf("the WAL starts at sequence number %d, but %s ends at %d: the batches in between are missing (a WAL was deleted or cut)", h.SeqNum, prevName, nextSeq-1))
				}
				return damagedFile(name, -1, fmt.Sprintf("record %d has sequence number %d, expected %d", j+1, h.SeqNum, nextSeq))
			}
			nextSeq += uint64(h.Count)
		}
		if len(s.records) > 0 {
			prevName = name
		}
	}
	return nil
}

// checkManifest compares the MANIFEST with the one recorded at the last clean close: while
// it is the same file, it may only have grown, and what it held then must read cleanly.
func (c *cleanClose) checkManifest(m manifestState) *OpenError {
	cur, ok1 := parseManifestName(m.name)
	rec, ok2 := parseManifestName(c.manifest)
	switch {
	case !ok1 || !ok2:
		return nil
	case cur < rec:
		return damagedFile(m.name, -1, fmt.Sprintf("the store's current MANIFEST is older than %s, current at the last clean close (%s)", c.manifest, cleanCloseFile))
	case cur > rec:
		return nil // rewritten since: the record is stale
	case m.size < c.manifestSize:
		return damagedFile(m.name, m.size, fmt.Sprintf("the MANIFEST is %d bytes long, but was %d when the store was last closed (%s)", m.size, c.manifestSize, cleanCloseFile))
	case m.tornAt >= 0 && m.tornAt < c.manifestSize:
		return damagedFile(m.name, m.tornAt, m.tornWhy+": this part of the MANIFEST was complete when the store was last closed")
	}
	return nil
}

// readCleanClose reads cleanCloseFile; nil when there is none.
func readCleanClose(fs vfs.FS, dir string) (*cleanClose, *OpenError) {
	data, err := readFile(fs, fs.PathJoin(dir, cleanCloseFile))
	if oserrNotExist(err) {
		return nil, nil
	}
	bad := func(why string) *OpenError {
		e := damagedFile(cleanCloseFile, -1, why)
		e.Hint = "the record of the last clean close is damaged; delete " + cleanCloseFile + " to open the store without checking its WALs against it"
		return e
	}
	if err != nil {
		return nil, bad(err.Error())
	}
	body, sumLine, ok := cutLastLine(data)
	if !ok {
		return nil, bad("no checksum line")
	}
	if want := fmt.Sprintf("crc %08x", crc32.Checksum(body, castagnoli)); sumLine != want {
		return nil, bad("checksum mismatch")
	}
	lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
	if len(lines) < 2 || lines[0] != cleanCloseHeader {
		return nil, bad("unknown header")
	}
	c := &cleanClose{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 3 {
			return nil, bad(fmt.Sprintf("bad line %q", l))
		}
		size, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil || size < 0 {
			return nil, bad(fmt.Sprintf("bad line %q", l))
		}
		switch f[0] {
		case "manifest":
			c.manifest, c.manifestSize = f[1], size
		case "wal":
			num, ok := parseWALName(f[1])
			if !ok {
				return nil, bad(fmt.Sprintf("bad line %q", l))
			}
			c.wals = append(c.wals, closedWAL{num, size})
		default:
			return nil, bad(fmt.Sprintf("bad line %q", l))
		}
	}
	if c.manifest == "" {
		return nil, bad("no manifest line")
	}
	return c, nil
}

func cutLastLine(b []byte) (body []byte, last string, ok bool) {
	b = bytes.TrimSuffix(b, []byte("\n"))
	i := bytes.LastIndexByte(b, '\n')
	if i < 0 {
		return nil, "", false
	}
	return b[:i+1], string(b[i+1:]), true
}

// recordCleanClose writes cleanCloseFile after Pebble closed the database: the MANIFEST's
// name and size and every live WAL's size. closeErr is the error of the close so far; after
// any error, on a failed store, and on a read-only store, nothing is written. An earlier record is replaced
// atomically; if writing fails, the earlier one stays, which is harmless (cleanCloseFile).
func (s *Store) recordCleanClose(closeErr error) error {
	if closeErr != nil || s.opts.ReadOnly || s.fh.err() != nil {
		return nil // after a failure nothing is asserted about the files
	}
	if err := writeCleanClose(s.fs, s.dir); err != nil {
		return fmt.Errorf("pebblelog: %s: recording the clean close: %w", s.dir, err)
	}
	return nil
}

func writeCleanClose(fs vfs.FS, dir string) error {
	desc, err := pebble.Peek(dir, fs)
	if err != nil {
		return err
	}
	if !desc.Exists {
		return nil
	}
	name := fs.PathBase(desc.ManifestFilename)
	m, merr := readManifest(fs, dir, name)
	if merr != nil {
		return merr
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\nmanifest %s %d\n", cleanCloseHeader, name, m.size)
	names, err := fs.List(dir)
	if err != nil {
		return err
	}
	var wals []uint64
	for _, n := range names {
		if num, ok := parseWALName(n); ok && num >= m.minUnflushed {
			wals = append(wals, num)
		}
	}
	slices.Sort(wals)
	for _, num := range wals {
		fi, err := fs.Stat(fs.PathJoin(dir, walName(num)))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "wal %s %d\n", walName(num), fi.Size())
	}
	body := b.String()
	fmt.Fprintf(&b, "crc %08x\n", crc32.Checksum([]byte(body), castagnoli))
	return writeFileAtomic(fs, dir, cleanCloseFile, b.String())
}

// writeFileAtomic writes name in dir through a synced temporary file, a rename and a
// directory sync, so a crash leaves the old file or the new one, whole.
func writeFileAtomic(fs vfs.FS, dir, name, content string) error {
	tmp := fs.PathJoin(dir, name+".tmp")
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = io.WriteString(f, content)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, fs.PathJoin(dir, name))
	}
	if err == nil {
		var d vfs.File
		if d, err = fs.OpenDir(dir); err == nil {
			err = d.Sync()
			d.Close()
		}
	}
	return err
}

// walReplayError turns an error of Pebble's Open that happened while replaying a WAL into an
// *OpenError of kind ErrCorruptStore naming the WAL: Pebble puts the WAL's number and the
// offset only into the error's details ("replaying wal 12, offset (/dir/000012.log: 33)"),
// which %+v prints. It returns nil for any other error, including Pebble's refusals during
// replay that are not about the WAL's contents (ErrDBNotPristine names the WAL too). checkWAL refuses every WAL Pebble
// would fail to replay before Pebble reads it; this is the net under it.
func walReplayError(dir string, err error) error {
	if !pebble.IsCorruptionError(err) {
		return nil // an I/O error, or a refusal that is not about the WAL's contents
	}
	m := walReplayRE.FindStringSubmatch(fmt.Sprintf("%+v", err))
	if m == nil {
		return nil
	}
	num, perr := strconv.ParseUint(m[1], 10, 64)
	if perr != nil {
		return nil
	}
	off := int64(-1)
	if m[2] != "" {
		off, _ = strconv.ParseInt(m[2], 10, 64)
	}
	e := damagedFile(walName(num), off, "Pebble could not replay the WAL")
	e.Dir, e.Err = dir, err
	return e
}

var walReplayRE = regexp.MustCompile(`replaying wal (\d+), offset \([^)]*?(?:: (\d+))?\)`)
