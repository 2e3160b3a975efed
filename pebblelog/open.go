package pebblelog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// FormatVersion is the store format this build writes and the newest it reads: the key
// layout, the projection record layout and the marker. Version 1 is the first; version 2
// writes records without the values their creating event holds (input.go), reads version 1,
// and upgrades it on a read-write open (upgrade.go).
const FormatVersion = 2

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
	if err := s.upgrade(); err != nil {
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
