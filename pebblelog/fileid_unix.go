//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd || solaris

package pebblelog

import (
	"os"
	"syscall"
)

// idOf returns a file's identity, its device and inode, from its FileInfo; false where the
// FS gives none (an in-memory FS).
func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st == nil {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}, true
}
