package pebblelog

import (
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// dirHandle is the store's directory held open, so that the syncer can tell at the cost of
// one fstat that it was removed: on Linux an rmdir sets the directory's link count to 0, and
// an open handle still sees its inode (dirWatch).
type dirHandle struct {
	f  vfs.File
	fd int
	st syscall.Stat_t // the syncer's alone: no allocation per check
}

// openDirHandle opens dir; nil where the FS has no file descriptors (an in-memory FS) or the
// open fails (the periodic check then stands alone).
func openDirHandle(fs vfs.FS, dir string) *dirHandle {
	f, err := fs.OpenDir(dir)
	if err != nil {
		return nil
	}
	fd := f.Fd()
	if fd == vfs.InvalidFd {
		f.Close()
		return nil
	}
	return &dirHandle{f: f, fd: int(fd)}
}

// removed reports whether the directory was removed: its link count is 0. An fstat that
// fails says nothing (false): the periodic check covers it.
func (h *dirHandle) removed() bool {
	if h == nil {
		return false
	}
	return syscall.Fstat(h.fd, &h.st) == nil && h.st.Nlink == 0
}

func (h *dirHandle) close() {
	if h != nil {
		h.f.Close()
	}
}
