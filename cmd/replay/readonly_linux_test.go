package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// replay reads a store on a read-only mount (a backup, a snapshot) and creates nothing in it.
// Before, creating the lock file failed and replay said the store was "open in a running
// process". The mount is a read-only bind mount of a copy of the demo store; the test skips
// where mounting is not permitted.
func TestReadOnlyMount(t *testing.T) {
	t.Parallel()
	for _, lockFiles := range []bool{true, false} { // with them, replay takes shared locks
		t.Run(fmt.Sprintf("lockfiles=%v", lockFiles), func(t *testing.T) { readOnlyMount(t, lockFiles) })
	}
}

func readOnlyMount(t *testing.T, lockFiles bool) {
	src := demoStore(t)
	for _, f := range []string{"WORKLOG.lock", "LOCK"} { // a backup need not have them
		if lockFiles {
			err := os.WriteFile(filepath.Join(src, f), nil, 0o644)
			if err != nil {
				t.Fatal(err)
			}
		} else if err := os.Remove(filepath.Join(src, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(src, mnt, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount (%v): needs mount privileges", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})
	if err := syscall.Mount("", mnt, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot remount read-only (%v)", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "probe"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("writing into the read-only mount: %v, want EROFS", err)
	}
	before := dirNames(t, src)
	for _, args := range [][]string{{"verify"}, {"log"}, {"stats"}, {"state"}} {
		r := replay(t, append([]string{args[0], mnt}, args[1:]...)...)
		if r.code != 0 {
			t.Errorf("replay %s on a read-only mount: exit %d\n%s", args[0], r.code, r.stderr)
		}
		if strings.Contains(r.stderr, "running process") {
			t.Errorf("replay %s calls a read-only store locked:\n%s", args[0], r.stderr)
		}
	}
	if after := dirNames(t, src); !slices.Equal(before, after) {
		t.Errorf("replay changed the store:\nbefore %q\nafter  %q", before, after)
	}
}
