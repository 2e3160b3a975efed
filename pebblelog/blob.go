package pebblelog

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"sync"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
)

// Store format 4: large values live in blob files (docs/design.md, "Store format 4").
//
// A value of BlobMin bytes or more (a task's input, a wake's payload, an outcome's output) is
// written to a file of its own under <store>/blobs, fsynced with its directory entry before
// the batch that refers to it commits (with NoSync too: a later WAL sync may make the batch
// durable, and the log must never refer to a lost blob), and the event is stored in Pebble as a reference to it (the
// blob form below) instead of its bytes. Pebble never sees the value: a 64 MiB value used to
// become a 128 MiB batch (Pebble rounds a batch up to a power of two), a flushable batch
// flushed at once through the block builder, compression and compaction, several copies of
// the value each (TestLargeValueMemory). Readers get the full wire bytes back (RawLog) or the
// decoded event with its values (ReadLog, the value fills of input.go); the event wire
// format does not change, only how pebblelog stores it.
//
// A finish's task record no longer holds an output of BlobMin bytes or more either (input.go:
// recordTask): it is read from the task's settle event when needed, and the completion wake's
// event refers to the same blob as the settle event.
//
// Every blob is listed in the blob index (b<uvarint len><subject id><name>, empty value),
// written in the batch of the event that refers to it: a prune finds a subject's blobs there
// (and deletes the files once its batch is durable), and Open finds orphans by it (files no
// entry names: a crash after a blob was written and before its batch committed).

// BlobMin is the size from which a value is stored in a blob file of its own rather than in
// Pebble. Part of store format 4: a task record holds an output shorter than this, Verify's
// rebuild strips the same ones. Measured (docs/design.md): below ~256 KiB a value in Pebble
// costs less than a file create, write and two fsyncs; above it, Pebble's copies dominate.
const BlobMin = 256 << 10

// OwnedOutputMin is the length from which a task's output read through Txn.Reader (the
// decide code) belongs to the reader, like OwnedValueMin for inputs: such an output is in no
// record, no cache and no other command's hands (input.go).
const OwnedOutputMin = BlobMin

// BlobDir is the directory of the blob files, relative to the store's directory.
const BlobDir = "blobs"

// blobForm is the first byte of an event stored as a reference to its blobs: msgpack's one
// never-used byte (0xc1), which is neither an event envelope version nor a record's array.
const blobForm = 0xc1

// The fields a blob can hold, as stored in a blob reference.
const (
	fieldInput   = 'i' // TaskSubmitted.Input
	fieldPayload = 'p' // WakeRecorded.Payload
	fieldOutput  = 'o' // TaskSettled.Outcome.Output, WakeRecorded.Outcome.Output
)

// blobRef names one blob: its file (under BlobDir), its length and its CRC-32C.
type blobRef struct {
	name string
	size uint64
	crc  uint32
}

// BlobError is a blob file the log refers to that is missing, of the wrong size, fails its
// checksum, or cannot be read. errors.Is(err, ErrCorruptStore) holds for damage (Kind), and
// File names the blob relative to the store's directory.
type BlobError struct {
	Dir    string
	File   string // "blobs/<name>"
	Kind   error  // ErrCorruptStore, or ErrStoreFailed when reading failed for another reason
	Detail string
	Err    error
}

func (e *BlobError) Error() string {
	s := fmt.Sprintf("%v: %s: %s: %s", e.Kind, e.Dir, e.File, e.Detail)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s + "; restore the store from a checkpoint or backup"
}

func (e *BlobError) Is(target error) bool { return target == e.Kind }
func (e *BlobError) Unwrap() error        { return e.Err }

// blobStore is a store's blob directory and the blobs staged for commands not yet run.
type blobStore struct {
	fs    vfs.FS
	dir   string // the store's directory
	ready bool   // BlobDir exists and is durable; guarded by mu

	mu     sync.Mutex
	staged map[stageKey]*stagedBlob

	// delMu is held while prunes delete blob files and while a checkpoint links them, so a
	// checkpoint never misses a blob its copy of the database refers to.
	delMu sync.Mutex
}

func newBlobStore(fs vfs.FS, dir string) *blobStore {
	return &blobStore{fs: fs, dir: dir, staged: map[stageKey]*stagedBlob{}}
}

// stageKey identifies a value by its bytes' address and length: a command's closure refers
// to the very slice its caller staged, however many times it runs.
type stageKey struct {
	p *byte
	n int
}

func keyOf(v []byte) stageKey { return stageKey{unsafe.SliceData(v), len(v)} }

type stagedBlob struct {
	ref   blobRef
	owner string // the task or wake that first stored it (blobFor)
	used  bool   // an Append put it into a batch: never deleted here (Open sweeps orphans)
}

func (bl *blobStore) path(name string) string {
	return bl.fs.PathJoin(bl.dir, BlobDir, name)
}

func (bl *blobStore) fileName(name string) string { return BlobDir + "/" + name }

// validBlobName reports whether name is one writeBlob makes: 32 hex digits and ".blob". A
// reference read from the log names nothing else (no path may leave BlobDir).
func validBlobName(name string) bool {
	hexPart, ok := strings.CutSuffix(name, ".blob")
	if !ok || len(hexPart) != 32 {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil
}

// exists reports whether BlobDir exists (written by this process, or found at Open).
func (bl *blobStore) exists() bool {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	return bl.ready
}

// ensureDir makes BlobDir, durably, the first time a blob is written: a store without large
// values has none (and a refused Open creates nothing).
func (bl *blobStore) ensureDir() error {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	if bl.ready {
		return nil
	}
	d := bl.fs.PathJoin(bl.dir, BlobDir)
	if _, err := bl.fs.Stat(d); err != nil {
		if err := bl.fs.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := syncDir(bl.fs, bl.dir); err != nil {
			return err
		}
	}
	bl.ready = true
	return nil
}

// write stores v in a new blob file: written, fsynced and its directory entry fsynced before
// it returns, so a batch that refers to it never commits before it is durable. Whatever the
// sync mode: with NoSync the batch is not fsynced, but any later WAL sync (PlanPrune's,
// removePrunedBlobs', Close's, a memtable flush) can make it durable, and a machine crash
// must not then leave the log referring to a blob it lost (TestBlobCrashNoSync).
func (bl *blobStore) write(v []byte) (blobRef, error) {
	if err := bl.ensureDir(); err != nil {
		return blobRef{}, fmt.Errorf("pebblelog: %s: creating %s: %w", bl.dir, BlobDir, err)
	}
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		return blobRef{}, err
	}
	ref := blobRef{name: hex.EncodeToString(r[:]) + ".blob", size: uint64(len(v)), crc: crc32.Checksum(v, castagnoli)}
	err := func() error {
		f, err := bl.fs.Create(bl.path(ref.name), vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		err = writeCopied(f, v)
		if err == nil {
			err = f.Sync()
		}
		return errors.Join(err, f.Close())
	}()
	if err == nil {
		err = syncDir(bl.fs, bl.fs.PathJoin(bl.dir, BlobDir))
	}
	if err != nil {
		_ = bl.fs.Remove(bl.path(ref.name))
		return blobRef{}, fmt.Errorf("pebblelog: %s: writing %s: %w", bl.dir, bl.fileName(ref.name), err)
	}
	return ref, nil
}

// writeChunk is the size of the scratch buffer writeCopied writes through.
const writeChunk = 1 << 20

// writeCopied writes v to f through a scratch buffer: Pebble's vfs.File.Write may change the
// buffer it is given (its MemFS does, with invariants on, to catch callers that reuse it),
// and v is the caller's value, which the work package hands back as the call's snapshot.
func writeCopied(f vfs.File, v []byte) error {
	buf := make([]byte, min(len(v), writeChunk))
	for len(v) > 0 {
		n := copy(buf, v)
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		v = v[n:]
	}
	return nil
}

// read returns the blob's bytes, checked against its reference: a missing, short, long or
// damaged file is a *BlobError of kind ErrCorruptStore naming it.
func (bl *blobStore) read(ref blobRef) ([]byte, error) {
	bad := func(kind error, detail string, err error) error {
		return &BlobError{Dir: bl.dir, File: bl.fileName(ref.name), Kind: kind, Detail: detail, Err: err}
	}
	if bl == nil {
		return nil, bad(ErrCorruptStore, "the log refers to a blob, read without the store's blob directory", nil)
	}
	f, err := bl.fs.Open(bl.path(ref.name))
	if err != nil {
		if oserrNotExist(err) {
			return nil, bad(ErrCorruptStore, "the blob the log refers to is missing", nil)
		}
		return nil, bad(ErrStoreFailed, "opening the blob", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, bad(ErrStoreFailed, "reading the blob's size", err)
	}
	if uint64(fi.Size()) != ref.size {
		return nil, bad(ErrCorruptStore, fmt.Sprintf("%d bytes, the log says %d", fi.Size(), ref.size), nil)
	}
	v := make([]byte, ref.size)
	if _, err := io.ReadFull(f, v); err != nil {
		return nil, bad(ErrCorruptStore, "reading the blob", err)
	}
	if crc32.Checksum(v, castagnoli) != ref.crc {
		return nil, bad(ErrCorruptStore, "checksum mismatch", nil)
	}
	return v, nil
}

// remove deletes blob files (a prune's, once its batch is durable; an unused staged one).
// A file already gone is fine; other failures are returned, the rest still removed.
func (bl *blobStore) remove(names []string) error {
	var errs []error
	for _, n := range names {
		if err := bl.fs.Remove(bl.path(n)); err != nil && !oserrNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// --- staging: blobs written before the command is queued ---

// StageValues writes each value of at least BlobMin bytes to a blob file of its own, before
// the command that stores it is queued, so that the write and fsync of a large value happen
// in the caller's goroutine rather than in the single writer, where every other caller would
// wait for them. The command must append the very slices staged (Append finds them by
// address and length); a value it stores that was not staged is written by the writer
// itself. Call release once Update has returned: a blob no batch took (an idempotent repeat,
// a refused command) is deleted then; one a batch took is kept, and if that batch did not
// commit after all, the next read-write Open removes it as an orphan.
func (s *Store) StageValues(values ...[]byte) (release func(), err error) {
	var keys []stageKey
	release = func() {
		s.blobs.mu.Lock()
		var unused []string
		for _, k := range keys {
			if b := s.blobs.staged[k]; b != nil {
				if !b.used {
					unused = append(unused, b.ref.name)
				}
				delete(s.blobs.staged, k)
			}
		}
		s.blobs.mu.Unlock()
		_ = s.blobs.remove(unused) // never referenced: a failure leaves an orphan for Open
	}
	if s.opts.ReadOnly {
		return release, nil
	}
	// Registered like any call, so that Close waits for a blob being written: the directory
	// is not written after the store is closed (and perhaps opened by another process).
	if err := s.enter(); err != nil {
		return func() {}, err
	}
	defer s.closeMu.RUnlock()
	for _, v := range values {
		if len(v) < BlobMin {
			continue
		}
		k := keyOf(v)
		s.blobs.mu.Lock()
		_, dup := s.blobs.staged[k]
		s.blobs.mu.Unlock()
		if dup {
			continue // staged by another call of the same slice: it owns the entry
		}
		ref, err := s.blobs.write(v)
		if err != nil {
			release()
			return func() {}, err
		}
		s.blobs.mu.Lock()
		if _, dup := s.blobs.staged[k]; dup {
			s.blobs.mu.Unlock()
			_ = s.blobs.remove([]string{ref.name})
			continue
		}
		s.blobs.staged[k] = &stagedBlob{ref: ref}
		s.blobs.mu.Unlock()
		keys = append(keys, k)
	}
	return release, nil
}

// --- the writer's side ---

// batchBlob is a blob the writer put into its batch.
type batchBlob struct {
	ref   blobRef
	owner string
}

// blobFor returns the blob holding v for an event of subject, owned by owner (the task whose
// output a completion wake shares: the same blob, not a copy): a staged one, one this batch
// wrote already, or a new one written here, in the writer (the slow path: a caller that did
// not stage). A blob is shared only between a task and its completion wake, which are pruned
// together; any other reuse of the same slice gets a blob of its own.
func (w *writer) blobFor(v []byte, owner string) (blobRef, error) {
	k := keyOf(v)
	if b, ok := w.blobs[k]; ok && b.owner == owner {
		return b.ref, nil
	}
	bl := w.bl
	bl.mu.Lock()
	if sb := bl.staged[k]; sb != nil && (sb.owner == "" || sb.owner == owner) {
		sb.owner, sb.used = owner, true
		ref := sb.ref
		bl.mu.Unlock()
		w.putBatchBlob(k, batchBlob{ref: ref, owner: owner})
		return ref, nil
	}
	bl.mu.Unlock()
	ref, err := bl.write(v)
	if err != nil {
		return blobRef{}, err
	}
	w.putBatchBlob(k, batchBlob{ref: ref, owner: owner})
	return ref, nil
}

func (w *writer) putBatchBlob(k stageKey, b batchBlob) {
	if w.blobs == nil {
		w.blobs = map[stageKey]batchBlob{}
	}
	w.blobs[k] = b
}

// blobField is one value of an event that goes to a blob.
type blobField struct {
	field byte
	v     *[]byte
}

// blobFields returns ev's values of at least BlobMin bytes, and the task that owns them.
func blobFields(ev events.Event) (fs []blobField, owner string) {
	big := func(v []byte) bool { return len(v) >= BlobMin }
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		if big(e.Input) {
			fs = append(fs, blobField{fieldInput, &e.Input})
		}
		owner = e.TaskID
	case *events.TaskSettled:
		if big(e.Outcome.Output) {
			fs = append(fs, blobField{fieldOutput, &e.Outcome.Output})
		}
		owner = e.TaskID
	case *events.WakeRecorded:
		if big(e.Payload) {
			fs = append(fs, blobField{fieldPayload, &e.Payload})
		}
		if big(e.Outcome.Output) {
			fs = append(fs, blobField{fieldOutput, &e.Outcome.Output})
		}
		owner = e.WakeID
		if e.Reason == events.WakeTaskFinished && e.TaskID != "" {
			owner = e.TaskID // its output is its task's: the settle event's blob
		}
	}
	return fs, owner
}

// appendBlobbed stores ev under key in the blob form: its large values go to blobs (staged,
// or written now), and the stored value is
//
//	0xc1, uvarint n, n × (field byte, uvarint len, name, uvarint size, crc 4B BE),
//	then the event's wire encoding with those fields empty (its own CRC covers it)
//
// Each blob gets its entry in the blob index under the event's subject. ev itself is not
// changed: the fold applies it with its values.
func (t *Txn) appendBlobbed(key []byte, ev events.Event, fields []blobField, owner string) error {
	w := t.w
	val := []byte{blobForm}
	val = binary.AppendUvarint(val, uint64(len(fields)))
	taskID, wakeID := ev.Subject()
	subject := taskID + wakeID
	saved := make([][]byte, len(fields))
	for i, f := range fields {
		ref, err := w.blobFor(*f.v, owner)
		if err != nil {
			return err
		}
		val = appendBlobRef(val, f.field, ref)
		if err := w.b.Set(blobIndexKey(subject, ref.name), nil, nil); err != nil {
			return err
		}
		saved[i] = *f.v
		*f.v = []byte{} // encodes as an empty bin: the skeleton
	}
	var err error
	val, err = events.Append(val, ev)
	for i, f := range fields {
		*f.v = saved[i]
	}
	if err != nil {
		return err
	}
	return w.b.Set(key, val, nil)
}

func appendBlobRef(b []byte, field byte, ref blobRef) []byte {
	b = append(b, field)
	b = binary.AppendUvarint(b, uint64(len(ref.name)))
	b = append(b, ref.name...)
	b = binary.AppendUvarint(b, ref.size)
	return binary.BigEndian.AppendUint32(b, ref.crc)
}

// storedRef is a blob reference read from a stored event.
type storedRef struct {
	field byte
	ref   blobRef
}

// parseBlobForm splits a stored event of the blob form into its references and the
// skeleton's wire bytes.
func parseBlobForm(v []byte, seq uint64) ([]storedRef, []byte, error) {
	bad := func(what string) error {
		return &events.DecodeError{Seq: seq, Field: "blob reference", Kind: events.ErrCorrupt, Detail: what}
	}
	p := v[1:]
	n, k := binary.Uvarint(p)
	if k <= 0 || n == 0 || n > 3 {
		return nil, nil, bad("bad count")
	}
	p = p[k:]
	refs := make([]storedRef, 0, n)
	for range n {
		if len(p) < 1 {
			return nil, nil, bad("truncated")
		}
		var r storedRef
		r.field, p = p[0], p[1:]
		l, k := binary.Uvarint(p)
		if k <= 0 || uint64(len(p)-k) < l {
			return nil, nil, bad("truncated name")
		}
		r.ref.name, p = string(p[k:k+int(l)]), p[k+int(l):]
		if !validBlobName(r.ref.name) {
			return nil, nil, bad(fmt.Sprintf("bad blob name %q", r.ref.name))
		}
		if r.ref.size, k = binary.Uvarint(p); k <= 0 || len(p) < k+4 {
			return nil, nil, bad("truncated size")
		}
		r.ref.crc, p = binary.BigEndian.Uint32(p[k:]), p[k+4:]
		refs = append(refs, r)
	}
	return refs, p, nil
}

// isBlobForm reports whether a stored event value is of the blob form.
func isBlobForm(v []byte) bool { return len(v) > 0 && v[0] == blobForm }

// decodeStored decodes a stored event value of either form with dec (events.Decode or a
// Decoder's), reading its blobs: the event as it was appended, values included.
func (bl *blobStore) decodeStored(v []byte, seq uint64, dec func([]byte, uint64) (events.Event, error)) (events.Event, error) {
	if !isBlobForm(v) {
		return dec(v, seq)
	}
	refs, skel, err := parseBlobForm(v, seq)
	if err != nil {
		return nil, err
	}
	ev, err := dec(skel, seq)
	if err != nil {
		return nil, err
	}
	for _, r := range refs {
		dst := blobTarget(ev, r.field)
		if dst == nil || len(*dst) != 0 {
			return nil, &events.DecodeError{Seq: seq, Type: ev.Type(), Field: "blob reference", Kind: events.ErrCorrupt,
				Detail: fmt.Sprintf("field %q does not take a blob", r.field)}
		}
		b, err := bl.read(r.ref)
		if err != nil {
			return nil, fmt.Errorf("pebblelog: event %d: %w", seq, err)
		}
		*dst = b
	}
	return ev, nil
}

// blobTarget is the field of ev a reference fills; nil when ev has no such field.
func blobTarget(ev events.Event, field byte) *[]byte {
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		if field == fieldInput {
			return &e.Input
		}
	case *events.TaskSettled:
		if field == fieldOutput {
			return &e.Outcome.Output
		}
	case *events.WakeRecorded:
		switch field {
		case fieldPayload:
			return &e.Payload
		case fieldOutput:
			return &e.Outcome.Output
		}
	}
	return nil
}

// wireBytes returns a stored event's wire bytes: v itself, or the blob form's event
// re-encoded with its values (the same bytes Append wrote before they went to blobs).
func (bl *blobStore) wireBytes(v []byte, seq uint64) ([]byte, error) {
	if !isBlobForm(v) {
		return v, nil
	}
	ev, err := bl.decodeStored(v, seq, events.Decode)
	if err != nil {
		return nil, err
	}
	return events.Encode(ev)
}

// --- the blob index ---

// blobIndexKey is the blob index entry of blob name under subject (a task or wake id).
func blobIndexKey(subject, name string) []byte {
	return append(scopedKey(prefixBlob, subject, ""), name...)
}

// pruneBlobs deletes the blob index entries of a pruned subject and remembers their blobs,
// whose files go once the prune's batch is durable (Store.removeBlobsAfter).
func (w *writer) pruneBlobs(id string) error {
	if w.bl == nil || !w.bl.exists() {
		return nil // no blob was ever written: no entry to look for
	}
	p := scopedKey(prefixBlob, id, "")
	it, err := w.b.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return err
	}
	var keys [][]byte
	for ok := it.First(); ok; ok = it.Next() {
		keys = append(keys, append([]byte(nil), it.Key()...))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	for _, k := range keys {
		if err := w.b.Delete(k, nil); err != nil {
			return err
		}
		w.prunedBlobs = append(w.prunedBlobs, string(k[len(p):]))
	}
	return nil
}

// referencedBlobs returns the names the blob index holds.
func referencedBlobs(r pebble.Reader) (map[string]bool, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixBlob}, UpperBound: []byte{prefixBlob + 1}})
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for ok := it.First(); ok; ok = it.Next() {
		_, rest, good := splitScoped(it.Key())
		if !good {
			it.Close()
			return nil, fmt.Errorf("%w: blob index key %q", ErrCorruptRecord, it.Key())
		}
		names[rest] = true
	}
	return names, errors.Join(it.Error(), it.Close())
}

// sweepOrphans removes, at a read-write Open under the lock, the blob files no entry of the
// blob index names: blobs written for a batch that never committed (a crash between the blob
// and its batch, a command refused after its blob was staged), and blobs of a prune whose
// files were not yet removed. Its cost is one scan of the blob index when BlobDir exists.
func (s *Store) sweepOrphans() error {
	d := s.fs.PathJoin(s.dir, BlobDir)
	names, err := s.fs.List(d)
	if err != nil {
		if oserrNotExist(err) {
			return nil
		}
		return err
	}
	s.blobs.ready = true
	if len(names) == 0 {
		return nil
	}
	refs, err := referencedBlobs(s.db)
	if err != nil {
		return err
	}
	var orphans []string
	for _, n := range names {
		if !refs[n] {
			orphans = append(orphans, n)
		}
	}
	if len(orphans) == 0 {
		return nil
	}
	if err := s.blobs.remove(orphans); err != nil {
		return err
	}
	return syncDir(s.fs, d)
}

// linkBlobs hard-links (or copies) every blob file into the checkpoint dst. The caller holds
// delMu across the database checkpoint and this, so no blob the copy refers to is deleted in
// between; blobs written meanwhile are orphans there, which its first Open removes.
func (s *Store) linkBlobs(dst string) error {
	src := s.fs.PathJoin(s.dir, BlobDir)
	names, err := s.fs.List(src)
	if err != nil {
		if oserrNotExist(err) {
			return nil
		}
		return err
	}
	to := s.fs.PathJoin(dst, BlobDir)
	if err := s.fs.MkdirAll(to, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		from, into := s.fs.PathJoin(src, n), s.fs.PathJoin(to, n)
		if err := s.fs.Link(from, into); err != nil {
			if err := vfs.CopyAcrossFS(s.fs, from, s.fs, into); err != nil {
				return err
			}
		}
	}
	if err := syncDir(s.fs, to); err != nil {
		return err
	}
	return syncDir(s.fs, dst)
}

// removePrunedBlobs deletes the blob files of a prune whose batch is durable: from the
// syncer, after SyncWait (a crash before it keeps the subjects, so their blobs must stay).
// With NoSync nothing is durable until a sync, so one is forced first; a failed sync or
// removal leaves the files for the next Open's sweep (the blob index no longer names them).
func (s *Store) removePrunedBlobs(names []string) {
	if s.fh.err() != nil {
		return
	}
	if s.opts.NoSync {
		if err := s.fh.call("a WAL sync", func() error { return s.db.LogData(nil, pebble.Sync) }); err != nil {
			return
		}
	}
	s.blobs.delMu.Lock()
	defer s.blobs.delMu.Unlock()
	if err := s.blobs.remove(names); err == nil {
		_ = syncDir(s.fs, s.fs.PathJoin(s.dir, BlobDir))
	}
}

// rebuildBlobIndex puts into b (Verify's rebuild) the blob index entries of the event under
// it, when it is stored in the blob form.
func rebuildBlobIndex(it *pebble.Iterator, b *pebble.Batch, ev events.Event) error {
	v, err := it.ValueAndErr()
	if err != nil || !isBlobForm(v) {
		return err
	}
	refs, _, err := parseBlobForm(v, ev.Head().Seq)
	if err != nil {
		return err
	}
	taskID, wakeID := ev.Subject()
	for _, r := range refs {
		if err := b.Set(blobIndexKey(taskID+wakeID, r.ref.name), nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// diskUsage is the bytes of the blob files.
func (bl *blobStore) diskUsage() (uint64, error) {
	d := bl.fs.PathJoin(bl.dir, BlobDir)
	names, err := bl.fs.List(d)
	if oserrNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, name := range names {
		fi, err := bl.fs.Stat(bl.fs.PathJoin(d, name))
		if oserrNotExist(err) {
			continue // removed meanwhile (a prune)
		}
		if err != nil {
			return 0, err
		}
		n += uint64(fi.Size())
	}
	return n, nil
}
