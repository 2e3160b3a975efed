//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd || solaris)

package pebblelog

import "os"

// idOf: no device and inode here; the directory watch checks only that the files exist.
func idOf(os.FileInfo) (fileID, bool) { return fileID{}, false }
