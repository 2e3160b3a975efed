//go:build !linux

package pebblelog

import "github.com/cockroachdb/pebble/v2/vfs"

// dirHandle: outside Linux the link count of a removed directory is not relied on, and the
// periodic check (dirCheckInterval) stands alone.
type dirHandle struct{}

func openDirHandle(vfs.FS, string) *dirHandle { return nil }
func (*dirHandle) removed() bool              { return false }
func (*dirHandle) close()                     {}
