package archive

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden archives under testdata/golden")

// goldenHistory is what the golden archives hold: two commits whose seqs interleave, one
// sequence archived twice, in two segments.
func writeGolden(t *testing.T, dir string, nocomp bool) {
	o := &WriterOptions{NoCompression: nocomp}
	w, err := OpenWriter(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, 1, 2, 3, 7, 8)
	commit(t, w, 4, 5, 6)
	w.Close()
	w, err = OpenWriter(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, w, 8, 9, 10)
	w.Close()
	os.Remove(filepath.Join(dir, lockName))
}

// The golden archives are read by every later build: format version 1 stays readable.
// The uncompressed one is also written byte for byte the same (zstd's output may change
// with the library's version, so only its reading is fixed).
func TestGolden(t *testing.T) {
	for _, c := range []struct {
		name   string
		nocomp bool
	}{{"plain", true}, {"zstd", false}} {
		t.Run(c.name, func(t *testing.T) {
			golden := filepath.Join("testdata", "golden", c.name)
			if *update {
				os.RemoveAll(golden)
				if err := os.MkdirAll(golden, 0o755); err != nil {
					t.Fatal(err)
				}
				writeGolden(t, golden, c.nocomp)
			}
			r, err := Open(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, r, 0, 0); fmt.Sprint(got) != fmt.Sprint(seqs(1, 10)) {
				t.Fatalf("golden %s reads %v", c.name, got)
			}
			if len(r.Segments()) != 2 || r.Events() != 10 {
				t.Fatalf("golden %s: %+v", c.name, r.Segments())
			}
			if !c.nocomp {
				return
			}
			dir := t.TempDir()
			writeGolden(t, dir, c.nocomp)
			for _, name := range []string{"seg-000001.wla", "seg-000002.wla"} {
				got, _ := os.ReadFile(filepath.Join(dir, name))
				want, err := os.ReadFile(filepath.Join(golden, name))
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s is written differently from its golden copy (%v)", name, err)
				}
			}
		})
	}
}
