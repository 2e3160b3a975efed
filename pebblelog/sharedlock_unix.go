//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd || solaris

package pebblelog

import (
	"io"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// sharedLock takes a shared (read) lock on the lock file name, opened read-only: what a
// read-only Open takes on a directory it cannot write, where creating the file, or opening
// it for writing as an exclusive lock needs, fails. Writers lock the same files exclusively
// with fcntl (vfs.Default.Lock), so a writer holding the store makes this fail (EAGAIN), and
// a writer that starts while it is held fails to lock. A missing lock file means no writer
// of the store has ever run in this directory; a file without a descriptor (an in-memory
// FS) has no inter-process lock to take: both give no lock.
//
// Closing the returned file releases the lock. fcntl locks belong to the process, and
// closing any descriptor of the file drops them: this is only used where this process
// cannot hold the store open for writing either.
func sharedLock(fs vfs.FS, name string) (io.Closer, error) {
	f, err := fs.Open(name)
	if oserrNotExist(err) {
		return noLock{}, nil
	}
	if err != nil {
		return nil, err
	}
	fd := f.Fd()
	if fd == vfs.InvalidFd {
		f.Close()
		return noLock{}, nil
	}
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(fd, unix.F_SETLK, &lk); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
