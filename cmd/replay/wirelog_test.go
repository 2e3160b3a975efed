package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
)

// pgtestSchemaOrEmpty is a new schema's URL on the tests' PostgreSQL server, or "" without
// one: the tests that use it check the Pebble side in any case.
func pgtestSchemaOrEmpty(t *testing.T) string {
	if s, _ := pgtest.Current(); s == nil {
		return ""
	}
	return pgtest.Schema(t)
}

// wireEvent is the stored bytes of a task_submitted event at seq.
func wireEvent(t *testing.T, seq uint64) []byte {
	t.Helper()
	b, err := events.Append(nil, &events.TaskSubmitted{Header: events.Header{Seq: seq, SessionID: "s", At: int64(seq) * 1e9},
		TaskID: "task_x", Kind: "k", Input: []byte(`1`)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeWire writes a wire log of the events at seqs with the pruned ranges, ending at head.
func writeWire(t *testing.T, seqs []uint64, pruned projection.SeqRanges, head uint64) ([]byte, error) {
	t.Helper()
	var buf bytes.Buffer
	ww, err := newWireWriter(&buf, pruned)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range seqs {
		if err := ww.event(s, wireEvent(t, s)); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), ww.finish(head)
}

// readWire reads a wire log whole: the events' seqs and the pruned ranges, in file order.
func readWire(b []byte) (seqs []uint64, pruned []projection.SeqRange, err error) {
	wr, err := newWireReader(bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	for {
		rec, err := wr.read()
		if errors.Is(err, io.EOF) {
			return seqs, pruned, nil
		}
		if err != nil {
			return seqs, pruned, err
		}
		if rec.ev != nil {
			seqs = append(seqs, rec.ev.Head().Seq)
		} else {
			pruned = append(pruned, rec.pruned)
		}
	}
}

// A log with pruned ranges (at the start, between events, at the end) is written as version
// 2 with each range in its place and reads back the same; a log without is version 1, as
// before. The writer refuses a gap that no range declares and a range that holds an event.
func TestWireLogPruned(t *testing.T) {
	pruned := projection.SeqRanges{{From: 1, To: 2}, {From: 4, To: 6}, {From: 8, To: 9}}
	var buf bytes.Buffer
	ww, err := newWireWriter(&buf, pruned)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []uint64{3, 7} {
		if err := ww.event(s, wireEvent(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ww.finish(9); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if !bytes.HasPrefix(b, []byte(wireMagic2)) {
		t.Fatalf("a pruned log starts with %q", b[:len(wireMagic2)])
	}
	seqs, got, err := readWire(b)
	if err != nil || !reflect.DeepEqual(seqs, []uint64{3, 7}) || !reflect.DeepEqual(projection.SeqRanges(got), pruned) {
		t.Errorf("read back: events %v, ranges %v, %v", seqs, got, err)
	}
	// Truncated anywhere, it is refused as truncated.
	for n := len(wireMagic2); n < len(b); n++ {
		if _, _, err := readWire(b[:n]); !errors.Is(err, errWireFormat) {
			t.Fatalf("cut at byte %d of %d: %v", n, len(b), err)
		}
	}

	// A range that does not begin where it belongs, or whose end is past any sequence.
	for _, r := range [][2]uint64{{2, 3}, {1, math.MaxUint64}, {3, 2}} {
		f := []byte(wireMagic2)
		for _, x := range []uint64{0, wireTagPruned, r[0], r[1], 0, wireTagEnd, r[1]} {
			f = binary.AppendUvarint(f, x)
		}
		if _, _, err := readWire(f); !errors.Is(err, errWireFormat) || !strings.Contains(err.Error(), "where seq 1 belongs") {
			t.Errorf("a pruned range %d..%d at the start: %v", r[0], r[1], err)
		}
	}

	var plain bytes.Buffer
	ww, _ = newWireWriter(&plain, nil)
	if err := errors.Join(ww.event(1, wireEvent(t, 1)), ww.finish(1)); err != nil || !bytes.HasPrefix(plain.Bytes(), []byte(wireMagic)) {
		t.Errorf("a log without pruned ranges: %v, %q", err, plain.Bytes()[:len(wireMagic)])
	}

	for _, c := range []struct {
		name   string
		seqs   []uint64
		pruned projection.SeqRanges
		head   uint64
		is     error
		want   string
	}{
		{"an undeclared gap", []uint64{1, 3}, nil, 3, errUndeclaredGap, "seq 3 after 1"},
		{"a gap a range fills in part", []uint64{1, 4}, projection.SeqRanges{{From: 2, To: 2}}, 4, errUndeclaredGap, "seq 4 after 1"},
		{"an undeclared tail", []uint64{1}, nil, 3, errUndeclaredGap, "ends at seq 1, before its last sequence 3"},
		{"an event in a range", []uint64{1, 2}, projection.SeqRanges{{From: 2, To: 3}}, 3, events.ErrCorrupt, "event seq 2 lies in the pruned range 2..3"},
		{"a range past the head", []uint64{1}, projection.SeqRanges{{From: 2, To: 3}}, 1, events.ErrCorrupt, "pruned range 2..3 is not a gap"},
	} {
		if _, err := writeWire(t, c.seqs, c.pruned, c.head); !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %v naming %q", c.name, err, c.is, c.want)
		}
	}
}

// wireRecords splits a wire log into its magic line and its records (an event's or a tagged
// one's bytes each), for tests that damage a file record by record.
func wireRecords(t *testing.T, b []byte) (magic string, recs [][]byte) {
	t.Helper()
	magic, b = string(b[:len(wireMagic)]), b[len(wireMagic):]
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if n > 0 {
			recs, b = append(recs, b[:k+int(n)]), b[k+int(n):]
			continue
		}
		// A tagged record (version 2: a tag, then 2 numbers for a range, 1 for the end) or
		// version 1's end (one number).
		end, nums := k, 1
		if magic == wireMagic2 {
			tag, m := binary.Uvarint(b[end:])
			end += m
			if tag == wireTagPruned {
				nums = 2
			}
		}
		for range nums {
			_, m := binary.Uvarint(b[end:])
			end += m
		}
		recs, b = append(recs, b[:end]), b[end:]
	}
	return magic, recs
}

// TestImportUndeclaredGap: a wire log with an event left out (a version 1 file), or with a
// pruned range's record left out (version 2), is refused by import into either backend,
// naming the missing sequence, and nothing is appended.
func TestImportUndeclaredGap(t *testing.T) {
	t.Parallel()
	dsn := pgtestSchemaOrEmpty(t)
	v1, err := os.ReadFile(filepath.Join("testdata", "demo-v1.wlog"))
	if err != nil {
		t.Fatal(err)
	}
	magic, recs := wireRecords(t, v1)
	if magic != wireMagic || len(recs) != 48 {
		t.Fatalf("the demo's wire log: %q, %d records", magic, len(recs))
	}
	noFive := []byte(magic + string(bytes.Join(append(append([][]byte{}, recs[:4]...), recs[5:]...), nil)))

	pruned := []byte(wireMagic2)
	var b2 bytes.Buffer
	w2, _ := newWireWriter(&b2, projection.SeqRanges{{From: 2, To: 3}})
	if err := errors.Join(w2.event(1, wireEvent(t, 1)), w2.event(4, wireEvent(t, 4)), w2.finish(4)); err != nil {
		t.Fatal(err)
	}
	m2, recs2 := wireRecords(t, b2.Bytes())
	if m2 != wireMagic2 || len(recs2) != 4 {
		t.Fatalf("version 2: %q, %d records", m2, len(recs2))
	}
	pruned = append(pruned, bytes.Join([][]byte{recs2[0], recs2[2], recs2[3]}, nil)...) // without the range

	for _, c := range []struct {
		name string
		file []byte
		want string
	}{
		{"version 1 without event 5", noFive, "seq 5 is missing (the next event is seq 6)"},
		{"version 2 without its pruned range", pruned, "seq 2 is missing (the next event is seq 4)"},
	} {
		f := writeFile(t, "gap.wlog", c.file)
		dests := []string{filepath.Join(t.TempDir(), "new")}
		if dsn != "" {
			dests = append(dests, dsn)
		}
		for _, dest := range dests {
			r := replay(t, "import", f, dest)
			if r.code != exitError || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "no pruned range declares") {
				t.Errorf("%s into %s: exit %d, stderr %q; want exit 2 naming %q", c.name, dest, r.code, r.stderr, c.want)
			}
			if out := mustReplay(t, "verify", dest); !strings.Contains(out, "The log is empty") {
				t.Errorf("%s: the refused import left %s holding events:\n%s", c.name, dest, out)
			}
		}
	}
}

// TestImportOldExport: a wire log written before version 2 (testdata/demo-v1.wlog, the demo
// exported by the build before pruned ranges were carried) still imports into either
// backend, verifies, and the store exports it again byte for byte (a store with nothing
// pruned is still exported as version 1, and its claims, which carry no worker, are
// re-encoded as claim schema version 1).
func TestImportOldExport(t *testing.T) {
	t.Parallel()
	file := filepath.Join("testdata", "demo-v1.wlog")
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dests := []string{filepath.Join(t.TempDir(), "old")}
	if dsn := pgtestSchemaOrEmpty(t); dsn != "" {
		dests = append(dests, dsn)
	}
	for _, dest := range dests {
		if out := mustReplay(t, "import", file, dest); !strings.Contains(out, "ok. 47 events (seq 1..47) appended and folded") {
			t.Errorf("import of the old export into %s says:\n%s", dest, out)
		}
		if again := exportWire(t, dest); !bytes.Equal(again, old) {
			t.Errorf("%s exports %d bytes, not the %d of the old export", dest, len(again), len(old))
		}
	}
	// Today's demo names its workers (claim events of schema version 2), so its export is no
	// longer the old one; a store with nothing pruned is still exported as wire version 1.
	if again := exportWire(t, demoStore(t)); !bytes.HasPrefix(again, []byte(wireMagic)) {
		t.Errorf("the demo store's export starts with %q, want wire version 1", again[:min(len(again), 20)])
	}
}

// pruneFirst is a real PostgreSQL queue's store whose RawLog lets a prune commit first, as a
// running queue's processes may between export's read of the pruned ranges and of the log.
type pruneFirst struct {
	*postgres.Store
	prune func()
}

func (p pruneFirst) RawLog(ctx context.Context, from, to uint64, fn func(uint64, []byte) error) error {
	p.prune()
	return p.Store.RawLog(ctx, from, to, fn)
}

// TestExportWhilePruned: export --wire of a queue pruned while it reads is refused as that
// (export again with the processes stopped), not reported as a damaged log.
func TestExportWhilePruned(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	dsn := postgresDemo(t)
	st, err := openPostgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	s := pruneFirst{Store: st.(*postgres.Store), prune: func() {
		q, err := postgres.Open(ctx, dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		if r, err := q.Prune(ctx, time.Date(2026, 3, 2, 9, 5, 0, 0, time.UTC)); err != nil || r.Events == 0 {
			t.Fatalf("prune: %+v, %v", r, err)
		}
	}}
	var out bytes.Buffer
	a := &app{out: bufio.NewWriter(&out), stdout: &out, stderr: io.Discard}
	err = a.writeWire(ctx, s, "the queue")
	if err == nil || !strings.Contains(err.Error(), "the queue was pruned while export read it") || strings.Contains(err.Error(), "corrupt") {
		t.Errorf("export of a queue pruned meanwhile: %v", err)
	}
}
