package pebblelog

import (
	"bytes"
	"strings"
	"testing"

	"github.com/worklog/worklog/projection"
)

// TestEveryIndexHasAKeyspace guards the Pebble rows of "Adding an index"
// (docs/architecture.md): pebbleIndexes is an array keyed by projection.Index, so a
// forgotten row compiles as prefix 0. Each index needs its own prefix, in
// projectionPrefixes (Verify rebuilds and compares it) and named by describeKey.
func TestEveryIndexHasAKeyspace(t *testing.T) {
	seen := map[byte]projection.Index{}
	for ix := range projection.NumIndexes {
		row := pebbleIndexes[ix]
		if row.prefix == 0 || row.what == "" {
			t.Fatalf("index %d (%s) has no row in pebbleIndexes", ix, projection.Indexes[ix].Name)
		}
		if other, dup := seen[row.prefix]; dup {
			t.Fatalf("indexes %d and %d share the prefix %q", other, ix, row.prefix)
		}
		seen[row.prefix] = ix
		if !bytes.Contains(projectionPrefixes, []byte{row.prefix}) {
			t.Errorf("the %s's prefix %q is not in projectionPrefixes: Verify would not compare it", row.what, row.prefix)
		}
		k := indexEntryKey(ix, "part", projection.IndexEntry{Pri: 3, At: 5, Seq: 7, ID: "id"})
		if d := describeKey(k); strings.HasPrefix(d, "key ") {
			t.Errorf("describeKey does not name the %s's keys: %s", row.what, d)
		}
	}
}
