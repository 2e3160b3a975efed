package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A damaged store is reported as such, in one line naming the file at fault, from the typed
// open error (no message text cut apart), and replay changes nothing in it.
func TestDamagedStore(t *testing.T) {
	t.Parallel()
	manifests, err := filepath.Glob(filepath.Join(demoStore(t), "MANIFEST-*"))
	if err != nil || len(manifests) != 1 {
		t.Fatalf("MANIFEST files of the demo store: %v, %v", manifests, err)
	}
	manifest := filepath.Base(manifests[0])
	for _, c := range []struct {
		name   string
		damage func(dir string) error
		want   []string
	}{
		{"MANIFEST deleted", func(dir string) error { return os.Remove(filepath.Join(dir, manifest)) },
			[]string{"is a damaged worklog store: " + manifest + ": ", "is missing", "restore"}},
		{"MANIFEST truncated", func(dir string) error { return os.Truncate(filepath.Join(dir, manifest), 0) },
			[]string{"is a damaged worklog store: " + manifest + ": ", "restore"}},
		{"marker alone", func(dir string) error {
			names, _ := os.ReadDir(dir)
			for _, n := range names {
				if n.Name() != "WORKLOG" {
					if err := os.Remove(filepath.Join(dir, n.Name())); err != nil {
						return err
					}
				}
			}
			return nil
		}, []string{"is a damaged worklog store: ", "holds no database", "can be deleted"}},
	} {
		dir := demoStore(t)
		if err := c.damage(dir); err != nil {
			t.Fatal(err)
		}
		before := dirNames(t, dir)
		r := replay(t, "verify", dir)
		if r.code != 2 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%s: exit %d, want 2 and one line:\n%s", c.name, r.code, r.stderr)
		}
		for _, w := range append(c.want, dir) {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: the message lacks %q:\n%s", c.name, w, r.stderr)
			}
		}
		if strings.Contains(r.stderr, "pebblelog:") {
			t.Errorf("%s: the message shows the raw error:\n%s", c.name, r.stderr)
		}
		// Only the lock files may be new (or touched: taking a lock truncates its file).
		after := dirNames(t, dir)
		for _, n := range before {
			if !slices.Contains(after, n) && !strings.HasPrefix(n, "LOCK ") && !strings.HasPrefix(n, "WORKLOG.lock ") {
				t.Errorf("%s: replay changed %s", c.name, n)
			}
		}
	}
}

// dirNames lists dir: each file with its size and modification time.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %d %s", e.Name(), info.Size(), info.ModTime()))
	}
	return out
}
