package projection_test

import (
	"math/rand/v2"
	"testing"

	"github.com/worklog/worklog/internal/indextest"
	"github.com/worklog/worklog/projection"
)

// TestScanIndexRange: a scan reads the entries with At in [from, to], in an index with
// priorities (each priority's run from its first entry at or after from) and in one without
// (the lease index), and nothing of another partition.
func TestScanIndexRange(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	m := projection.NewMem()
	for _, ix := range []projection.Index{projection.IndexKindDue, projection.IndexKindLeases} {
		es := indextest.Entries(r, 60, projection.Indexes[ix].Priority)
		var a []projection.IndexEntry
		for i, e := range es {
			part := "b"
			if i%2 == 0 {
				part, a = "a", append(a, e)
			}
			if err := m.PutIndex(ix, part, e); err != nil {
				t.Fatal(err)
			}
		}
		indextest.Check(t, ix.Describe("a"), func(from, to int64, fn func(projection.IndexEntry) bool) error {
			return m.ScanIndex(ix, "a", from, to, fn)
		}, a)
	}
}
