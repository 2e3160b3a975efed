package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/projection"
)

// The snapshot cache makes time travel deep into a long log cheap. It lives OUTSIDE the
// store, under <cache root>/<store identity>/k<K>/, and is built lazily: whenever `state`
// folds the log past a multiple of K that the cache lacks, it writes a segment there.
//
// Segment i covers the window of events ((i-1)K, iK]: it holds the final version (as of seq
// iK) of every task and wake record that an event of the window wrote. Loading segments 1..j
// in order, a later record replacing an earlier one, gives every record as of seq jK; the
// idempotency keys and eligibility indexes are derived from the records, exactly as the fold
// keeps them. So the state at seq N costs reading the segments up to floor(N/K)*K plus
// folding at most K-1 events, instead of folding N events. The segments together hold about
// one record per (record, window it changed in): the cache grows like the projection, not
// like (number of snapshots) x (state size). docs/replay.md has the cost model.
//
// The identity of a store is a hash of its first event, which holds a random id: a
// checkpoint of a store shares its cache (its log is the same), an unrelated store does not.
// Each segment also carries a fingerprint of the event at its end; a segment whose
// fingerprint does not match the store's event there (a store that diverged from a copy) is
// ignored and rewritten, and a segment that does not decode or fails its checksum is
// ignored. The cache is an optimisation only: deleting it at any time is safe.

const (
	segMagic   = "worklog-replay snapshot segment"
	segVersion = 2
	// defaultSnapshotEvery is K: a snapshot segment every 65,536 events, so time travel
	// folds at most that many events past the nearest snapshot (a fraction of a second).
	defaultSnapshotEvery = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type segHeader struct {
	Magic       string `msgpack:"magic"`
	Version     int    `msgpack:"version"`
	K           uint64 `msgpack:"k"`
	End         uint64 `msgpack:"end"`
	Fingerprint []byte `msgpack:"fingerprint"`
	MaxAt       int64  `msgpack:"max_at"` // the latest event time in the window: for --at
	Tasks       int    `msgpack:"tasks"`
	Wakes       int    `msgpack:"wakes"`
}

type segCache struct {
	dir     string
	k       uint64
	note    string // why the cache was not (fully) used, for --cost
	failed  bool
	warnOut io.Writer
}

// defaultCacheRoot is os.UserCacheDir()/worklog-replay.
func defaultCacheRoot() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "worklog-replay")
}

// storeIdentity is the hex SHA-256 of the store's first event, cut to 128 bits.
//
// On a pruned store it is the first retained event's and the pruned ranges': a segment
// written before a prune holds the subjects the prune removed, and a fold of the retained
// events lacks them, so a prune starts a new cache.
func storeIdentity(ctx context.Context, st store) (string, bool, error) {
	pruned, err := st.PrunedRanges(ctx)
	if err != nil {
		return "", false, err
	}
	raw, ok, err := st.RawEvent(ctx, horizon(pruned))
	if err != nil || !ok {
		return "", false, err
	}
	h := sha256.New()
	h.Write(raw)
	if len(pruned) > 0 {
		fmt.Fprintf(h, "pruned %v", pruned)
	}
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:16]), true, nil
}

// openCache returns the cache of the store in storeDir under root, or nil (with a reason)
// when it cannot be used. It refuses a cache inside the store directory: replay never writes
// into a store.
func openCache(ctx context.Context, st store, storeDir, root string, k uint64, warn io.Writer) (*segCache, string, error) {
	if root == "" {
		return nil, "no cache directory (os.UserCacheDir failed; use --cache-dir)", nil
	}
	id, ok, err := storeIdentity(ctx, st)
	if err != nil {
		return nil, "", err
	}
	if !ok {
		return nil, "empty log", nil
	}
	absRoot, err1 := filepath.Abs(root)
	absStore, err2 := filepath.Abs(storeDir)
	if err := errors.Join(err1, err2); err != nil {
		return nil, "cache path: " + err.Error(), nil
	}
	if inside(absStore, absRoot) {
		return nil, "", fmt.Errorf("--cache-dir %s is inside the store %s: replay never writes into a store", root, storeDir)
	}
	return &segCache{dir: filepath.Join(absRoot, id, fmt.Sprintf("k%d", k)), k: k, warnOut: warn}, "", nil
}

// inside reports whether path is dir or below it (after resolving symlinks where possible).
func inside(dir, path string) bool {
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	// path may not exist yet: resolve its longest existing ancestor.
	p := path
	var rest []string
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = filepath.Join(append([]string{r}, rest...)...)
			break
		}
		parent := filepath.Dir(p)
		if parent == p {
			p = path
			break
		}
		rest = append([]string{filepath.Base(p)}, rest...)
		p = parent
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func (c *segCache) segPath(end uint64) string {
	return filepath.Join(c.dir, fmt.Sprintf("seg-%020d.snap", end))
}

func fingerprint(raw []byte) []byte {
	sum := sha256.Sum256(raw)
	return sum[:16]
}

// readHeader reads only the header of a segment file.
func readHeader(path string) (*segHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var h segHeader
	if err := msgpack.NewDecoder(bufio.NewReaderSize(f, 4096)).Decode(&h); err != nil {
		return nil, err
	}
	return &h, nil
}

// chain returns the headers of the usable segments K, 2K, ... at or before target (and, for a
// time cut, whose events are all at or before the cut's time), stopping at the first missing,
// foreign or stale one.
func (c *segCache) chain(ctx context.Context, st store, target uint64, ct cut) []*segHeader {
	var out []*segHeader
	for end := c.k; end <= target; end += c.k {
		h, err := readHeader(c.segPath(end))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				c.note = fmt.Sprintf("ignored the unreadable snapshot segment at seq %d", end)
			}
			break
		}
		if h.Magic != segMagic || h.Version != segVersion || h.K != c.k || h.End != end {
			c.note = fmt.Sprintf("ignored the foreign snapshot segment at seq %d", end)
			break
		}
		raw, ok, err := st.RawEvent(ctx, end)
		if err != nil || !ok || !bytes.Equal(fingerprint(raw), h.Fingerprint) {
			c.note = fmt.Sprintf("ignored the stale snapshot segment at seq %d (the log differs)", end)
			break
		}
		if ct.ByTime && h.MaxAt > ct.At {
			break
		}
		out = append(out, h)
	}
	return out
}

// load builds the state at the newest usable segment at or before target: the state, its
// sequence (0 when no segment is usable), the segments and the records read. It reads the
// segments newest first and decodes only the newest version of each record: an older one is
// skipped by its id without decoding it.
func (c *segCache) load(ctx context.Context, st store, target uint64, ct cut) (*projection.Mem, uint64, int, int, error) {
	hs := c.chain(ctx, st, target, ct)
	for i, h := range hs {
		if err := c.checkSegment(h.End); err != nil {
			c.note = fmt.Sprintf("ignored the damaged snapshot segment at seq %d (%v)", h.End, err)
			hs = hs[:i]
			break
		}
	}
	if len(hs) == 0 {
		return nil, 0, 0, 0, nil
	}
	tasks := map[string]*projection.Task{}
	wakes := map[string]*projection.Wake{}
	records := 0
	for i := len(hs) - 1; i >= 0; i-- {
		n, err := c.readSegment(hs[i].End, tasks, wakes)
		if err != nil {
			// The checksum held, so this is a bug or a foreign writer: fold from the start.
			c.note = fmt.Sprintf("ignored the snapshot cache: segment at seq %d: %v", hs[i].End, err)
			return nil, 0, 0, 0, nil
		}
		records += n
	}
	seq := hs[len(hs)-1].End
	m, err := memFrom(tasks, wakes, seq)
	return m, seq, len(hs), records, err
}

// checkSegment verifies a segment file's checksum.
func (c *segCache) checkSegment(end uint64) error {
	b, err := os.ReadFile(c.segPath(end))
	if err != nil {
		return err
	}
	if len(b) < 4 || crc32.Checksum(b[:len(b)-4], castagnoli) != binary.BigEndian.Uint32(b[len(b)-4:]) {
		return errors.New("checksum mismatch")
	}
	return nil
}

// readSegment adds the records of one segment that tasks and wakes do not hold yet (they
// hold newer versions) and returns how many records the segment has.
//
// A segment is: the header; the number of tasks, then for each its id and its record as
// bytes, in the store's record format (internal/recordcodec: the bytes a store keeps
// under the task's key); the same for wakes; a CRC-32C of everything before it.
func (c *segCache) readSegment(end uint64, tasks map[string]*projection.Task, wakes map[string]*projection.Wake) (int, error) {
	b, err := os.ReadFile(c.segPath(end))
	if err != nil {
		return 0, err
	}
	if len(b) < 4 {
		return 0, errors.New("too short")
	}
	d := msgpack.NewDecoder(bytes.NewReader(b[:len(b)-4]))
	var h segHeader
	if err := d.Decode(&h); err != nil {
		return 0, err
	}
	if h.End != end {
		return 0, errors.New("header does not match the file name")
	}
	nt, err := readRecords(d, tasks, recordcodec.DecodeTask, func(t *projection.Task) string { return t.ID })
	if err != nil {
		return 0, err
	}
	nw, err := readRecords(d, wakes, recordcodec.DecodeWake, func(w *projection.Wake) string { return w.ID })
	if err != nil {
		return 0, err
	}
	if nt != h.Tasks || nw != h.Wakes {
		return 0, errors.New("header does not match the records")
	}
	return nt + nw, nil
}

// readRecords reads one array of (id, record) pairs; decode is recordcodec's decoder.
func readRecords[T any](d *msgpack.Decoder, into map[string]*T,
	decode func(key, v []byte) (*T, error), idOf func(*T) string) (int, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i++ {
		id, err := d.DecodeString()
		if err != nil {
			return 0, err
		}
		if _, newer := into[id]; newer {
			if err := d.Skip(); err != nil {
				return 0, err
			}
			continue
		}
		raw, err := d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		rec, err := decode([]byte(id), raw)
		if err != nil {
			return 0, err
		}
		if idOf(rec) != id {
			return 0, fmt.Errorf("record %s is filed under %s", idOf(rec), id)
		}
		into[id] = rec
	}
	return n, nil
}

// memFrom rebuilds a state from its records: the records themselves and the idempotency keys.
// The two eligibility indexes are left deferred (projection.Mem.DeferIndexes): the Mem
// derives them from the records when one is first read, as the fold would have.
func memFrom(tasks map[string]*projection.Task, wakes map[string]*projection.Wake, seq uint64) (*projection.Mem, error) {
	m := projection.NewMemSized(len(tasks), len(wakes))
	m.DeferIndexes()
	var err error
	for _, t := range tasks {
		err = errors.Join(err, m.PutTask(t))
		if t.IdempotencyKey != "" {
			err = errors.Join(err, m.PutTaskKey(t.SessionID, t.IdempotencyKey, t.ID))
		}
	}
	for _, w := range wakes {
		err = errors.Join(err, m.PutWake(w))
		if w.Reason == events.WakeRequested && w.IdempotencyKey != "" {
			err = errors.Join(err, m.PutWakeKey(w.SessionID, w.IdempotencyKey, w.ID))
		}
	}
	return m, errors.Join(err, m.SetLastSeq(seq))
}

// write stores the segment ending at end: the records the window changed, as they are now.
// It reports whether a segment was written. A failure disables the cache for the rest of the
// run, with one note on stderr: the cache is an optimisation, never a reason to fail.
func (c *segCache) write(ctx context.Context, st store, m *projection.Mem, rec *recorder, end uint64, maxAt int64) bool {
	if c.failed {
		return false
	}
	if _, err := os.Stat(c.segPath(end)); err == nil {
		if h, err := readHeader(c.segPath(end)); err == nil && h.Magic == segMagic && h.Version == segVersion {
			if raw, ok, err := st.RawEvent(ctx, end); err == nil && ok && bytes.Equal(fingerprint(raw), h.Fingerprint) {
				return false // already there
			}
		}
	}
	err := c.writeSegment(ctx, st, m, rec, end, maxAt)
	if err != nil {
		c.failed = true
		c.note = "not caching snapshots: " + err.Error()
		if c.warnOut != nil {
			fmt.Fprintf(c.warnOut, "replay: note: not caching snapshots: %v\n", err)
		}
		return false
	}
	return true
}

func (c *segCache) writeSegment(ctx context.Context, st store, m *projection.Mem, rec *recorder, end uint64, maxAt int64) error {
	raw, ok, err := st.RawEvent(ctx, end)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no event at seq %d", end)
	}
	taskIDs := sortedKeys(rec.tasks)
	wakeIDs := sortedKeys(rec.wakes)
	ts := make([]*projection.Task, 0, len(taskIDs))
	for _, id := range taskIDs {
		t, err := m.Task(id)
		if err != nil || t == nil {
			return fmt.Errorf("task %s vanished from the fold", id)
		}
		ts = append(ts, t)
	}
	ws := make([]*projection.Wake, 0, len(wakeIDs))
	for _, id := range wakeIDs {
		w, err := m.Wake(id)
		if err != nil || w == nil {
			return fmt.Errorf("wake %s vanished from the fold", id)
		}
		ws = append(ws, w)
	}
	h := segHeader{Magic: segMagic, Version: segVersion, K: c.k, End: end, Fingerprint: fingerprint(raw),
		MaxAt: maxAt, Tasks: len(ts), Wakes: len(ws)}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	if err := e.Encode(&h); err != nil {
		return err
	}
	if err := writeRecords(e, ts, recordcodec.AppendTask, func(t *projection.Task) string { return t.ID }); err != nil {
		return err
	}
	if err := writeRecords(e, ws, recordcodec.AppendWake, func(w *projection.Wake) string { return w.ID }); err != nil {
		return err
	}
	buf.Write(binary.BigEndian.AppendUint32(nil, crc32.Checksum(buf.Bytes(), castagnoli)))

	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(c.dir, "tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(buf.Bytes())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), c.segPath(end))
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// writeRecords writes one array of (id, record) pairs; appendRec is recordcodec's encoder.
func writeRecords[T any](e *msgpack.Encoder, recs []*T, appendRec func([]byte, *T) []byte, idOf func(*T) string) error {
	if err := e.EncodeArrayLen(len(recs)); err != nil {
		return err
	}
	var raw []byte
	for _, r := range recs {
		raw = appendRec(raw[:0], r)
		if err := errors.Join(e.EncodeString(idOf(r)), e.EncodeBytes(raw)); err != nil {
			return err
		}
	}
	return nil
}

func sortedKeys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
