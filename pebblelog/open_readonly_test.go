package pebblelog

import (
	"bufio"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// unwritableFS is the OS filesystem as a process sees a directory it cannot write: a
// read-only mount (EROFS) or another user's store (EACCES). Tests run as root, whom
// permission bits do not stop, so the refusal is made here. It records every write it
// refused.
type unwritableFS struct {
	vfs.FS
	errno syscall.Errno
	mu    sync.Mutex
	tried []string
}

func (fs *unwritableFS) refuse(op, name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.tried = append(fs.tried, op+" "+filepath.Base(name))
	return &os.PathError{Op: op, Path: name, Err: fs.errno}
}

func (fs *unwritableFS) Create(name string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, fs.refuse("create", name)
}
func (fs *unwritableFS) Link(_, newname string) error { return fs.refuse("link", newname) }
func (fs *unwritableFS) OpenReadWrite(name string, _ vfs.DiskWriteCategory, _ ...vfs.OpenOption) (vfs.File, error) {
	return nil, fs.refuse("openrw", name)
}
func (fs *unwritableFS) Remove(name string) error    { return fs.refuse("remove", name) }
func (fs *unwritableFS) RemoveAll(name string) error { return fs.refuse("removeall", name) }
func (fs *unwritableFS) Rename(_, newname string) error {
	return fs.refuse("rename", newname)
}
func (fs *unwritableFS) ReuseForWrite(_, newname string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, fs.refuse("reuse", newname)
}
func (fs *unwritableFS) MkdirAll(dir string, _ os.FileMode) error { return fs.refuse("mkdir", dir) }
func (fs *unwritableFS) Lock(name string) (io.Closer, error)      { return nil, fs.refuse("lock", name) }

func (fs *unwritableFS) writes() []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Clone(fs.tried)
}

// A store replay can read but not write (a read-only mount, a backup, another user's store)
// opens read-only without taking the locks, and nothing in it is created or changed. Before,
// creating WORKLOG.lock failed and Open reported the store as locked by a running process.
// Opened read-write, it is ErrReadOnlyStore, not ErrLocked.
func TestOpenReadOnlyUnwritableDirectory(t *testing.T) {
	src := t.TempDir()
	s := openT(t, src, nil)
	seedStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, errno := range []syscall.Errno{syscall.EROFS, syscall.EACCES} {
		for _, withLockFiles := range []bool{true, false} { // a backup may lack them
			dir := filepath.Join(t.TempDir(), "store")
			copyDir(t, src, dir)
			if !withLockFiles {
				os.Remove(filepath.Join(dir, lockFile))
				os.Remove(filepath.Join(dir, "LOCK"))
			}
			before := fileHashes(t, dir)
			fs := &unwritableFS{FS: vfs.Default, errno: errno}

			_, err := Open(dir, &Options{FS: fs})
			oe := wantOpenErr(t, err, ErrReadOnlyStore, dir)
			if !errors.Is(err, errno) {
				t.Errorf("%v: the error does not wrap %v: %v", errno, errno, err)
			}
			if oe.Hint == "" {
				t.Errorf("%v: no hint to open it read-only: %v", errno, err)
			}

			st, err := Open(dir, &Options{FS: fs, ReadOnly: true})
			if err != nil {
				t.Fatalf("%v, lock files %v: read-only Open = %v", errno, withLockFiles, err)
			}
			if got := len(readAll(t, st)); got != 6 {
				t.Errorf("%v: %d events, want 6", errno, got)
			}
			mustVerify(t, st)
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			// Only the lock attempts that told Open the directory is not writable.
			for _, w := range fs.writes() {
				if w != "lock "+lockFile {
					t.Errorf("%v: Open tried to write: %s (all: %q)", errno, w, fs.writes())
				}
			}
			if after := fileHashes(t, dir); !maps.Equal(before, after) {
				t.Errorf("%v: the store changed:\nbefore %v\nafter  %v", errno, before, after)
			}
		}
	}
}

// startHolder runs TestHelperHoldStore on dir in another process and returns its first line
// ("ready", or "error ..." when its Open failed) and a function that ends it.
func startHolder(t *testing.T, dir string) (string, func()) {
	line, _, stop := startHolderCmd(t, dir)
	return line, stop
}

// startHolderCmd is startHolder that also returns the process, for a test that kills it.
// stop may still be called after the test waited for the process itself.
func startHolderCmd(t *testing.T, dir string) (string, *exec.Cmd, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldStore$", "-test.count=1")
	cmd.Env = append(os.Environ(), holdStoreEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		stdin.Close() // the holder exits when its stdin closes
		cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		t.Fatalf("holder process: %v", err)
	}
	return strings.TrimSpace(line), cmd, stop
}

// On a directory it cannot write, a read-only Open still keeps out of a writer's way: it
// takes shared locks on the existing lock files, opened read-only. A store another process
// holds (another user's running service) is ErrLocked; while the reader holds it, a writer
// cannot open it.
func TestOpenReadOnlyUnwritableSharedLock(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	seedStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fs := &unwritableFS{FS: vfs.Default, errno: syscall.EACCES}

	line, stop := startHolder(t, dir)
	if line != "ready" {
		stop()
		t.Fatalf("holder: %s", line)
	}
	_, err := Open(dir, &Options{FS: fs, ReadOnly: true})
	stop()
	wantLocked(t, err, dir)

	r, err := Open(dir, &Options{FS: fs, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open once the holder is gone: %v", err)
	}
	line, stop = startHolder(t, dir)
	stop()
	if !strings.HasPrefix(line, "error ") || !strings.Contains(line, ErrLocked.Error()) {
		t.Errorf("a writer opened the store while a read-only reader held it: %s", line)
	}
	if got := len(readAll(t, r)); got != 6 {
		t.Errorf("%d events, want 6", got)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// Released: a writer opens it again.
	line, stop = startHolder(t, dir)
	stop()
	if line != "ready" {
		t.Errorf("writer after the reader closed: %s", line)
	}
}
