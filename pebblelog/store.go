package pebblelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// FormatVersion is the store format this build writes and the newest it reads: the key
// layout, the projection record layout and the marker. Version 1 is the first.
const FormatVersion = 1

// pebbleFormat pins Pebble's on-disk format to a named version. Left unset, Pebble v2 creates
// old-format stores; FormatNewest would upgrade stores silently (and for good) on every
// library bump. Raising it is a deliberate, documented change.
const pebbleFormat = pebble.FormatValueSeparation

// MarkerFile names the file that says a directory is a worklog store, and of which format.
// It is written before anything else and checked before Pebble is opened, so Open never
// creates files in a foreign directory.
const MarkerFile = "WORKLOG"

// lockFile is worklog's own inter-process lock, taken before Pebble's, so that a store held
// by another process is reported as such instead of with Pebble's raw lock error.
const lockFile = "WORKLOG.lock"

const markerPrefix = "worklog store format "

// Errors from Open. Each is wrapped with the directory and the cause; check with errors.Is.
var (
	ErrNotAStore     = errors.New("pebblelog: not a worklog store")
	ErrFormatTooNew  = errors.New("pebblelog: store format is newer than this build")
	ErrLocked        = errors.New("pebblelog: store is open in another process")
	ErrClosed        = errors.New("pebblelog: store closed")
	ErrStoreFailed   = errors.New("pebblelog: store failed; reopen it")
	ErrReadOnlyStore = errors.New("pebblelog: store opened read-only")
)

// Options configures Open. The zero value is usable: every zero field takes its default.
type Options struct {
	// FS is the filesystem. Default vfs.Default.
	FS vfs.FS
	// NoSync commits batches without an fsync: see work.SyncNever for what a crash loses.
	// Default false: every acknowledged batch is synced.
	NoSync bool
	// ReadOnly opens an existing store without changing its contents; Update fails. The
	// lock files (WORKLOG.lock, Pebble's LOCK) are still created if missing. Default false.
	ReadOnly bool
	// CacheSize is Pebble's block cache in bytes. Default 24 MiB. Pebble charges every
	// memtable to the block cache too, so the cache is created with room for two memtables
	// on top (2 × MemTableSize): otherwise two 32 MiB memtables would leave a 64 MiB cache
	// no room for a single block, and every read would go to the disk. With the defaults
	// the cache and the memtables together stay within 56 MiB.
	CacheSize int64
	// MemTableSize is one Pebble memtable in bytes. Default 16 MiB.
	MemTableSize uint64
	// MaxBatchCommands bounds the commands folded into one batch. Default 1024.
	MaxBatchCommands int
	// RecordCacheSize bounds, in estimated bytes, the writer's cache of the task and wake
	// records it committed last (read by the next commands on the same tasks instead of a
	// Pebble Get). Default 4 MiB; negative disables it.
	RecordCacheSize int
	// Logger receives Pebble's messages. Default: discarded.
	Logger *slog.Logger
}

// Store is an open worklog store.
type Store struct {
	dir  string
	fs   vfs.FS
	opts Options
	db   *pebble.DB
	lock io.Closer

	reqs    chan *request
	done    chan struct{} // closed when the writer exits
	closeMu sync.RWMutex  // held for reading by every call in flight; Close takes it for writing
	closed  bool

	failMu sync.Mutex
	failed error // set when a commit failed: the store refuses further writes

	lastSeq uint64  // owned by the writer goroutine after Open
	maxIDs  *maxIDs // read at Open, then owned by the writer goroutine
}

// Open opens the store in dir, creating it when dir is missing or empty.
func Open(dir string, o Options) (*Store, error) {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.CacheSize == 0 {
		o.CacheSize = 24 << 20
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = 16 << 20
	}
	if o.MaxBatchCommands <= 0 {
		o.MaxBatchCommands = 1024
	}
	if o.RecordCacheSize == 0 {
		o.RecordCacheSize = 4 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	fs := o.FS
	openErr := func(kind error, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", kind, dir, fmt.Sprintf(format, args...))
	}

	names, err := fs.List(dir)
	switch {
	case oserrNotExist(err):
		if o.ReadOnly {
			return nil, openErr(ErrNotAStore, "directory does not exist")
		}
		if err := mkdirAllSynced(fs, dir); err != nil {
			return nil, fmt.Errorf("pebblelog: creating %s: %w", dir, err)
		}
		names = nil
	case err != nil:
		if fi, serr := fs.Stat(dir); serr == nil && !fi.IsDir() {
			return nil, openErr(ErrNotAStore, "not a directory")
		}
		return nil, fmt.Errorf("pebblelog: reading %s: %w", dir, err)
	}
	hasMarker := false
	var foreign []string
	for _, n := range names {
		switch n {
		case MarkerFile:
			hasMarker = true
		case lockFile, MarkerFile + ".tmp":
			// Our own files, created before the marker: a crash while a new store was being
			// created leaves them alone in the directory, which is still ours to create.
		default:
			foreign = append(foreign, n)
		}
	}
	if !hasMarker && len(foreign) > 0 {
		return nil, openErr(ErrNotAStore, "the directory is not empty and has no %s file (found %s)", MarkerFile, firstNames(foreign))
	}
	if !hasMarker && o.ReadOnly {
		return nil, openErr(ErrNotAStore, "the directory is empty")
	}
	if hasMarker {
		if err := checkMarker(fs, dir); err != nil {
			return nil, err
		}
	}

	lock, err := fs.Lock(fs.PathJoin(dir, lockFile))
	if err != nil {
		return nil, openErr(ErrLocked, "%v; to inspect a live store, take a checkpoint with Queue.Checkpoint and open that", err)
	}
	s, err := open(dir, o, hasMarker, lock)
	if err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

func open(dir string, o Options, exists bool, lock io.Closer) (*Store, error) {
	fs := o.FS
	if !exists {
		if err := writeMarker(fs, dir); err != nil {
			return nil, err
		}
	}
	cache := newBlockCache(o.CacheSize, o.MemTableSize)
	defer cache.Unref()
	po := &pebble.Options{
		FS:                          fs,
		Cache:                       cache,
		MemTableSize:                o.MemTableSize,
		MemTableStopWritesThreshold: 2,
		FormatMajorVersion:          pebbleFormat,
		Logger:                      slogLogger{o.Logger},
		ReadOnly:                    o.ReadOnly,
		ErrorIfNotExists:            o.ReadOnly,
	}
	// Queue-shaped indexes leave tombstones at their head; this compacts them promptly.
	po.Experimental.TombstoneDenseCompactionThreshold = 0.05
	// Bloom filters on every level, L0 included (Pebble's default has none): a point Get of a
	// task or wake record, or of an idempotency key, otherwise reads an index and a data
	// block of every sstable whose key range covers it, and random ids make every L0 file
	// and level cover every id.
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		if errors.Is(err, pebble.ErrDBDoesNotExist) {
			return nil, fmt.Errorf("%w: %s: the marker exists but the database was never created", ErrNotAStore, dir)
		}
		return nil, fmt.Errorf("pebblelog: opening %s: %w", dir, err)
	}
	s := &Store{dir: dir, fs: fs, opts: o, db: db, lock: lock}
	if err := s.checkFormatKey(); err != nil {
		db.Close()
		return nil, err
	}
	last, err := reader{db}.LastSeq()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("pebblelog: %s: %w", dir, err)
	}
	s.lastSeq = last
	if !o.ReadOnly {
		if s.maxIDs, err = (reader{db}).maxIDs(); err != nil {
			db.Close()
			return nil, fmt.Errorf("pebblelog: %s: %w", dir, err)
		}
		s.reqs = make(chan *request, o.MaxBatchCommands)
		s.done = make(chan struct{})
		go s.writeLoop()
	}
	return s, nil
}

// newBlockCache makes a Pebble cache that keeps blockBytes for blocks beside the two
// memtables of memTableSize that Pebble charges to it (see Options.CacheSize).
func newBlockCache(blockBytes int64, memTableSize uint64) *pebble.Cache {
	return pebble.NewCache(blockBytes + 2*int64(memTableSize))
}

// mkdirAllSynced creates dir and its missing parents, then syncs the parent of every directory
// it created, so that a machine crash cannot lose the new directories and the store in them.
// (Pebble does the same for a directory it creates itself; here the directory exists before
// Pebble is opened, so Pebble syncs only its immediate parent.)
func mkdirAllSynced(fs vfs.FS, dir string) error {
	var parents []string // from dir's parent up to the closest existing ancestor
	for p := fs.PathDir(dir); ; p = fs.PathDir(p) {
		parents = append(parents, p)
		if fs.PathDir(p) == p {
			break
		}
		if _, err := fs.Stat(p); err == nil {
			break
		} else if !oserrNotExist(err) {
			return err
		}
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range parents {
		d, err := fs.OpenDir(p)
		if err != nil {
			return err
		}
		err = d.Sync()
		if cerr := d.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func firstNames(names []string) string {
	if len(names) > 3 {
		return strings.Join(names[:3], ", ") + ", ..."
	}
	return strings.Join(names, ", ")
}

func oserrNotExist(err error) bool { return err != nil && errors.Is(err, os.ErrNotExist) }

// writeMarker writes the marker atomically: a temporary file, synced, renamed, and the
// directory synced, so a crash leaves either no marker or a whole one.
func writeMarker(fs vfs.FS, dir string) error {
	tmp := fs.PathJoin(dir, MarkerFile+".tmp")
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("pebblelog: creating marker in %s: %w", dir, err)
	}
	_, err = io.WriteString(f, markerPrefix+strconv.Itoa(FormatVersion)+"\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, fs.PathJoin(dir, MarkerFile))
	}
	if err == nil {
		var d vfs.File
		if d, err = fs.OpenDir(dir); err == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("pebblelog: writing marker in %s: %w", dir, err)
	}
	return nil
}

func checkMarker(fs vfs.FS, dir string) error {
	f, err := fs.Open(fs.PathJoin(dir, MarkerFile))
	if err != nil {
		return fmt.Errorf("pebblelog: reading marker in %s: %w", dir, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 256))
	if err != nil {
		return fmt.Errorf("pebblelog: reading marker in %s: %w", dir, err)
	}
	text := strings.TrimSpace(string(b))
	if !strings.HasPrefix(text, markerPrefix) {
		return fmt.Errorf("%w: %s: %s does not start with %q", ErrNotAStore, dir, MarkerFile, markerPrefix)
	}
	v, err := strconv.Atoi(strings.TrimPrefix(text, markerPrefix))
	if err != nil || v < 1 {
		return fmt.Errorf("%w: %s: %s names format %q", ErrNotAStore, dir, MarkerFile, strings.TrimPrefix(text, markerPrefix))
	}
	if v > FormatVersion {
		return fmt.Errorf("%w: %s: format %d, this build reads up to %d; use a newer worklog", ErrFormatTooNew, dir, v, FormatVersion)
	}
	return nil
}

// checkFormatKey checks (or, on a new store, writes) the format key inside the database,
// the second half of the marker: a directory with a marker but someone else's database in
// it is refused.
func (s *Store) checkFormatKey() error {
	want := []byte(markerPrefix + strconv.Itoa(FormatVersion))
	v, ok, err := reader{s.db}.get(keyFormat)
	if err != nil {
		return fmt.Errorf("pebblelog: %s: reading format key: %w", s.dir, err)
	}
	if !ok {
		it, err := s.db.NewIter(nil)
		if err != nil {
			return err
		}
		empty := !it.First()
		it.Close()
		if !empty {
			return fmt.Errorf("%w: %s: the database has data but no worklog format key", ErrNotAStore, s.dir)
		}
		if s.opts.ReadOnly {
			return nil // an empty store that was never written
		}
		return s.db.Set(keyFormat, want, pebble.Sync)
	}
	if !bytes.HasPrefix(v, []byte(markerPrefix)) {
		return fmt.Errorf("%w: %s: format key holds %q", ErrNotAStore, s.dir, v)
	}
	n, err := strconv.Atoi(string(v[len(markerPrefix):]))
	if err != nil {
		return fmt.Errorf("%w: %s: format key holds %q", ErrNotAStore, s.dir, v)
	}
	if n > FormatVersion {
		return fmt.Errorf("%w: %s: format %d, this build reads up to %d", ErrFormatTooNew, s.dir, n, FormatVersion)
	}
	return nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// LastSeq returns the sequence of the last committed event.
func (s *Store) LastSeq() (uint64, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.closeMu.RUnlock()
	return reader{s.db}.LastSeq()
}

// enter registers a call in flight; the caller must s.closeMu.RUnlock() when done.
func (s *Store) enter() error {
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	return nil
}

// Close stops the writer after the commands already queued, syncs, and closes the database.
// Closing twice is fine.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.reqs != nil {
		close(s.reqs)
		<-s.done
		if s.opts.NoSync {
			err = s.db.LogData(nil, pebble.Sync)
		}
	}
	err = errors.Join(err, s.db.Close(), s.lock.Close())
	return err
}

// View runs fn against the committed projection.
func (s *Store) View(fn func(projection.Reader) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	return fn(reader{s.db})
}

// ViewSnapshot runs fn against a consistent point-in-time view of the whole store.
func (s *Store) ViewSnapshot(fn func(projection.Reader) error) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	return fn(reader{snap})
}

// ReadLog calls fn for each event with seq >= from (inclusive), in order, until fn returns
// an error. An event that does not decode stops the walk with an error naming its sequence.
func (s *Store) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return s.ReadRange(ctx, from, 0, fn)
}

// ReadRange is ReadLog bounded by to (inclusive; 0 means the end).
func (s *Store) ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return s.readRange(ctx, from, to, events.Decode, fn)
}

// FoldRange is ReadRange for a fold, which keeps no event: the event handed to fn is decoded
// into a struct that the next event of its type reuses (events.Decoder), so fn must not keep
// the event after it returns. It may keep the event's strings and byte strings, as
// projection.Apply does in a projection.Mem.
func (s *Store) FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	var d events.Decoder
	return s.readRange(ctx, from, to, d.Decode, fn)
}

func (s *Store) readRange(ctx context.Context, from, to uint64,
	decode func([]byte, uint64) (events.Event, error), fn func(events.Event) error) error {
	return s.RawLog(ctx, from, to, func(seq uint64, raw []byte) error {
		ev, err := decode(raw, seq) // copies what it keeps: raw is reused by the walk
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// decodeAt decodes the event under the iterator with d.
func decodeAt(it *pebble.Iterator, d *events.Decoder) (events.Event, error) {
	k := it.Key()
	if len(k) != 9 {
		return nil, fmt.Errorf("%w: event key %q has the wrong length", events.ErrCorrupt, k)
	}
	seq := beUint64(k[1:])
	v, err := it.ValueAndErr()
	if err != nil {
		return nil, fmt.Errorf("pebblelog: reading event at seq %d: %w", seq, err)
	}
	return d.Decode(v, seq)
}

func beUint64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// walk runs fn at every key of [lower, upper) in order, until fn returns an error: the one
// iteration loop of the store's read methods. It registers the call (so Close waits for it),
// checks ctx at every step and always closes the iterator. The key and value fn sees are only
// valid during the call.
func (s *Store) walk(ctx context.Context, lower, upper []byte, fn func(key []byte, it *pebble.Iterator) error) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(it.Key(), it); err != nil {
			return err
		}
	}
	return it.Error()
}

// SessionSeqs calls fn with the sequence of every event of one session with seq >= from,
// in order, using the per-session index: no scan of other sessions' events.
func (s *Store) SessionSeqs(ctx context.Context, session string, from uint64, fn func(seq uint64) error) error {
	p := sessionPrefix(session)
	return s.walk(ctx, sessionEventKey(session, from), prefixEnd(p), func(k []byte, _ *pebble.Iterator) error {
		if len(k) != len(p)+8 {
			return fmt.Errorf("%w: session index key %q", ErrCorruptRecord, k)
		}
		return fn(beUint64(k[len(p):]))
	})
}

// SessionLog calls fn for each event of one session with seq >= from, in order.
func (s *Store) SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error {
	return s.SessionSeqs(ctx, session, from, func(seq uint64) error {
		ev, err := s.Event(seq)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// Event reads the event at seq.
func (s *Store) Event(seq uint64) (events.Event, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	v, ok, err := reader{s.db}.get(eventKey(seq))
	if err != nil {
		return nil, fmt.Errorf("pebblelog: reading event at seq %d: %w", seq, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w at seq %d: the event is missing", events.ErrCorrupt, seq)
	}
	return events.Decode(v, seq)
}

// Checkpoint writes a consistent copy of the store into dir, which must not exist, while the
// store keeps running. Files are hard-linked where possible. The copy opens like any store.
// The marker is written last: a crash in between leaves a directory Open refuses as not a
// store; delete it and take the checkpoint again.
func (s *Store) Checkpoint(dir string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	if _, err := s.fs.Stat(dir); err == nil {
		return fmt.Errorf("pebblelog: checkpoint destination %s already exists", dir)
	}
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("pebblelog: checkpoint of %s into %s: %w", s.dir, dir, err)
	}
	return writeMarker(s.fs, dir)
}

// Metrics returns Pebble's metrics, for benchmarks and the replay tool's stats.
func (s *Store) Metrics() *pebble.Metrics { return s.db.Metrics() }

// DiskUsage returns the bytes the store occupies on disk.
func (s *Store) DiskUsage() uint64 { return s.db.Metrics().DiskSpaceUsage() }

// slogLogger adapts slog to Pebble's logger.
type slogLogger struct{ l *slog.Logger }

func (l slogLogger) Infof(format string, args ...any) {
	l.l.Info(fmt.Sprintf(format, args...), "component", "pebble")
}

func (l slogLogger) Errorf(format string, args ...any) {
	l.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf is called by Pebble on unrecoverable errors; Pebble expects it not to return.
func (l slogLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.l.Error(msg, "component", "pebble", "fatal", true)
	panic("pebble: " + msg)
}
