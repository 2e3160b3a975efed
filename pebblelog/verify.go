package pebblelog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// maxProblems bounds a Verify report; a store that differs everywhere says so in one line.
const maxProblems = 1000

// VerifyOptions tunes Verify. The zero value is fine.
//
// It is projection.VerifyOptions: one Verify signature for every read-only source
// (postgres.VerifyOptions is the same type).
type VerifyOptions = projection.VerifyOptions

// Verify rebuilds the projection from the log, with the same fold the live store uses, and
// compares it with the stored projection keyspace by keyspace. It also checks that the log is
// gap-free from 1 to the stored last sequence and that every event decodes. It returns every
// problem found (at most 1000), or none. It reads a snapshot: writers may go on meanwhile.
//
// It first folds in memory and compares digests: each keyspace of the
// rebuild and of the store is summed by keyed hashes of its entries, with no key sorted and
// the session, subject and blob indexes never held; the rebuild's records are held, and of
// its other keys the ones the fold reads back, the rest as hashes only. That memory is
// bounded at 256 MiB by its own estimate (about 370,000 tasks; the Go heap peaks at about 2.5
// times the estimate). When the digests match, the store is sound. When any differs, the log
// has a problem, or the rebuild outgrows that bound, Verify rebuilds again into a scratch
// Pebble store in a temporary directory (in memory when the log is short or the store is not
// on the OS filesystem) and compares key by key, which lists each problem; that path's memory
// stays bounded on any log size. Progress then counts the events a second time.
func (s *Store) Verify(ctx context.Context, vo VerifyOptions) (_ []string, err error) {
	if err := s.enterCtx(ctx); err != nil {
		return nil, err
	}
	defer s.leave(&err)
	snap := s.db.NewSnapshot()
	defer snap.Close()
	if sound, err := s.verifyByDigest(ctx, snap, vo); err != nil || sound {
		return nil, err
	}
	return s.verifyExact(ctx, snap, vo)
}

// verifyExact is Verify's exact path: it rebuilds into a scratch Pebble store and compares it
// with the stored projection key by key.
func (s *Store) verifyExact(ctx context.Context, snap *pebble.Snapshot, vo VerifyOptions) ([]string, error) {
	lastForScratch, err := reader{snap, s.blobs}.LastSeq()
	if err != nil {
		lastForScratch = 0
	}
	scratchFS, scratchDir, cleanup, err := s.scratch(lastForScratch)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// The rebuild reads back the records it writes: it needs a block cache of its own.
	cache := newBlockCache(s.opts.CacheSize, 32<<20)
	defer cache.Unref()
	rebuilt, err := pebble.Open(scratchDir, &pebble.Options{
		FS: scratchFS, FormatMajorVersion: pebbleFormat, Logger: slogLogger{s.opts.Logger},
		MemTableSize: 32 << 20, DisableWAL: true, Cache: cache,
	})
	if err != nil {
		return nil, fmt.Errorf("pebblelog: verify scratch store: %w", err)
	}
	defer rebuilt.Close()

	var problems []string
	add := func(format string, args ...any) bool {
		if len(problems) < maxProblems {
			problems = append(problems, fmt.Sprintf(format, args...))
		} else if len(problems) == maxProblems {
			problems = append(problems, "... more problems not listed")
		}
		return len(problems) <= maxProblems
	}

	stored := reader{snap, s.blobs}
	storedLast, err := stored.LastSeq()
	if err != nil {
		add("last sequence: %v", err)
	}
	if err := s.rebuild(ctx, snap, &scratchSink{db: rebuilt, fold: newFoldState(s.opts.RecordCacheSize)}, storedLast, vo, add); err != nil {
		return nil, err
	}
	if err := compare(snap, rebuilt, s.blobs, add); err != nil {
		return nil, err
	}
	return problems, nil
}

// inMemoryVerifyEvents is the log length up to which Verify rebuilds in memory: small
// rebuilds then cost no fsyncs, and a rebuild of this many events needs some tens of MiB.
const inMemoryVerifyEvents = 100_000

// scratch returns where Verify rebuilds: in memory for small logs or when the store itself
// is not on the OS filesystem (tests, crash tests); else a temporary directory, so memory
// stays bounded on any log size.
func (s *Store) scratch(last uint64) (vfs.FS, string, func(), error) {
	if s.fs != vfs.Default || last <= inMemoryVerifyEvents {
		return vfs.NewMem(), "verify", func() {}, nil
	}
	dir, err := os.MkdirTemp("", "worklog-verify-")
	if err != nil {
		return nil, "", nil, fmt.Errorf("pebblelog: verify scratch directory: %w", err)
	}
	return vfs.Default, dir, func() { os.RemoveAll(dir) }, nil
}

// foldState is the writer's memory of what the rebuild has committed, carried from chunk to
// chunk: a record cache, the ids known to have no record yet (so a submit's check for an
// existing id reads nothing), the counts and the kind policies (so a claim reads nothing
// either). Without the ids and policies, every submit and every claim of the rebuild missed
// through every level of the scratch store.
type foldState struct {
	cache    *recordCache
	counts   map[countID]int64
	ids      *maxIDs
	policies map[string]*projection.KindPolicy
}

func newFoldState(recordCacheSize int) *foldState {
	return &foldState{cache: newRecordCache(recordCacheSize), counts: map[countID]int64{},
		ids: &maxIDs{task: newIDMark(nil), wake: newIDMark(nil)}, policies: map[string]*projection.KindPolicy{}}
}

// merge takes in what a committed chunk's writer changed.
func (f *foldState) merge(w *writer) {
	f.cache.merge(w.tasks, w.wakes)
	mergeCounts(f.counts, w.countDelta)
	mergePolicies(f.policies, w.policyDelta)
	f.ids.task.settle()
	f.ids.wake.settle()
}

// foldSink is where rebuild puts the projection it folds: a scratch Pebble store
// (scratchSink) or the digests of the fast path (digestSink).
type foldSink interface {
	// writer returns the writer of the next chunk of the fold, whose last sequence is lastSeq.
	writer(lastSeq uint64) *writer
	// logKeys takes the keys derived from the event at it alone: the session, subject and
	// blob indexes.
	logKeys(it *pebble.Iterator, ev events.Event, seq uint64) error
	// full says whether w's chunk is as large as a chunk gets.
	full(w *writer) bool
	// commit ends w's chunk (w.finish has run): what it wrote is committed.
	commit(w *writer) error
}

// scratchSink folds into a scratch Pebble store, one indexed batch a chunk.
type scratchSink struct {
	db   *pebble.DB
	fold *foldState
	b    *pebble.Batch
}

func (k *scratchSink) writer(lastSeq uint64) *writer {
	k.b = k.db.NewIndexedBatch()
	f := k.fold
	return &writer{reader: reader{r: k.b}, committed: reader{r: k.db}, b: k.b, lastSeq: lastSeq,
		cache: f.cache, counts: f.counts, maxIDs: f.ids, policies: f.policies}
}

func (k *scratchSink) logKeys(it *pebble.Iterator, ev events.Event, seq uint64) error {
	if err := k.b.Set(sessionEventKey(ev.Head().SessionID, seq), nil, nil); err != nil {
		return err
	}
	if err := k.b.Set(subjectEventKey(ev, seq), nil, nil); err != nil {
		return err
	}
	// The blob index is derived from the log's blob references (blob.go); decodeAt read
	// and checked every blob they name.
	return rebuildBlobIndex(it, k.b, ev)
}

func (k *scratchSink) full(w *writer) bool { return w.b.Count() >= 4096 }

func (k *scratchSink) commit(w *writer) error {
	defer k.b.Close()
	if err := k.b.Commit(pebble.NoSync); err != nil {
		return err
	}
	k.fold.merge(w)
	return nil
}

// rebuild folds the log of snap into sink, checking gaps and decoding as it goes.
func (s *Store) rebuild(ctx context.Context, snap *pebble.Snapshot, sink foldSink, storedLast uint64,
	vo VerifyOptions, add func(string, ...any) bool) (err error) {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixEvent}, UpperBound: []byte{prefixEvent + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()

	// The same writer as the store's, over the sink, with the writer's own memory of what is
	// committed (foldState).
	w := sink.writer(0)
	folding := true
	var prev uint64
	// The pruned ranges explain the log's gaps (prune.go); each must match one.
	pruned, err := reader{snap, s.blobs}.PrunedRanges()
	if err != nil {
		add("pruned ranges: %v", err)
	}
	nextPruned := 0
	var d events.Decoder // the fold keeps no event
	for ok := it.First(); ok; ok = it.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := it.Key()
		if len(k) != 9 {
			if !add("log: key %x has the wrong length", k) {
				return nil
			}
			continue
		}
		seq := binary.BigEndian.Uint64(k[1:])
		if seq != prev+1 {
			// A gap must be exactly one recorded pruned range (they are coalesced, and a
			// range never holds a retained event): the fold then goes on after it.
			gap := projection.SeqRange{From: prev + 1, To: seq - 1}
			if seq > prev && nextPruned < len(pruned) && pruned[nextPruned] == gap {
				nextPruned++
				if err := w.SetLastSeq(seq - 1); err != nil {
					return err
				}
			} else {
				if !add("log: gap: seq %d follows %d", seq, prev) {
					return nil
				}
				folding = false
			}
		} else if nextPruned < len(pruned) && pruned[nextPruned].From <= seq {
			if !add("log: pruned range [%d, %d] holds event %d", pruned[nextPruned].From, pruned[nextPruned].To, seq) {
				return nil
			}
			nextPruned++
		}
		prev = seq
		ev, derr := decodeAt(it, &d, s.blobs)
		if derr != nil {
			if !add("log: %v", derr) {
				return nil
			}
			folding = false
			continue
		}
		if !folding {
			continue
		}
		// The session, subject and blob indexes are derived from the log too.
		if err := sink.logKeys(it, ev, seq); err != nil {
			return err
		}
		w.newCommand() // forget the large values the fold kept for a decide code it does not run
		if aerr := projection.Apply(w, ev); aerr != nil {
			if errors.Is(aerr, errFoldNeedsScratch) {
				return aerr
			}
			add("log: %v", aerr)
			folding = false
			continue
		}
		if sink.full(w) {
			if err := w.finish(0); err != nil {
				return err
			}
			if err := sink.commit(w); err != nil {
				return err
			}
			w = sink.writer(w.lastSeq)
			if vo.Progress != nil {
				vo.Progress(seq, storedLast)
			}
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	if prev < storedLast && nextPruned < len(pruned) && pruned[nextPruned] == (projection.SeqRange{From: prev + 1, To: storedLast}) {
		nextPruned++ // the newest events were pruned: the last sequence stays theirs
		if err := w.SetLastSeq(storedLast); err != nil {
			return err
		}
	} else if prev != storedLast {
		add("log: ends at seq %d but the stored last sequence is %d", prev, storedLast)
	}
	for _, r := range pruned[nextPruned:] {
		add("log: pruned range [%d, %d] is not a gap of the log", r.From, r.To)
	}
	if !folding {
		add("rebuild stopped at the first bad event: projection differences after it are not listed")
	}
	if err := w.finish(0); err != nil {
		return err
	}
	return sink.commit(w)
}

// compare walks each projection keyspace of the stored and the rebuilt store side by side,
// the keyspaces in parallel (one goroutine a core): each collects its own problems, and they
// are reported in keyspace order, as one walk after the other would.
func compare(stored pebble.Reader, rebuilt pebble.Reader, bl *blobStore, add func(string, ...any) bool) error {
	type keyRange struct{ lo, hi []byte }
	ranges := make([]keyRange, 0, len(projectionPrefixes)+1)
	for _, p := range projectionPrefixes {
		ranges = append(ranges, keyRange{[]byte{p}, []byte{p + 1}})
	}
	ranges = append(ranges, keyRange{keyLastSeq, append(append([]byte(nil), keyLastSeq...), 0)})
	found := make([][]string, len(ranges))
	errs := make([]error, len(ranges))
	next := make(chan int, len(ranges))
	for i := range ranges {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(ranges)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				// One more than add keeps, so that add still says when more were not listed.
				collect := func(format string, args ...any) bool {
					found[i] = append(found[i], fmt.Sprintf(format, args...))
					return len(found[i]) <= maxProblems
				}
				errs[i] = compareRange(stored, rebuilt, ranges[i].lo, ranges[i].hi, bl, collect)
			}
		}()
	}
	wg.Wait()
	for i := range ranges {
		if errs[i] != nil {
			return errs[i]
		}
		for _, p := range found[i] {
			if !add("%s", p) {
				return nil
			}
		}
	}
	return nil
}

func compareRange(stored, rebuilt pebble.Reader, lo, hi []byte, bl *blobStore, add func(string, ...any) bool) (err error) {
	a, err := stored.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	b, err := rebuilt.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.Close()) }()
	okA, okB := a.First(), b.First()
	for okA || okB {
		var c int
		switch {
		case !okA:
			c = 1
		case !okB:
			c = -1
		default:
			c = bytes.Compare(a.Key(), b.Key())
		}
		switch {
		case c < 0:
			va, _ := a.ValueAndErr()
			if !add("%s: stored, but not in the rebuild (value %q)", describeKey(a.Key()), va) {
				return nil
			}
			okA = a.Next()
		case c > 0:
			vb, _ := b.ValueAndErr()
			if !add("%s: missing from the store (rebuild has %q)", describeKey(b.Key()), vb) {
				return nil
			}
			okB = b.Next()
		default:
			va, errA := a.ValueAndErr()
			vb, errB := b.ValueAndErr()
			if err := errors.Join(errA, errB); err != nil {
				return err
			}
			if !bytes.Equal(va, vb) {
				for _, d := range diffValues(reader{stored, bl}, a.Key(), va, vb) {
					if !add("%s", d) {
						return nil
					}
				}
			}
			okA, okB = a.Next(), b.Next()
		}
	}
	return errors.Join(a.Error(), b.Error())
}

// diffValues explains a differing value: field by field for records. Records are compared
// with their values read from the log (input.go): a format-1 record carries them, the rebuild
// (format 2) does not, and they are the same record when the carried values are the log's.
func diffValues(log reader, key, stored, rebuilt []byte) []string {
	name := describeKey(key)
	switch key[0] {
	case prefixKindPolicy:
		// The bucket is folded from the claims, and a prune removes the claims of the tasks it
		// removes: the rebuild from the retained log may hold more tokens. The policy must match.
		x, errX := decodePolicy(string(key[1:]), stored)
		y, errY := decodePolicy(string(key[1:]), rebuilt)
		if errX == nil && errY == nil {
			x.Tokens, x.TokensAt, y.Tokens, y.TokensAt = 0, 0, 0, 0
			return labelled(projection.DiffRecords(name, x, y))
		}
	case prefixTask:
		x, errX := decodeTask(key, stored)
		y, errY := decodeTask(key, rebuilt)
		if errX == nil && errY == nil {
			errX, errY = fillTask(log, x), fillTask(log, y)
		}
		if errX == nil && errY == nil {
			if d := projection.DiffRecords(name, x, y); len(d) > 0 {
				return labelled(d)
			}
			if bytes.Equal(appendTask(nil, recordTask(x)), rebuilt) {
				return nil
			}
		} else if errX != nil {
			return []string{fmt.Sprintf("%s: stored record does not decode: %v", name, errX)}
		}
	case prefixWake:
		x, errX := decodeWake(key, stored)
		y, errY := decodeWake(key, rebuilt)
		if errX == nil && errY == nil {
			errX, errY = fillWake(log, x), fillWake(log, y)
		}
		if errX == nil && errY == nil {
			if d := projection.DiffRecords(name, x, y); len(d) > 0 {
				return labelled(d)
			}
			if bytes.Equal(appendWake(nil, recordWake(x)), rebuilt) {
				return nil
			}
		} else if errX != nil {
			return []string{fmt.Sprintf("%s: stored record does not decode: %v", name, errX)}
		}
	case prefixCount:
		if len(stored) == 8 && len(rebuilt) == 8 {
			return []string{fmt.Sprintf("%s: stored %d, rebuilt %d", name,
				int64(binary.BigEndian.Uint64(stored)), int64(binary.BigEndian.Uint64(rebuilt)))}
		}
	}
	return []string{fmt.Sprintf("%s: stored %q, rebuilt %q", name, stored, rebuilt)}
}

func labelled(d []string) []string {
	for i := range d {
		d[i] += " (stored vs rebuilt)"
	}
	return d
}

// describeKey names a key for a person.
func describeKey(k []byte) string {
	if len(k) == 0 {
		return "empty key"
	}
	switch k[0] {
	case prefixTask:
		return "task " + string(k[1:])
	case prefixWake:
		return "wake " + string(k[1:])
	case prefixTaskKey, prefixWakeKey:
		what := "task key"
		if k[0] == prefixWakeKey {
			what = "wake key"
		}
		if session, key, ok := splitScoped(k); ok {
			return fmt.Sprintf("%s (session %q, key %q)", what, session, key)
		}
	case prefixDue:
		if pri, at, seq, ok := parseDueTail(k, 1); ok {
			return fmt.Sprintf("due index entry (priority %d, at %d, seq %d)", pri, at, seq)
		}
	case prefixAvailable:
		if at, seq, ok := parseIndexKey(k); ok {
			return fmt.Sprintf("wake index entry (at %d, seq %d)", at, seq)
		}
	case prefixSession:
		if session, rest, ok := splitScoped(k); ok && len(rest) == 8 {
			return fmt.Sprintf("session index (session %q, seq %d)", session, binary.BigEndian.Uint64([]byte(rest)))
		}
	case prefixKindDue:
		if kind, rest, ok := splitScoped(k); ok {
			if pri, at, seq, ok := parseDueTail([]byte(rest), 0); ok {
				return fmt.Sprintf("kind index entry (kind %q, priority %d, at %d, seq %d)", kind, pri, at, seq)
			}
		}
	case prefixSessionWake:
		if session, rest, ok := splitScoped(k); ok {
			if at, seq, ok := parseIndexTail([]byte(rest), 0); ok {
				return fmt.Sprintf("session wake index entry (session %q, at %d, seq %d)", session, at, seq)
			}
		}
	case prefixKindLease:
		if kind, rest, ok := splitScoped(k); ok {
			if at, seq, ok := parseIndexTail([]byte(rest), 0); ok {
				return fmt.Sprintf("kind lease index entry (kind %q, lease expiry %d, seq %d)", kind, at, seq)
			}
		}
	case prefixKindPolicy:
		return fmt.Sprintf("kind policy %q", k[1:])
	case prefixSessionTask:
		if session, rest, ok := splitScoped(k); ok && len(rest) == 8 {
			return fmt.Sprintf("session task list (session %q, submit seq %d)", session, binary.BigEndian.Uint64([]byte(rest)))
		}
	case prefixCount:
		if kind, state, ok := parseCountKey(k); ok {
			return fmt.Sprintf("count (kind %q, state %s)", kind, state)
		}
	case prefixPrunable:
		if at, seq, ok := parseIndexKey(k); ok {
			return fmt.Sprintf("retention index entry (at %d, seq %d)", at, seq)
		}
	case prefixPruned:
		if len(k) == 9 {
			return fmt.Sprintf("pruned range from seq %d", binary.BigEndian.Uint64(k[1:]))
		}
	case prefixSubject:
		if id, rest, ok := splitScoped(k); ok && len(rest) == 8 {
			return fmt.Sprintf("subject index (%s, seq %d)", id, binary.BigEndian.Uint64([]byte(rest)))
		}
	case prefixMeta:
		return "meta " + string(k[1:])
	}
	return fmt.Sprintf("key %q", k)
}

func splitScoped(k []byte) (session, rest string, ok bool) {
	n, w := binary.Uvarint(k[1:])
	if w <= 0 || 1+w+int(n) > len(k) {
		return "", "", false
	}
	start := 1 + w
	return string(k[start : start+int(n)]), string(k[start+int(n):]), true
}
