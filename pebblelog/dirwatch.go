package pebblelog

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// dirCheckInterval bounds how old the last check of the store's directory may be when a
// batch is acknowledged (see dirWatch).
const dirCheckInterval = 100 * time.Millisecond

// fileID is a file's identity: its device and inode.
type fileID struct{ dev, ino uint64 }

// dirWatch notices that a running store's directory, or its WORKLOG.lock, was removed or
// replaced (issue 27.5: after rm -rf of the store under load, Pebble's open files kept taking
// writes and fsyncs, so batches were acknowledged into unlinked files, and Close returned
// nil). The store fails with a *dirGoneError, in the ErrStoreFailed family, as soon as
// either no longer is the file opened: gone, or another file by that name (a directory
// re-created in its place, compared by device and inode where the FS has them).
//
// On Linux the syncer also checks, before it answers each group (after its fsync), that the
// directory it holds open still has links (one fstat per group, not per command: a removed
// directory has none): no call that began after the directory was removed is acknowledged.
// The other checks are two stats: the syncer makes them before it answers a batch whenever
// the last good check started more than dirCheckInterval ago, so no batch is acknowledged
// more than dirCheckInterval after the directory was moved away or replaced (or removed, on
// other platforms); the watchdog's goroutine checks as often, so an idle store fails too,
// and its reads refuse; creating a WAL file (a rotation) and Close check always.
type dirWatch struct {
	fs        vfs.FS
	dir, lock string // the store's directory and its WORKLOG.lock
	dirID     fileID
	lockID    fileID
	ids       bool       // dirID and lockID are known; false: only existence is checked
	h         *dirHandle // the directory held open (Linux); nil: none
}

// newDirWatch records the identity of dir and of its lock file, taken by Open.
func newDirWatch(fs vfs.FS, dir string) (*dirWatch, error) {
	w := &dirWatch{fs: fs, dir: dir, lock: fs.PathJoin(dir, lockFile)}
	di, err := fs.Stat(w.dir)
	if err != nil {
		return nil, err
	}
	li, err := fs.Stat(w.lock)
	if err != nil {
		return nil, err
	}
	var dok, lok bool
	w.dirID, dok = idOf(di)
	w.lockID, lok = idOf(li)
	w.ids = dok && lok
	w.h = openDirHandle(fs, dir)
	return w, nil
}

// dirGoneError: the store's directory or lock file was removed or replaced while the store
// was open. What was written since is in unlinked files (or in files of another directory):
// nothing of it can be assumed durable.
type dirGoneError struct {
	File string // "": the directory itself; else the file in it (WORKLOG.lock)
	What string // "was removed", "was replaced by another file", "cannot be checked: …"
}

func (e *dirGoneError) Error() string {
	what := "the store's directory"
	if e.File != "" {
		what = e.File
	}
	return fmt.Sprintf("%s %s while the store was open; writes since then may be lost", what, e.What)
}

// check returns a *dirGoneError if the directory or the lock file is not the one opened.
func (w *dirWatch) check() error {
	for _, f := range []struct {
		path, name string
		id         fileID
	}{{w.dir, "", w.dirID}, {w.lock, lockFile, w.lockID}} {
		fi, err := w.fs.Stat(f.path)
		switch {
		case oserrNotExist(err):
			return &dirGoneError{File: f.name, What: "was removed"}
		case err != nil:
			return &dirGoneError{File: f.name, What: fmt.Sprintf("cannot be checked: %v", err)}
		}
		if id, ok := idOf(fi); w.ids && (!ok || id != f.id) {
			return &dirGoneError{File: f.name, What: "was replaced by another file"}
		}
	}
	return nil
}

// checkDir checks the store's directory now, fails the store if it is gone, and returns the
// check's own error (nil on a store without a watch: read-only).
func (f *failures) checkDir() error {
	w := f.dirs.Load()
	if w == nil {
		return nil
	}
	start := f.now()
	if err := w.check(); err != nil {
		f.fail(err)
		return err
	}
	f.dirChecked.Store(start + 1)
	return nil
}

// checkDirLinked fails the store if its directory, held open, was removed (Linux; nothing
// elsewhere): the syncer's check before it answers a group.
func (f *failures) checkDirLinked() {
	if w := f.dirs.Load(); w != nil && w.h.removed() {
		f.fail(&dirGoneError{What: "was removed"})
	}
}

// releaseDir closes the directory's handle, once the syncer has ended.
func (f *failures) releaseDir() {
	if w := f.dirs.Load(); w != nil {
		w.h.close()
	}
}

// checkDirEvery is checkDir unless the last good check started less than dirCheckInterval
// ago: one clock read on the syncer's path per batch, two stats per interval.
func (f *failures) checkDirEvery() {
	if f.dirs.Load() == nil {
		return
	}
	if s := f.dirChecked.Load(); s != 0 && time.Duration(f.now()-(s-1)) < dirCheckInterval {
		return
	}
	f.checkDir()
}

// closeCheck is Close's last check of the directory: nil if it is still the one opened (or
// the store is read-only), else the store's failure, which then names the directory.
func (f *failures) closeCheck() error {
	derr := f.checkDir()
	if derr == nil {
		return nil
	}
	ferr := f.err()
	if d := (*dirGoneError)(nil); errors.As(ferr, &d) {
		return ferr
	}
	return errors.Join(ferr, fmt.Errorf("%w: %s: %w", ErrStoreFailed, f.dir, derr))
}
