package pebblelog

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/worklog/worklog/internal/indextest"
	"github.com/worklog/worklog/projection"
)

// TestScanIndexRange: a scan reads the entries with At in [from, to], through a view and
// through the writer (whose scans of an index with low-water marks start at the mark, except
// from a lower bound), in an index with priorities and in the lease index; and the lease
// index's keys are format 7's (L<uvarint len><kind><at><seq>).
func TestScanIndexRange(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	ctx := t.Context()
	r := rand.New(rand.NewPCG(5, 6))
	parts := map[projection.Index][]projection.IndexEntry{}
	if err := s.Update(ctx, func(tx *Txn) error {
		for _, ix := range []projection.Index{projection.IndexDue, projection.IndexKindDue, projection.IndexKindLeases} {
			for i, e := range indextest.Entries(r, 60, projection.Indexes[ix].Priority) {
				part := "b"
				if i%2 == 0 || projection.Indexes[ix].Part == "" {
					part, parts[ix] = "a", append(parts[ix], e)
				}
				if projection.Indexes[ix].Part == "" {
					part = ""
				}
				if err := tx.w.PutIndex(ix, part, e); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for ix, es := range parts {
		part := "a"
		if projection.Indexes[ix].Part == "" {
			part = ""
		}
		scan := func(r projection.Reader) func(from, to int64, fn func(projection.IndexEntry) bool) error {
			return func(from, to int64, fn func(projection.IndexEntry) bool) error {
				return r.ScanIndex(ix, part, from, to, fn)
			}
		}
		if err := s.View(ctx, func(r projection.Reader) error {
			indextest.Check(t, "view: "+ix.Describe(part), scan(r), es)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(ctx, func(tx *Txn) error {
			indextest.Check(t, "writer: "+ix.Describe(part), scan(tx.Reader()), es)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	e := projection.IndexEntry{At: 7, Seq: 9, ID: "t"}
	want := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte("L\x01k"), 7^(1<<63)), 9)
	if got := indexEntryKey(projection.IndexKindLeases, "k", e); !bytes.Equal(got, want) {
		t.Errorf("lease key %q, want %q", got, want)
	}
}
