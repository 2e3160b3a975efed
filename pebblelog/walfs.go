package pebblelog

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The store's WAL files, watched (moved out of failure.go: it is the FS side of the failure handling).
//
// A failed WAL write or sync reaches us through a batch's SyncWait, a moment later. Meanwhile
// Pebble's own code panics on two paths, and one of them cannot be recovered from:
//
//   - a commit whose record fills a WAL block after the WAL writer failed gets the writer's
//     error from LogWriter.SyncRecord, and DB.commitWrite panics with it (in our writer,
//     with Pebble's commit mutex held): publish recovers it;
//   - a commit that fills the memtable rotates the WAL inside the commit (DB.rotateWAL): when
//     closing the old WAL returns the writer's error, or creating the new WAL file fails, it
//     panics with DB.mu unlocked, and the deferred unlock of its caller is then a fatal
//     runtime error ("unlock of unlocked mutex") that no recover catches.
//
// walFS wraps the FS Pebble uses so that the store fails the moment a WAL file operation
// fails (the writer checks before every commit, so it rarely gets that far), and so that a
// rotation that would panic never returns to Pebble: closing a WAL file whose write failed,
// or failing to create a WAL file, while our writer is inside a commit, or while one of our
// other calls that can rotate the WAL runs (failures.call: a flush, a compaction), parks that
// goroutine for good (Pebble's mutexes are held, so the database is not closed again; see
// fatal).
// Nothing else changes: every other call goes straight to the wrapped FS.
type walFS struct {
	vfs.FS
	f *failures
}

// isWAL reports whether name is a WAL file of the store itself: a checkpoint's copies of the
// WAL are written through the same FS, and a checkpoint that fails must not fail the store.
func (fs walFS) isWAL(name string) bool {
	return strings.HasSuffix(name, ".log") && fs.PathDir(name) == fs.PathDir(fs.PathJoin(fs.f.dir, "WORKLOG"))
}

func (fs walFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := fs.FS.Create(name, category)
	return fs.wal(name, file, err)
}

func (fs walFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := fs.FS.ReuseForWrite(oldname, newname, category)
	return fs.wal(newname, file, err)
}

// Unwrap lets Pebble and errorfs-style helpers reach the wrapped FS.
func (fs walFS) Unwrap() vfs.FS { return fs.FS }

func (fs walFS) wal(name string, file vfs.File, err error) (vfs.File, error) {
	if !fs.isWAL(name) {
		return file, err
	}
	if err != nil {
		fs.f.walFailed(name, "create", err)
		fs.f.parkIfRotating()
		return nil, err
	}
	// A new WAL in a directory that was replaced would take the next batches: the store
	// fails before any is acknowledged (dirWatch).
	fs.f.checkDir()
	return &walFile{File: file, f: fs.f, name: name}, nil
}

// walError is a failed operation on a WAL file.
type walError struct {
	File string // the WAL file's name
	Op   string // "write", "sync", "create", "close"
	Err  error
}

func (e *walError) Error() string { return fmt.Sprintf("WAL %s %s: %v", e.File, e.Op, e.Err) }
func (e *walError) Unwrap() error { return e.Err }

func (f *failures) walFailed(name, op string, err error) {
	name = name[strings.LastIndexAny(name, `/\`)+1:]
	f.fail(&walError{File: name, Op: op, Err: err})
}

// parkIfRotating parks the calling goroutine if it is our writer inside a commit, or one of
// our other calls that can rotate the WAL (a flush, a compaction that flushes, a commit
// outside the writer: failures.call): Pebble is rotating the WAL there and panics fatally
// once this returns (see walFS). The only other goroutine that closes a WAL file is
// DB.Close's, and Close calls it only once the writer and every call have returned.
func (f *failures) parkIfRotating() {
	if f.commitSince.Load() == 0 && f.calls.Load() == 0 {
		return
	}
	f.parked.Store(true)
	f.log.Error("a goroutine rotating Pebble's WAL is parked for good: Pebble cannot rotate its WAL after a failed WAL write; restart the process to reopen the store",
		"component", "pebblelog", "dir", f.dir)
	select {}
}

type walFile struct {
	vfs.File
	f      *failures
	name   string
	failed atomic.Bool
}

func (w *walFile) check(op string, err error) error {
	if err != nil {
		w.failed.Store(true)
		w.f.walFailed(w.name, op, err)
	}
	return err
}

func (w *walFile) Write(p []byte) (int, error) {
	n, err := w.File.Write(p)
	return n, w.check("write", err)
}

func (w *walFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := w.File.WriteAt(p, off)
	return n, w.check("write", err)
}

func (w *walFile) Sync() error     { return w.check("sync", w.File.Sync()) }
func (w *walFile) SyncData() error { return w.check("sync", w.File.SyncData()) }

func (w *walFile) SyncTo(length int64) (bool, error) {
	full, err := w.File.SyncTo(length)
	return full, w.check("sync", err)
}

func (w *walFile) Close() error {
	err := w.check("close", w.File.Close())
	if w.failed.Load() {
		w.f.parkIfRotating()
	}
	return err
}
