package proptest

import (
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/work"
)

// A backend makes fresh, empty queues for histories. The same ops run on every backend; only
// restartable backends get Reopen and Crash ops.
type backendSpec struct {
	name        string
	restartable bool
	inbox       bool // takes submissions committed in the application's transaction (SubmitTxOp)
	open        func() (store, error)
}

// store is one queue of a backend, which a history may restart.
type store interface {
	queue() *work.Queue
	// reopen closes the queue and opens the same directory again.
	reopen() error
	// crash opens a clone of the filesystem holding exactly what was synced, without closing
	// the queue first (it is closed afterwards, on the original filesystem, only to free it).
	crash() error
	close()
}

var memoryBackend = backendSpec{
	name: "memory",
	open: func() (store, error) { return &memStore{q: work.NewInMemory()}, nil },
}

type memStore struct{ q *work.Queue }

func (s *memStore) queue() *work.Queue { return s.q }

// An in-memory queue has nothing to restart. Restart ops only reach it in a differential
// pair with a durable backend, where the durable side restarts and this side stays put.
func (s *memStore) reopen() error { return nil }
func (s *memStore) crash() error  { return nil }
func (s *memStore) close()        { _ = s.q.Close() }

// =====================================================================================
// PLUG-IN POINT for the durable backend (work.Open).
//
// openDurable opens a durable queue in dir on fs. durable_open_test.go sets it to
//
//	func(dir string, fs vfs.FS) (*work.Queue, error) { return work.Open(dir, &work.Options{FS: fs}) }
//
// Without that file it stays nil and the durable property test, the memory-vs-durable
// differential test and the durable regression replays skip. Another durable backend (other
// Options, a real directory) plugs in the same way: a func that opens dir on fs.
// =====================================================================================
var openDurable func(dir string, fs vfs.FS) (*work.Queue, error)

const durableDir = "/worklog"

// durableBackend returns the durable backend, or false while work.Open is not plugged in.
func durableBackend() (backendSpec, bool) {
	if openDurable == nil {
		return backendSpec{}, false
	}
	return backendSpec{
		name:        "durable",
		restartable: true,
		open: func() (store, error) {
			fs := vfs.NewCrashableMem()
			q, err := openDurable(durableDir, fs)
			if err != nil {
				return nil, err
			}
			return &durableStore{fs: fs, q: q}, nil
		},
	}, true
}

type durableStore struct {
	fs *vfs.MemFS
	q  *work.Queue
}

func (s *durableStore) queue() *work.Queue { return s.q }

func (s *durableStore) reopen() error {
	if err := s.q.Close(); err != nil {
		return err
	}
	q, err := openDurable(durableDir, s.fs)
	if err != nil {
		return err
	}
	s.q = q
	return nil
}

func (s *durableStore) crash() error {
	clone := s.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	_ = s.q.Close() // after the clone: nothing it writes reaches the clone
	q, err := openDurable(durableDir, clone)
	if err != nil {
		return err
	}
	s.fs, s.q = clone, q
	return nil
}

func (s *durableStore) close() { _ = s.q.Close() }
