package pebblelog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// FormatVersion is the store format this build writes and the newest it reads: the key
// layout (keys.go), the projection record layout (internal/recordcodec), the blob files
// (blob.go) and the marker. A later build opens a store of this format, forever: it reads it,
// or upgrades it in place on a read-write Open (docs/pebble.md, "Store formats and the
// upgrade promise"). Format 7 (without schedules) is upgraded in place (upgrade.go); the
// earlier development formats 1 to 6 are refused (ErrFormatTooOld).
const FormatVersion = 8

// MinFormatVersion is the oldest store format this build opens: a read-write Open upgrades
// a store of an older format than FormatVersion in place; a read-only one reads it as it is.
// Stores of the earlier development formats are refused (ErrFormatTooOld).
const MinFormatVersion = 7

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

// SocketFile is the socket of the inspection endpoint that work.Open serves in the store
// directory while it holds the store (internal/inspect): the one file of a store that is a
// socket, not a regular file. Open leaves it alone; the next work.Open removes a crashed
// process's.
const SocketFile = "WORKLOG.sock"

const markerPrefix = "worklog store format "

// The defaults of Options, and the bounds Validate enforces. work.Options takes its defaults
// from here too.
const (
	// DefaultCacheSize is the block cache, beside the two memtables (see Options.CacheSize).
	DefaultCacheSize = 24 << 20
	// DefaultMemTableSize is one memtable. Pebble's own 4 MiB stalls writers under bursts.
	DefaultMemTableSize = 16 << 20
	// DefaultMaxBatchCommands bounds the commands folded into one batch and one fsync.
	DefaultMaxBatchCommands = 1024
	// DefaultRecordCacheSize is the writer's record cache, in estimated bytes.
	DefaultRecordCacheSize = 4 << 20

	// MinMemTableSize is the smallest MemTableSize: Pebble's first memtable is 256 KiB and
	// grows to MemTableSize, and below about 2 KiB (its empty skiplists) Pebble panics in
	// Open. A smaller memtable than its first one would only flush more often.
	MinMemTableSize = 256 << 10
	// MaxMemTableSize is the largest MemTableSize. Pebble refuses 4 GiB and more; two
	// memtables are charged to the block cache, and a memtable is replayed from the WAL
	// on every Open, so worklog stops at 1 GiB.
	MaxMemTableSize = 1 << 30
	// MaxCacheSize is the largest CacheSize: the cache is made CacheSize + 2 × MemTableSize
	// bytes, which must fit in an int64. Pebble allocates blocks as they are read, so a
	// large bound costs nothing until used.
	MaxCacheSize = 1 << 50
	// MaxMaxBatchCommands is the largest MaxBatchCommands: the writer's queue and its group
	// are allocated at that size up front, and group commit stops paying long before it.
	MaxMaxBatchCommands = 1 << 16
)

// Options configures Open. The zero value is usable: every zero field takes its default
// (EnsureDefaults), and Open checks the result (Validate) before it touches the directory.
type Options struct {
	// FS is the filesystem. Default vfs.Default.
	FS vfs.FS
	// NoSync commits batches without an fsync: see work.SyncNever for what a crash loses.
	// It does not apply to blob files (store format 4): a blob and its directory entry are
	// fsynced before any batch that refers to it commits, NoSync or not, since a later WAL
	// sync can make that batch durable (the log never refers to a blob a crash lost).
	// Default false: every acknowledged batch is synced.
	NoSync bool
	// ReadOnly opens an existing store without changing its contents; Update fails. The
	// lock files (WORKLOG.lock, Pebble's LOCK) are created if missing, unless the directory
	// cannot be written (a read-only mount, another user's store): then Open takes shared
	// locks and creates nothing (see Open). Default false.
	ReadOnly bool
	// CacheSize is Pebble's block cache in bytes. Default DefaultCacheSize (24 MiB); at
	// most MaxCacheSize. Pebble charges every memtable to the block cache too, so the cache
	// is created with room for two memtables on top (2 × MemTableSize): otherwise two 32 MiB
	// memtables would leave a 64 MiB cache no room for a single block, and every read would
	// go to the disk. With the defaults the cache and the memtables together stay within
	// 56 MiB.
	CacheSize int64
	// MemTableSize is one Pebble memtable in bytes. Default DefaultMemTableSize (16 MiB);
	// between MinMemTableSize (256 KiB) and MaxMemTableSize (1 GiB).
	MemTableSize uint64
	// MaxBatchCommands bounds the commands folded into one batch. Default
	// DefaultMaxBatchCommands (1024); at most MaxMaxBatchCommands.
	MaxBatchCommands int
	// RecordCacheSize bounds, in estimated bytes, the writer's cache of the task and wake
	// records it committed last (read by the next commands on the same tasks instead of a
	// Pebble Get), and four times as much for the records and idempotency keys an idempotent
	// repeat read (ViewDurable), which answer the next repeat of the same key from memory.
	// Default DefaultRecordCacheSize (4 MiB); negative disables both.
	RecordCacheSize int
	// Logger receives Pebble's messages. Default: discarded.
	Logger *slog.Logger
	// StallTimeout bounds how long a commit or a WAL sync may wait inside Pebble (a write
	// stall behind a flush that keeps failing on a full disk, a disk that stopped answering)
	// before the store fails with ErrStoreFailed and every waiting call is answered; it also
	// bounds how long Open waits for a recovery whose flush keeps failing. The failure is
	// reported between StallTimeout and 1.25 × StallTimeout after the wait began. Default
	// DefaultStallTimeout (30 s); negative: wait forever.
	StallTimeout time.Duration
}

// EnsureDefaults sets every zero field to its default. Open calls it; callers that show or
// check the options first (work.Open) call it too.
func (o *Options) EnsureDefaults() {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.CacheSize == 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	if o.MaxBatchCommands == 0 {
		o.MaxBatchCommands = DefaultMaxBatchCommands
	}
	if o.RecordCacheSize == 0 {
		o.RecordCacheSize = DefaultRecordCacheSize
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = DefaultStallTimeout
	}
}

// Validate returns an *OptionError (matching ErrInvalidOptions) naming the first field out
// of range, or nil. A zero field stands for its default and is valid. Open calls it before
// it touches the directory, so bad options never leave a half-made store.
func (o *Options) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &OptionError{Options: "pebblelog.Options", Field: field, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case o.CacheSize < 0 || o.CacheSize > MaxCacheSize:
		return bad("CacheSize", "%d is out of range: 0 (the default, %d) to %d", o.CacheSize, DefaultCacheSize, int64(MaxCacheSize))
	case o.MemTableSize != 0 && (o.MemTableSize < MinMemTableSize || o.MemTableSize > MaxMemTableSize):
		return bad("MemTableSize", "%d is out of range: %d to %d, or 0 for the default %d", o.MemTableSize, MinMemTableSize, MaxMemTableSize, DefaultMemTableSize)
	case o.MaxBatchCommands < 0 || o.MaxBatchCommands > MaxMaxBatchCommands:
		return bad("MaxBatchCommands", "%d is out of range: 1 to %d, or 0 for the default %d", o.MaxBatchCommands, MaxMaxBatchCommands, DefaultMaxBatchCommands)
	}
	return nil
}

// Open opens the store in dir, creating it when dir is missing, empty, or holds a creation
// that was interrupted. o may be nil (all defaults); Open does not modify *o.
//
// Every refusal is an *OpenError naming dir, matching its kind with errors.Is:
//   - ErrInvalidOptions: a field of o is out of range (Validate; the *OptionError is
//     wrapped); dir is not touched.
//   - ErrNotAStore: dir is a file, or a non-empty directory that is not a worklog store
//     (no WORKLOG marker, a marker of an unknown form, someone else's database), or, with
//     ReadOnly, a missing or empty directory.
//   - ErrFormatTooNew: the marker or the format key names a newer format.
//   - ErrFormatTooOld: the format key names an earlier development format (1 to 6); the
//     Hint says how to move the data (replay export --wire with an earlier build, replay
//     import with this one).
//   - ErrLocked: another process, or another Open in this one, holds the store.
//   - ErrCorruptStore: the marker says a store exists but a file of its database is missing
//     or damaged, or the marker itself is missing from a directory that worklog's own files
//     (WORKLOG.closed, WORKLOG.lock beside a Pebble database) show was a store
//     (OpenError.File names the file when known; a missing Pebble marker by its pattern).
//   - ErrReadOnlyStore: a read-write Open of a directory that cannot be written.
//   - ErrStoreFailed: reading or writing the directory failed (the cause is wrapped).
//
// A refused Open of an existing store changes none of its files: once the marker exists,
// Pebble is never asked to create a database, and the checks run on a read-only open before
// the read-write one (whose WAL recovery rewrites files). The lock files may be created.
//
// A ReadOnly Open of a directory it cannot write (a read-only mount, a backup, another
// user's store: opening the lock file for writing fails with EROFS or EACCES) creates
// nothing: it takes shared fcntl locks on the lock files that exist, opened read-only, so a
// writer holding the store (another user's running service) still makes it ErrLocked, and a
// writer cannot start while it reads. Where a lock file is missing, or fcntl locks do not
// exist (not unix), it takes no lock: nothing then stops a writer from opening the store
// while it is read, which on a read-only mount cannot happen.
func Open(dir string, o *Options) (*Store, error) {
	var opts Options
	if o != nil {
		opts = *o
	}
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		oe := err.(*OptionError)
		return nil, &OpenError{Dir: dir, Kind: ErrInvalidOptions, Field: oe.Field, Offset: -1, Detail: oe.Message, Err: oe}
	}
	fs := opts.FS
	refuse := func(kind error, format string, args ...any) *OpenError {
		return &OpenError{Dir: dir, Kind: kind, Offset: -1, Detail: fmt.Sprintf(format, args...)}
	}

	names, err := fs.List(dir)
	switch {
	case oserrNotExist(err):
		if opts.ReadOnly {
			return nil, refuse(ErrNotAStore, "directory does not exist")
		}
		if err := mkdirAllSynced(fs, dir); err != nil {
			return nil, ioError(dir, "", "creating the directory", err)
		}
		names = nil
	case err != nil:
		if fi, serr := fs.Stat(dir); serr == nil && !fi.IsDir() {
			return nil, refuse(ErrNotAStore, "not a directory")
		}
		return nil, ioError(dir, "", "listing the directory", err)
	}
	state := dirState(names)
	switch {
	case state == dirForeign && wasStore(names):
		// Not someone else's directory: worklog's own files are there beside a Pebble
		// database, so this is a store that lost its marker. Reporting it as "not a store"
		// would invite the user to look elsewhere (or to delete it); making a new marker would
		// guess its format and open a store that is missing a file. It is damage.
		e := refuse(ErrCorruptStore, "%s is missing, but the directory holds a worklog store (%s)", MarkerFile, firstNames(storeEvidence(names)))
		e.File = MarkerFile
		e.Hint = "restore " + MarkerFile + " (or the whole store) from a backup or a checkpoint"
		return nil, e
	case state == dirForeign:
		e := refuse(ErrNotAStore, "the directory is not empty and has no %s file (found %s)", MarkerFile, firstNames(foreignNames(names)))
		return nil, e
	case state == dirEmpty && opts.ReadOnly:
		return nil, refuse(ErrNotAStore, "the directory is empty")
	case state == dirCreating && opts.ReadOnly:
		e := refuse(ErrNotAStore, "its creation was interrupted (%s.tmp without %s)", MarkerFile, MarkerFile)
		e.Hint = "open it read-write once to finish creating it"
		return nil, e
	case state == dirStore:
		if err := checkMarker(fs, dir); err != nil {
			return nil, err
		}
	}
	if state == dirStore || state == dirCreating {
		if err := checkRegularFiles(fs, dir, names); err != nil {
			return nil, err
		}
	}

	l, err := lockDir(fs, dir, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	s, err := open(dir, opts, state == dirStore, l)
	if err != nil {
		l.Close()
		return nil, asOpenError(dir, err)
	}
	return s, nil
}

// What a directory holds, from its listing.
const (
	dirEmpty    = iota // nothing, or only the lock files: a new store is made here
	dirCreating        // WORKLOG.tmp without WORKLOG: a creation interrupted after it began
	dirStore           // WORKLOG: a store
	dirForeign         // anything else: not ours
)

func dirState(names []string) int {
	marker, tmp, foreign := false, false, false
	for _, n := range names {
		switch n {
		case MarkerFile:
			marker = true
		case MarkerFile + ".tmp":
			tmp = true
		case lockFile:
		case "LOCK":
			// Pebble's lock, which Open takes right after WORKLOG.lock and before it writes
			// WORKLOG.tmp: beside WORKLOG.lock it is a creation that failed before it began
			// (a full disk), not someone else's database. Alone it is foreign.
			foreign = foreign || !slices.Contains(names, lockFile)
		default:
			foreign = true
		}
	}
	switch {
	case marker:
		return dirStore
	case tmp:
		// Creation writes WORKLOG.tmp first and renames it to WORKLOG last (see open), so
		// Pebble's files beside WORKLOG.tmp are a creation that did not finish: no Open
		// returned the store, so it holds nothing acknowledged, and opening it finishes it.
		return dirCreating
	case foreign:
		return dirForeign
	}
	return dirEmpty
}

// wasStore reports whether a directory without WORKLOG (or WORKLOG.tmp) was a worklog store:
// worklog's clean-close record or sync witness, or its lock file beside Pebble's database. Neither is made
// before WORKLOG.tmp is (a foreign directory is refused before the lock is taken), and a
// creation that never got as far as WORKLOG.tmp made no database, so such a directory had
// WORKLOG once.
func wasStore(names []string) bool {
	if slices.Contains(names, cleanCloseFile) || slices.Contains(names, witnessFile) {
		return true
	}
	return slices.Contains(names, lockFile) && slices.ContainsFunc(names, isPebbleDatabaseFile)
}

// storeEvidence names the files that make wasStore true, for the error.
func storeEvidence(names []string) []string {
	var out []string
	for _, n := range []string{cleanCloseFile, witnessFile, lockFile} {
		if slices.Contains(names, n) {
			out = append(out, n)
		}
	}
	for _, n := range names {
		if isPebbleDatabaseFile(n) {
			out = append(out, n)
		}
	}
	return out
}

// isPebbleDatabaseFile reports whether n is a file only a Pebble database has: a MANIFEST or
// its marker, the format marker. (LOCK is not: worklog takes it before creating anything.)
func isPebbleDatabaseFile(n string) bool {
	return strings.HasPrefix(n, "MANIFEST-") || strings.HasPrefix(n, "marker.")
}

func foreignNames(names []string) []string {
	var out []string
	for _, n := range names {
		if n != lockFile && n != MarkerFile+".tmp" && !(n == "LOCK" && slices.Contains(names, lockFile)) {
			out = append(out, n)
		}
	}
	return out
}

// locks are the store's two inter-process locks: worklog's WORKLOG.lock, taken first so that
// a store held by another process is reported as such, and Pebble's LOCK, taken once here and
// handed to every pebble.Open of this Open (the read-only check and the read-write open).
type locks struct {
	worklog io.Closer
	pebble  *pebble.Lock
	id      fileID // the directory's entry in openDirs; zero: none
}

func (l *locks) Close() error {
	err := errors.Join(l.pebble.Close(), l.worklog.Close())
	openDirs.remove(l.id)
	return err
}

// openDirs are the directories of the stores open in this process, by device and inode.
// fcntl locks belong to the process: a second Open of a store through another path to the
// same directory ("dir/.", a symlink) would lock it again and succeed, and closing either
// would drop the other's lock; Pebble's own guard compares path strings, and through the
// same path answered with its raw "lock held by current process" (issue 26.7).
var openDirs = &dirRegistry{ids: map[fileID]string{}}

type dirRegistry struct {
	mu  sync.Mutex
	ids map[fileID]string // the directory's path as the first Open was given it
}

// add registers id; false, and the path the store is open as, if it is open already.
func (r *dirRegistry) add(id fileID, dir string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.ids[id]; ok {
		return prev, false
	}
	r.ids[id] = dir
	return "", true
}

// remove unregisters id (the zero id: nothing was registered).
func (r *dirRegistry) remove(id fileID) {
	if id == (fileID{}) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.ids, id)
}

// registerOpen registers dir as open in this process, before its locks are taken: an
// *OpenError of kind ErrLocked if it is already. The zero id where the FS has no inodes (an
// in-memory FS, whose own Lock guards it).
func registerOpen(fs vfs.FS, dir string) (fileID, error) {
	fi, err := fs.Stat(dir)
	if err != nil {
		return fileID{}, nil // the lock reports it
	}
	id, ok := idOf(fi)
	if !ok {
		return fileID{}, nil
	}
	if prev, ok := openDirs.add(id, dir); !ok {
		return fileID{}, &OpenError{Dir: dir, Kind: ErrLocked, Offset: -1,
			Detail: fmt.Sprintf("already open in this process (as %s)", prev),
			Hint:   "share the open *Store (work: the *Queue) instead of opening it again; to read a copy, take a checkpoint"}
	}
	return id, nil
}

// lockDir takes both locks. A read-only open of a directory it cannot write takes shared
// locks instead, on the lock files that exist (see sharedLock and Open): the exclusive lock
// needs the file open for writing, and Pebble's would fail the same way.
func lockDir(fs vfs.FS, dir string, readOnly bool) (_ *locks, err error) {
	id, err := registerOpen(fs, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			openDirs.remove(id)
		}
	}()
	l, err := takeLocks(fs, dir, readOnly)
	if err != nil {
		return nil, err
	}
	l.id = id
	return l, nil
}

func takeLocks(fs vfs.FS, dir string, readOnly bool) (*locks, error) {
	wl, err := fs.Lock(fs.PathJoin(dir, lockFile))
	if err != nil && notWritable(err) {
		if readOnly {
			return sharedLocks(fs, dir)
		}
		return nil, &OpenError{Dir: dir, Kind: ErrReadOnlyStore, File: lockFile, Offset: -1,
			Detail: "the directory cannot be written", Hint: "open it read-only", Err: err}
	}
	if err != nil {
		return nil, lockedError(dir, lockFile, err)
	}
	pl, err := pebble.LockDirectory(dir, fs)
	if err != nil {
		wl.Close()
		if notWritable(err) {
			return nil, ioError(dir, "LOCK", "locking", err)
		}
		return nil, lockedError(dir, "LOCK", err)
	}
	return &locks{worklog: wl, pebble: pl}, nil
}

func sharedLocks(fs vfs.FS, dir string) (*locks, error) {
	wl, err := sharedLock(fs, fs.PathJoin(dir, lockFile))
	if err != nil {
		return nil, lockedError(dir, lockFile, err)
	}
	pl, err := pebble.LockDirectory(dir, sharedLockFS{fs})
	if err != nil {
		wl.Close()
		return nil, lockedError(dir, "LOCK", err)
	}
	return &locks{worklog: wl, pebble: pl}, nil
}

func lockedError(dir, file string, err error) error {
	return &OpenError{Dir: dir, Kind: ErrLocked, File: file, Offset: -1, Err: err,
		Hint: "to inspect a live store, take a checkpoint with Queue.Checkpoint and open that"}
}

// notWritable reports whether err says a file cannot be created or written for lack of
// permission or on a read-only filesystem.
func notWritable(err error) bool {
	return errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS)
}

// sharedLockFS is fs whose Lock takes a shared lock and creates nothing (sharedLock).
type sharedLockFS struct{ vfs.FS }

func (fs sharedLockFS) Lock(name string) (io.Closer, error) { return sharedLock(fs.FS, name) }

type noLock struct{}

func (noLock) Close() error { return nil }

// ioError is an Open that failed for a reason other than what the directory holds: a read
// or a write of the filesystem failed.
func ioError(dir, file, doing string, err error) *OpenError {
	return &OpenError{Dir: dir, Kind: ErrStoreFailed, File: file, Offset: -1, Detail: doing + " failed", Err: err}
}

// open opens Pebble on a directory Open has checked and locked. A new store (exists false)
// is made in this order: WORKLOG.tmp, Pebble's database, the format key, then WORKLOG.tmp
// renamed to WORKLOG; a crash anywhere leaves a directory the next Open finishes creating
// (dirCreating). An existing store is first opened read-only and checked, so that a refusal
// changes nothing; Pebble is never allowed to create its database there.
func open(dir string, o Options, exists bool, l *locks) (*Store, error) {
	fs := o.FS
	if exists {
		// Under the lock: a running store moves its MANIFEST marker as it goes.
		if err := checkPebbleMarkers(fs, dir); err != nil {
			return nil, err
		}
	} else if err := writeMarkerTmp(fs, dir); err != nil {
		return nil, err
	}
	cache := newBlockCache(o.CacheSize, o.MemTableSize)
	defer cache.Unref()
	if exists {
		// Before Pebble reads the WALs: Pebble takes some damage for a torn tail and drops
		// acknowledged batches without a word (walcheck.go).
		if err := checkWAL(fs, dir); err != nil {
			return nil, err
		}
	}
	po := pebbleOptions(o, cache, l.pebble, exists)
	fh := installFailureHandling(po, dir, o)
	if exists && !o.ReadOnly {
		if err := checkReadOnly(dir, po, fh); err != nil {
			return nil, err
		}
	}
	db, err := fh.open(dir, po)
	if err != nil {
		return nil, pebbleOpenError(po, dir, err)
	}
	s := &Store{dir: dir, fs: fs, opts: o, db: db, lock: l, fh: fh, blobs: newBlobStore(fs, dir),
		dcache: newDurableCache(durableCacheSize(o.RecordCacheSize))}
	fail := func(err error) (*Store, error) {
		if !fh.parked.Load() && fh.calls.Load() == 0 { // a parked Pebble goroutine may hold what Close waits for
			db.Close()
		}
		return nil, err
	}
	if !exists {
		if err := fh.call("rotating the first WAL", func() error { return rotateFirstWAL(db) }); err != nil { // before the first write (walrotate.go)
			return fail(ioError(dir, "", "rotating the new store's first WAL", err))
		}
	}
	if err := checkFormatKey(dir, db, fh, exists, o.ReadOnly); err != nil {
		return fail(err)
	}
	if err := fh.err(); err != nil { // a new store's format key write failed (see upgrade)
		return fail(asOpenError(dir, err))
	}
	if !exists {
		if err := commitMarker(fs, dir); err != nil {
			return fail(err)
		}
	}
	if err := s.upgrade(); err != nil {
		return fail(err)
	}
	// A write of Open's own (the format key, the upgrade) may have failed the store through
	// its handlers (a failed WAL sync) even where Pebble's call returned: such a store is
	// not handed out.
	if err := fh.err(); err != nil {
		return fail(asOpenError(dir, err))
	}
	last, err := reader{r: db}.LastSeq()
	if err != nil {
		return fail(&OpenError{Dir: dir, Kind: ErrCorruptStore, Offset: -1, Detail: "reading the last sequence", Err: err})
	}
	s.lastSeq = last
	// What Open found is what a follower may read (follow.go).
	fh.durable.Advance(last)
	if exists && o.ReadOnly { // a read-write Open checked it in checkReadOnly
		if err := checkWitness(fs, dir, last); err != nil {
			return fail(err)
		}
	}
	if !o.ReadOnly {
		if err := s.sweepOrphans(); err != nil {
			return fail(&OpenError{Dir: dir, Kind: ErrStoreFailed, File: BlobDir, Offset: -1, Detail: "removing orphan blobs", Err: err})
		}
		if s.maxIDs, err = (reader{r: db}).maxIDs(); err != nil {
			return fail(&OpenError{Dir: dir, Kind: ErrCorruptStore, Offset: -1, Detail: "reading the greatest record ids", Err: err})
		}
		if s.counts, err = (reader{r: db}).loadCounts(); err != nil {
			return fail(&OpenError{Dir: dir, Kind: ErrCorruptStore, Offset: -1, Detail: "reading the counts", Err: err})
		}
		if s.policies, err = (reader{r: db}).loadPolicies(); err != nil {
			return fail(&OpenError{Dir: dir, Kind: ErrCorruptStore, Offset: -1, Detail: "reading the kind policies", Err: err})
		}
		// Watch the directory and the lock file Open took (dirwatch.go), from here on.
		dw, err := newDirWatch(fs, dir)
		if err != nil {
			return fail(ioError(dir, lockFile, "recording the directory's identity", err))
		}
		fh.dirs.Store(dw)
		fh.dirChecked.Store(fh.now() + 1)
		s.reqs = make(chan *request, o.MaxBatchCommands)
		s.done = make(chan struct{})
		go s.writeLoop()
	}
	return s, nil
}

// pebbleOptions are the Pebble options of a store: the one place they are built.
func pebbleOptions(o Options, cache *pebble.Cache, lock *pebble.Lock, exists bool) *pebble.Options {
	po := &pebble.Options{
		FS:                          o.FS,
		Cache:                       cache,
		MemTableSize:                o.MemTableSize,
		MemTableStopWritesThreshold: 2,
		FormatMajorVersion:          pebbleFormat,
		Logger:                      slogLogger{o.Logger},
		ReadOnly:                    o.ReadOnly,
		// Once the marker says a store exists, a missing database is damage, never a
		// reason to make a new one (which would replace the MANIFEST and the WALs).
		ErrorIfNotExists: exists,
		Lock:             lock,
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
	return po
}

// checkReadOnly opens the existing store read-only and checks it, before the read-write open.
// A read-write pebble.Open recovers the WALs by flushing them into sstables, writes a new
// MANIFEST and OPTIONS and deletes obsolete files: a refusal after it would leave the store
// changed. A read-only open writes nothing. It costs a second replay of the unflushed WAL
// (at most about two memtables).
func checkReadOnly(dir string, po *pebble.Options, fh *failures) error {
	ro := po.Clone()
	ro.ReadOnly = true
	db, err := fh.open(dir, ro)
	if err != nil {
		return pebbleOpenError(po, dir, err)
	}
	// The witness first: a store whose only WAL was lost is short of it, and the witness
	// names a file where the format key's check can only say the database is empty.
	err = checkWitnessOf(dir, po.FS, db)
	if err == nil {
		err = checkFormatKey(dir, db, nil, true, true)
	}
	if cerr := db.Close(); err == nil && cerr != nil {
		err = ioError(dir, "", "closing the read-only check", cerr)
	}
	return err
}

// checkPebbleMarkers checks, before Pebble is opened, that an existing store still has the
// files that say where its database is: the MANIFEST marker and the MANIFEST it names, and
// the format marker. Without them Pebble would see no database (or a new one) and report it
// in its own words; here the missing file is named.
func checkPebbleMarkers(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if err != nil {
		return ioError(dir, "", "listing the directory", err)
	}
	missing := func(file, detail string) error {
		return &OpenError{Dir: dir, Kind: ErrCorruptStore, File: file, Offset: -1, Detail: detail,
			Hint: "the store's Pebble database is incomplete; restore it from a backup or a checkpoint"}
	}
	manifestMarker, formatMarker := "", ""
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, "marker.manifest.") && n > manifestMarker:
			manifestMarker = n // marker.manifest.<iteration, zero-padded>.<MANIFEST file>
		case strings.HasPrefix(n, "marker.format-version."):
			formatMarker = n
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool {
		return n != MarkerFile && n != MarkerFile+".tmp" && n != lockFile && n != "LOCK"
	}) {
		e := missing("", fmt.Sprintf("%s says a store exists, but the directory holds no database", MarkerFile)).(*OpenError)
		e.Hint = "older builds wrote " + MarkerFile + " before the database: if one was interrupted while creating this store, it never held data and the directory can be deleted"
		return e
	}
	// A missing marker has no name of its own; File names it by its pattern.
	if manifestMarker == "" {
		return missing("marker.manifest.*", fmt.Sprintf("%s says a store exists, but the MANIFEST marker (marker.manifest.*) is missing", MarkerFile))
	}
	if formatMarker == "" {
		return missing("marker.format-version.*", "Pebble's format marker (marker.format-version.*) is missing")
	}
	parts := strings.SplitN(manifestMarker, ".", 4)
	if len(parts) < 4 {
		return missing(manifestMarker, "the MANIFEST marker names no MANIFEST")
	}
	if !slices.Contains(names, parts[3]) {
		return missing(parts[3], "the MANIFEST named by "+manifestMarker+" is missing")
	}
	return nil
}

// pebbleOpenError turns a failed pebble.Open of an existing store into an *OpenError: a
// filesystem failure other than a missing file is ErrStoreFailed; anything else (a missing
// or damaged MANIFEST, sstable, WAL or marker) is ErrCorruptStore, with the file named when
// Pebble's message names one.
func pebbleOpenError(po *pebble.Options, dir string, err error) error {
	fs := po.FS
	// Already typed: a failure the store's handlers saw while Pebble opened (damage found
	// by a read, a stalled recovery), which names its file better than Pebble's message.
	var oe *OpenError
	if e := asOpenError(dir, err); errors.As(e, &oe) {
		if oe.Kind == ErrCorruptStore && oe.File == "" {
			oe.File = badOptionsFile(po, dir)
		}
		return oe
	}
	if werr := walReplayError(dir, err); werr != nil {
		return werr
	}
	if errors.Is(err, pebble.ErrDBDoesNotExist) {
		return &OpenError{Dir: dir, Kind: ErrCorruptStore, Offset: -1, Err: err,
			Detail: fmt.Sprintf("%s says a store exists, but Pebble finds no database", MarkerFile),
			Hint:   "restore the store from a backup or a checkpoint"}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != syscall.ENOENT {
		return ioError(dir, pebbleFileIn(fs, dir, err), "opening Pebble", err)
	}
	file := pebbleFileIn(fs, dir, err)
	if file == "" {
		file = badOptionsFile(po, dir) // e.g. "comparer name from file ... != ...": no file named
	}
	return &OpenError{Dir: dir, Kind: ErrCorruptStore, File: file, Offset: -1,
		Detail: "Pebble cannot open the database", Err: err,
		Hint: "restore the store from a backup or a checkpoint"}
}

// badOptionsFile returns the name of dir's newest OPTIONS file if Pebble refuses it, or "".
// Pebble checks that file at Open, and its refusal ("invalid key=value syntax: ...", a
// corruption error) does not name it; it is found by asking Pebble again, on the failure path
// only, so a healthy Open reads nothing more.
func badOptionsFile(po *pebble.Options, dir string) string {
	names, err := po.FS.List(dir)
	if err != nil {
		return ""
	}
	newest, newestNum := "", uint64(0)
	for _, n := range names {
		num, ok := strings.CutPrefix(n, "OPTIONS-")
		if !ok {
			continue
		}
		// Pebble picks the highest file number, which is not the greatest name once the
		// numbers outgrow their zero padding.
		if v, err := strconv.ParseUint(num, 10, 64); err == nil && (newest == "" || v > newestNum) {
			newest, newestNum = n, v
		}
	}
	if newest == "" {
		return ""
	}
	f, err := po.FS.Open(po.FS.PathJoin(dir, newest))
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return newest // Pebble reads the same file and would fail the same way
	}
	o := po.Clone()
	o.EnsureDefaults() // CheckCompatibility compares with the comparer, merger, WAL dir
	if o.CheckCompatibility(dir, string(b)) != nil {
		return newest
	}
	return ""
}

// pebbleFileIn returns the first file of dir that Pebble's error message names, or "".
// Pebble's open errors are not typed by file, so the message is all there is: a file name
// ("MANIFEST-000001", "000005.sst"), a file number with its type ("file 000005 (type
// sstable)", for a file that is missing), or a bare file number ("L0: 000005: ..."), matched
// against the directory. Best effort: it only fills OpenError.File.
func pebbleFileIn(fs vfs.FS, dir string, err error) string {
	names, _ := fs.List(dir)
	for _, m := range pebbleFileName.FindAllStringSubmatch(err.Error(), -1) {
		if f := namedFile(m); f != "" {
			return f
		}
		for _, n := range names {
			if strings.HasPrefix(n, m[2]+".") {
				return n
			}
		}
	}
	return ""
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
	if err := writeMarkerTmp(fs, dir); err != nil {
		return err
	}
	return commitMarker(fs, dir)
}

// writeMarkerTmp writes WORKLOG.tmp, synced, and syncs the directory: the first step of
// creating a store, which says a creation is under way (dirCreating).
func writeMarkerTmp(fs vfs.FS, dir string) error {
	tmp := fs.PathJoin(dir, MarkerFile+".tmp")
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return ioError(dir, MarkerFile+".tmp", "creating the marker", err)
	}
	_, err = io.WriteString(f, markerPrefix+strconv.Itoa(FormatVersion)+"\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(fs, dir)
	}
	if err != nil {
		return ioError(dir, MarkerFile+".tmp", "writing the marker", err)
	}
	return nil
}

// commitMarker renames WORKLOG.tmp to WORKLOG and syncs the directory: the last step of
// creating a store.
func commitMarker(fs vfs.FS, dir string) error {
	err := fs.Rename(fs.PathJoin(dir, MarkerFile+".tmp"), fs.PathJoin(dir, MarkerFile))
	if err == nil {
		err = syncDir(fs, dir)
	}
	if err != nil {
		return ioError(dir, MarkerFile, "writing the marker", err)
	}
	return nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkRegularFiles refuses a store one of whose files (the directory's, and the blob files)
// is neither a regular file nor a directory: a FIFO put in place of a WAL, the MANIFEST, an
// OPTIONS file or an sstable blocked Open for good (the WAL check, Pebble and the blob sweep
// open them, and opening a FIFO for reading waits for a writer). One Stat per file, before
// the locks: nothing is opened or changed.
func checkRegularFiles(fs vfs.FS, dir string, names []string) error {
	check := func(rel string) (isDir bool, err error) {
		st, err := fs.Stat(fs.PathJoin(dir, rel))
		if err != nil {
			if oserrNotExist(err) {
				return false, nil // gone since the listing: the steps after this one report it
			}
			return false, ioError(dir, rel, "reading the directory", err)
		}
		if st.IsDir() || st.Mode().IsRegular() {
			return st.IsDir(), nil
		}
		if rel == SocketFile && st.Mode().Type() == iofs.ModeSocket {
			return false, nil
		}
		return false, &OpenError{Dir: dir, Kind: ErrCorruptStore, File: rel, Offset: -1,
			Detail: fmt.Sprintf("%s is not a regular file (mode %s)", rel, st.Mode().Type()),
			Hint:   "remove it and restore the file from a backup or a checkpoint"}
	}
	for _, n := range names {
		isDir, err := check(n)
		if err != nil {
			return err
		}
		if !isDir || n != BlobDir {
			continue
		}
		blobs, err := fs.List(fs.PathJoin(dir, BlobDir))
		if err != nil {
			return ioError(dir, BlobDir, "listing the blob files", err)
		}
		for _, b := range blobs {
			if _, err := check(BlobDir + "/" + b); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkMarker(fs vfs.FS, dir string) error {
	refuse := func(kind error, format string, args ...any) error {
		return &OpenError{Dir: dir, Kind: kind, File: MarkerFile, Offset: -1, Detail: fmt.Sprintf(format, args...)}
	}
	// Only a regular file is opened: opening a FIFO blocks until something writes into it.
	st, err := fs.Stat(fs.PathJoin(dir, MarkerFile))
	if err != nil {
		return ioError(dir, MarkerFile, "reading the marker", err)
	}
	if !st.Mode().IsRegular() {
		return refuse(ErrNotAStore, "%s is not a regular file (mode %s)", MarkerFile, st.Mode().Type())
	}
	f, err := fs.Open(fs.PathJoin(dir, MarkerFile))
	if err != nil {
		return ioError(dir, MarkerFile, "reading the marker", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 256))
	if err != nil {
		return ioError(dir, MarkerFile, "reading the marker", err)
	}
	text := strings.TrimSpace(string(b))
	if !strings.HasPrefix(text, markerPrefix) {
		return refuse(ErrNotAStore, "does not start with %q", markerPrefix)
	}
	v, err := strconv.Atoi(strings.TrimPrefix(text, markerPrefix))
	if err != nil || v < 1 {
		return refuse(ErrNotAStore, "names format %q", strings.TrimPrefix(text, markerPrefix))
	}
	if v > FormatVersion {
		e := refuse(ErrFormatTooNew, "format %d, this build reads up to %d", v, FormatVersion).(*OpenError)
		e.Hint = "use a newer worklog"
		return e
	}
	return nil
}

// checkFormatKey checks (or, on a new store, writes) the format key inside the database,
// the second half of the marker: a directory with a marker but someone else's database in
// it is refused, and so is an existing store whose database is empty (its WAL or sstables
// are gone: Pebble opens that as a new, empty database). fh runs the write of a new store's
// key (failures.call); nil only where nothing is written (read-only).
func checkFormatKey(dir string, db *pebble.DB, fh *failures, exists, readOnly bool) error {
	want := []byte(markerPrefix + strconv.Itoa(FormatVersion))
	refuse := func(kind error, format string, args ...any) *OpenError {
		return &OpenError{Dir: dir, Kind: kind, Offset: -1, Detail: fmt.Sprintf(format, args...)}
	}
	v, ok, err := reader{r: db}.get(keyFormat)
	if err != nil {
		e := refuse(ErrCorruptStore, "reading the format key")
		e.Err = err
		return e
	}
	if !ok {
		it, err := db.NewIter(nil)
		if err != nil {
			return refuse(ErrCorruptStore, "reading the database: %v", err)
		}
		empty := !it.First()
		err = it.Close()
		switch {
		case err != nil:
			return refuse(ErrCorruptStore, "reading the database: %v", err)
		case !empty:
			return refuse(ErrNotAStore, "the database has data but no worklog format key")
		case exists:
			// Every store has the key from its creation on (it is written before WORKLOG).
			e := refuse(ErrCorruptStore, "the database is empty: its write-ahead log or sstables are missing")
			e.Hint = "restore the store from a backup or a checkpoint"
			return e
		case readOnly:
			return nil
		}
		if err := fh.call("writing the format key", func() error { return db.Set(keyFormat, want, pebble.Sync) }); err != nil {
			return ioError(dir, "", "writing the format key", err)
		}
		return nil
	}
	if !bytes.HasPrefix(v, []byte(markerPrefix)) {
		return refuse(ErrNotAStore, "format key holds %q", v)
	}
	n, err := strconv.Atoi(string(v[len(markerPrefix):]))
	if err != nil {
		return refuse(ErrNotAStore, "format key holds %q", v)
	}
	if n > FormatVersion {
		e := refuse(ErrFormatTooNew, "format %d, this build reads up to %d", n, FormatVersion)
		e.Hint = "use a newer worklog"
		return e
	}
	if n < MinFormatVersion {
		e := refuse(ErrFormatTooOld, "format %d, an earlier development format: this build reads formats %d and %d", n, MinFormatVersion, FormatVersion)
		e.Hint = formatTooOldHint(dir)
		return e
	}
	return nil
}

// formatTooOldHint says how to move the store in dir, of an earlier development format, to
// this build. Builds up to commit 1a968ef read and upgrade every format from 1 on.
func formatTooOldHint(dir string) string {
	return "move its data: with an earlier worklog build that reads it (up to commit 1a968ef), run `replay export " + dir +
		" --wire > store.wlog`; then, with this build, `replay import store.wlog NEWDIR`"
}
