// PLUG-IN POINT of the durable backend (see backends_test.go): work.Open, on the filesystem
// the store gives it (a vfs.NewCrashableMem, so that CrashOp can clone exactly what was
// synced). To run without the durable backend, remove this file: the durable tests then skip.

package proptest

import (
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/work"
)

func init() {
	openDurable = func(dir string, fs vfs.FS) (*work.Queue, error) {
		return work.Open(dir, &work.Options{FS: fs})
	}
}
