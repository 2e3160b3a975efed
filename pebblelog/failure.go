package pebblelog

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/internal/headwatch"
)

// DefaultStallTimeout is Options.StallTimeout's default: how long a commit or a WAL sync may
// wait inside Pebble before the store gives up on the disk (see Options.StallTimeout).
const DefaultStallTimeout = 30 * time.Second

// failures is a store's failure state and the Pebble handlers that feed it. It is made before
// pebble.Open (installFailureHandling), so that damage or a failing disk found while Pebble
// opens is caught too, and is then shared by the Store, its writer and syncer, the stall
// watchdog, and Pebble's event listener and logger.
//
// Once failed, a store stays failed: every call returns the first failure, which wraps
// ErrStoreFailed (and ErrCorruptStore when a file is damaged), and every caller waiting for an
// answer gets it. Pebble, not worklog, decides what is durable; after a failure nothing can be
// assumed about the batches in flight, so none of them is acknowledged.
type failures struct {
	dir   string
	stall time.Duration // Options.StallTimeout; <= 0: no watchdog, no bound on Open
	log   *slog.Logger
	base  time.Time // origin of the monotonic stamps below (time.Since is monotonic)

	isFailed atomic.Bool // fast path of err()
	mu       sync.Mutex
	first    error         // the first failure, wrapped in ErrStoreFailed
	ch       chan struct{} // closed when first is set: wakes every waiting caller

	// durable is the last sequence known durable (Store.Durable, follow.go): advanced by the
	// syncer, stopped when the store fails, so a follower waiting on it wakes to the failure.
	durable headwatch.Head
	// parked: a goroutine inside Pebble waits forever (a Fatalf on a path that cannot go on,
	// see fatal; our writer in a WAL rotation that would panic, see walFS; a panic recovered
	// in a commit). It may hold Pebble's locks, so nothing may wait for Pebble again: Close
	// leaves the database open.
	parked atomic.Bool

	// The watchdog's view: when the writer entered Pebble's commit and when the syncer began
	// to wait for a WAL sync, in nanoseconds since base; 0 while neither waits.
	commitSince atomic.Int64
	syncSince   atomic.Int64
	// calls: our calls into Pebble in flight, other than the writer's commit, that can write
	// or rotate the WAL (pebblecall.go); a parked one stays counted.
	calls atomic.Int32

	bgErr       atomic.Pointer[error]  // the last background error (a failed flush or compaction)
	bgSince     atomic.Int64           // when the current run of background errors began (ns since base + 1); 0: none
	bgRun       atomic.Int64           // background errors since the last successful flush or compaction
	stallReason atomic.Pointer[string] // Pebble's write-stall reason while one lasts

	// The directory watch of a read-write store (dirwatch.go), set by open before the writer
	// starts; nil while Pebble opens and on a read-only store. dirChecked: when the last good
	// check began (ns since base + 1).
	dirs       atomic.Pointer[dirWatch]
	dirChecked atomic.Int64
}

func newFailures(dir string, o Options) *failures {
	l := o.Logger
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &failures{dir: dir, stall: o.StallTimeout, log: l, base: time.Now(), ch: make(chan struct{})}
}

// installFailureHandling makes the store's failure state and installs its handlers on po:
// Pebble's event listener (damage found by a read or a compaction, background errors, write
// stalls), a logger whose Fatalf fails the store instead of ending the process, and an FS
// wrapper that watches the WAL files (walFS). It must be called after po.Logger and po.FS are
// set and before pebble.Open; the Store keeps the result.
func installFailureHandling(po *pebble.Options, dir string, o Options) *failures {
	f := newFailures(dir, o)
	l := pebble.EventListener{
		BackgroundError: f.backgroundError,
		DataCorruption:  f.dataCorruption,
		WriteStallBegin: f.writeStallBegin,
		WriteStallEnd:   f.writeStallEnd,
		FlushEnd: func(info pebble.FlushInfo) {
			if info.Err == nil {
				f.backgroundOK()
			}
		},
		CompactionEnd: func(info pebble.CompactionInfo) {
			if info.Err == nil {
				f.backgroundOK()
			}
		},
		DiskSlow: func(info pebble.DiskSlowInfo) {
			f.log.Warn(info.String(), "component", "pebble", "dir", dir)
		},
	}
	if po.EventListener != nil {
		l = pebble.TeeEventListener(*po.EventListener, l)
	}
	po.EventListener = &l
	var base pebble.Logger = slogLogger{f.log}
	if po.Logger != nil {
		base = po.Logger
	}
	po.Logger = fatalLogger{Logger: base, f: f}
	po.LoggerAndTracer = nil // Pebble derives it from Logger
	po.FS = walFS{FS: po.FS, f: f}
	return f
}

// err returns the store's failure, or nil. One atomic load while the store is healthy: the
// writer calls it for every batch.
func (f *failures) err() error {
	if !f.isFailed.Load() {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.first
}

// fail records cause as the store's failure, unless it failed already, and returns the
// store's failure: always the first one, so every caller sees the same error.
func (f *failures) fail(cause error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.first == nil {
		f.first = fmt.Errorf("%w: %s: %w", ErrStoreFailed, f.dir, cause)
		f.isFailed.Store(true)
		close(f.ch)
		f.durable.Stop()
		f.log.Error("store failed", "component", "pebblelog", "dir", f.dir, "err", cause)
	}
	return f.first
}

// fileDamage is a damaged file found while the store runs. errors.Is(err, ErrCorruptStore)
// holds, and the text names the file.
type fileDamage struct {
	File string // relative to the store's directory; "" when Pebble did not say
	Err  error  // Pebble's report
}

func (e *fileDamage) Error() string {
	if e.File == "" {
		return fmt.Sprintf("%v: %v", ErrCorruptStore, e.Err)
	}
	return fmt.Sprintf("%v: %s: %v", ErrCorruptStore, e.File, e.Err)
}

func (e *fileDamage) Is(target error) bool { return target == ErrCorruptStore }
func (e *fileDamage) Unwrap() error        { return e.Err }

// pebbleFatal is a Fatalf of Pebble's: Pebble found its state unrecoverable.
type pebbleFatal struct{ msg string }

func (e *pebbleFatal) Error() string { return "pebble gave up: " + e.msg }

// stallError: a commit or a WAL sync waited longer than Options.StallTimeout.
type stallError struct {
	What   string        // "commit" or "WAL sync"
	Waited time.Duration // how long it had waited when the watchdog gave up
	Reason string        // Pebble's write-stall reason, if one was in progress
	Cause  error         // the last background error, if any (a flush failing on a full disk)
}

func (e *stallError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "a %s has waited %v inside Pebble (Options.StallTimeout)", e.What, e.Waited.Round(time.Millisecond))
	if e.Reason != "" {
		fmt.Fprintf(&b, "; write stall: %s", e.Reason)
	}
	if e.Cause != nil {
		fmt.Fprintf(&b, "; last background error: %v", e.Cause)
	}
	return b.String()
}

func (e *stallError) Unwrap() error { return e.Cause }

// pebbleFileName finds the files Pebble's messages name, in the one form every reader of them
// uses (fileIn for failures of a running store, pebbleFileIn for Open's errors): Pebble's
// errors are not typed by file, so the message is all there is. A match is a file name
// (group 1: "MANIFEST-000001", "000005.sst", "marker.manifest.000002.MANIFEST-000001"), or a
// file number (group 2) followed by its type (group 4: "file 000005 (type sstable)", a file
// that is missing), or a bare file number ("L0: 000005: ...") that only the directory's
// listing can complete.
var (
	pebbleFileName = regexp.MustCompile(`\b(MANIFEST-[0-9]+|OPTIONS-[0-9]+|[0-9]{6,}\.(?:sst|log|blob)|marker\.[a-z-]+\.[0-9]+\.[A-Za-z0-9-]+)\b|\b([0-9]{6,})\b( \(type (sstable|blob)\))?`)
	pebbleFileExt  = map[string]string{"sstable": ".sst", "blob": ".blob"}
)

// namedFile is the file a match of pebbleFileName names by itself, or "" for a bare number.
func namedFile(m []string) string {
	switch {
	case m[1] != "":
		return m[1]
	case m[4] != "":
		return m[2] + pebbleFileExt[m[4]]
	}
	return ""
}

// fileIn returns the first file msg names by itself, or "": Pebble's reports carry full
// paths, and a name is enough.
func fileIn(msg string) string {
	for _, m := range pebbleFileName.FindAllStringSubmatch(msg, -1) {
		if f := namedFile(m); f != "" {
			return f
		}
	}
	return ""
}

// corruptFile names the file of a Pebble corruption error, relative to dir: from the details
// Pebble attaches to the errors of reads that found damage, else from the message.
// fileOfDamage names the file a damage error is about, or "".
func fileOfDamage(dir string, err error) string {
	var d *fileDamage
	switch {
	case errors.As(err, &d):
		return d.File
	case pebble.IsCorruptionError(err):
		return corruptFile(dir, err)
	}
	return ""
}

func corruptFile(dir string, err error) string {
	if info := pebble.ExtractDataCorruptionInfo(err); info != nil {
		return relPath(dir, info.Path)
	}
	return fileIn(err.Error())
}

func relPath(dir, path string) string {
	if rel, ok := strings.CutPrefix(path, dir); ok {
		return strings.TrimLeft(rel, `/\`)
	}
	return path
}

// dataCorruption replaces Pebble's default handler, which calls Logger.Fatalf. Pebble calls
// it when a read (a Get, an iterator, a compaction's input) finds a damaged block; the read
// itself then fails with a corruption error, so the caller of that read gets an error too.
func (f *failures) dataCorruption(info pebble.DataCorruptionInfo) {
	f.fail(&fileDamage{File: relPath(f.dir, info.Path), Err: info.Details})
}

// backgroundError: a flush or a compaction failed. Pebble retries a failed flush at once and
// forever, and a failed compaction later; both may succeed once the disk recovers (space is
// freed), so an I/O error alone does not fail the store: if writes wait for that flush, the
// stall watchdog fails it. Damage does fail it.
//
// A run of failures is slowed down here (up to 1 s between retries, doubling from 10 ms):
// Pebble's flush retry has no backoff, and on a full disk it would spin a core creating and
// deleting sstables. The handler runs in Pebble's background goroutine with Pebble's mutex
// held, so only Pebble's background work and commits that need a new memtable wait, and those
// could not proceed anyway. Reads do not take that mutex.
//
// A compaction that reads a damaged block fails the store, and is retried too (over and over
// when the damaged file is in L0, where Pebble sets no problem span): the same backoff keeps
// that to one attempt a second.
func (f *failures) backgroundError(err error) {
	f.log.Error("background error", "component", "pebble", "dir", f.dir, "err", err)
	if pebble.IsCorruptionError(err) {
		f.fail(&fileDamage{File: corruptFile(f.dir, err), Err: err})
	} else {
		f.bgErr.Store(&err)
		f.bgSince.CompareAndSwap(0, f.now()+1)
	}
	n := f.bgRun.Add(1)
	d := 10 * time.Millisecond << min(n-1, 7)
	time.Sleep(min(d, time.Second))
}

func (f *failures) backgroundOK() {
	if f.bgRun.Load() != 0 {
		f.bgRun.Store(0)
		f.bgSince.Store(0)
	}
}

func (f *failures) writeStallBegin(info pebble.WriteStallBeginInfo) {
	r := info.Reason
	f.stallReason.Store(&r)
	f.log.Warn("write stall", "component", "pebble", "dir", f.dir, "reason", r)
}

func (f *failures) writeStallEnd() { f.stallReason.Store(nil) }

func (f *failures) now() int64 { return int64(time.Since(f.base)) }

// fatal is Pebble's Fatalf. Pebble calls it where it believes it cannot go on, expecting the
// process to end; worklog never ends its host process. So the store fails first (every
// caller, waiting or future, gets the error), and then:
//
//   - where the caller of Fatalf returns an error or stops cleanly once Fatalf returns, it
//     returns (returnableFatal lists them: the commit pipeline, whose caller is our writer;
//     creating the first MANIFEST in Open; an iterator's invariant checks in a reader's
//     goroutine; the table-stats size check, which finds a truncated sstable);
//   - everywhere else (a MANIFEST write that failed after a flush or compaction, a WAL file
//     that vanished, a broken compaction invariant) Pebble would go on with an in-memory
//     state that no longer matches the disk, and could write a MANIFEST that loses acknowledged
//     data. That goroutine, always one of Pebble's own (a flush, a compaction, or our writer
//     inside a commit), is parked forever instead: a hang of one goroutine, which may hold
//     Pebble's mutex, and not of any caller, since no caller waits for Pebble once the store
//     has failed. The database cannot be closed any more (Close says so); the store opens
//     again in a new process, where Pebble recovers from what is on disk.
func (f *failures) fatal(format, msg string) {
	var cause error = &pebbleFatal{msg: msg}
	if strings.Contains(msg, "object size mismatch") { // a truncated or overwritten sstable
		cause = &fileDamage{File: fileIn(msg), Err: cause}
	}
	// parked is set before the failure is published: whoever sees the store failed (Close
	// deciding whether DB.Close may wait for Pebble) must also see that this goroutine parks.
	parks := !returnableFatal(format)
	if parks {
		f.parked.Store(true)
	}
	f.fail(cause)
	if !parks {
		return
	}
	f.log.Error("a Pebble goroutine is parked for good after a fatal error; restart the process to reopen the store",
		"component", "pebble", "dir", f.dir)
	select {}
}

// returnableFatal reports whether Pebble's caller of Fatalf(format, ...) copes with Fatalf
// returning (Pebble v2.1.7; TestReturnableFatalFormats checks these formats still exist):
//
//   - db.go, DB.applyInternal: "pebble: fatal commit error: %v". Our writer is the only
//     committer; the commit then returns nil, so publish checks the store's failure after
//     every commit and answers the batch's callers with it.
//   - version_set.go, versionSet.create (a new store, in Open): the MANIFEST formats below;
//     create returns the error, and Open with it.
//   - merging_iter.go, level_iter.go, iterator.go: key-order invariants checked by an
//     iterator in the reader's goroutine; the read goes on, and the store has failed.
//   - table_stats.go: "%s" with an object size mismatch: the stats loader skips the file.
func returnableFatal(format string) bool {
	if slices.Contains(returnableFatalFormats, format) {
		return true
	}
	for _, p := range returnableFatalPrefixes {
		if strings.HasPrefix(format, p) {
			return true
		}
	}
	return false
}

var (
	returnableFatalFormats = []string{"pebble: fatal commit error: %v",
		"MANIFEST flush failed: %v", "MANIFEST sync failed: %v", "MANIFEST set current failed: %v"}
	returnableFatalPrefixes = []string{"mergingIter: ", "levelIter %s: ", "pebble: prefix violation", "pebble: invariant violation"}
)

// fatalLogger is the store's Pebble logger: Logger for messages, failures for Fatalf.
type fatalLogger struct {
	pebble.Logger
	f *failures
}

func (l fatalLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.Logger.Errorf("fatal: %s", msg)
	l.f.fatal(format, msg)
}

// Watchdog.

// inCommit and outOfCommit bracket the writer's commit; inSync and outOfSync the syncer's wait
// for a WAL sync. Two atomic stores and a clock read per batch.
func (f *failures) inCommit()    { f.commitSince.Store(f.now() + 1) }
func (f *failures) outOfCommit() { f.commitSince.Store(0) }
func (f *failures) inSync()      { f.syncSince.Store(f.now() + 1) }
func (f *failures) outOfSync()   { f.syncSince.Store(0) }

// watch fails the store when a commit or a WAL sync has waited inside Pebble longer than
// f.stall: a write stall that does not end (a flush failing on a full disk) or a disk that no
// longer answers. Every waiting caller is then answered at once with the failure; the writer
// or syncer stays where it is until Pebble returns (if the disk recovers, the batch may still
// commit: its callers were told the store failed, not that it was lost). It checks four times
// per f.stall, so a stall is reported between f.stall and 1.25 × f.stall after it began. It
// also checks the store's directory (dirwatch.go) every dirCheckInterval, so an idle store
// notices its directory is gone too. It returns when stop is closed.
func (f *failures) watch(stop <-chan struct{}) {
	every := dirCheckInterval
	if f.stall > 0 {
		every = max(min(f.stall/4, every), time.Millisecond)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-f.ch:
			return
		case <-t.C:
		}
		f.checkDirEvery()
		if f.stall <= 0 {
			continue
		}
		now := f.now()
		for _, w := range []struct {
			what  string
			since *atomic.Int64
		}{{"commit", &f.commitSince}, {"WAL sync", &f.syncSince}} {
			s := w.since.Load()
			if s == 0 || time.Duration(now-(s-1)) < f.stall {
				continue
			}
			e := &stallError{What: w.what, Waited: time.Duration(now - (s - 1))}
			if r := f.stallReason.Load(); r != nil {
				e.Reason = *r
			}
			if bg := f.bgErr.Load(); bg != nil {
				e.Cause = *bg
			}
			f.fail(e)
			return
		}
	}
}

// Open and Close.

// open is pebble.Open, bounded: Pebble's recovery flushes the replayed WAL and, when that
// flush fails (a full disk), retries it forever. Once recovery has reported a background
// error, open waits at most f.stall more (measured from the first error of the run) and then
// returns an *OpenError of kind ErrStoreFailed naming the last error. A Fatalf that parked a
// goroutine ends the wait at once. The abandoned pebble.Open goes on in the background (its
// retries slowed, see backgroundError); if it ever succeeds, the database is closed.
func (f *failures) open(dir string, po *pebble.Options) (*pebble.DB, error) {
	type result struct {
		db  *pebble.DB
		err error
	}
	res := make(chan result, 1)
	go func() {
		db, err := pebble.Open(dir, po)
		res <- result{db, err}
	}()
	var tick <-chan time.Time
	if f.stall > 0 {
		t := time.NewTicker(max(f.stall/4, time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	failed := f.ch
	for {
		select {
		case r := <-res:
			return r.db, r.err
		case <-failed:
			failed = nil // pebble.Open normally returns the error itself
			if !f.parked.Load() {
				continue
			}
		case <-tick:
			s := f.bgSince.Load()
			if s == 0 || time.Duration(f.now()-(s-1)) < f.stall {
				continue
			}
		}
		go func() {
			if r := <-res; r.err == nil && !f.parked.Load() {
				r.db.Close()
			}
		}()
		return nil, f.openFailure()
	}
}

// openFailure is the error of an open that recovery could not finish.
func (f *failures) openFailure() error {
	e := &OpenError{Dir: f.dir, Kind: ErrStoreFailed, Offset: -1}
	if err := f.err(); err != nil {
		e.Err = err
		e.Detail = "Pebble gave up while opening the store"
		var d *fileDamage
		if errors.As(err, &d) {
			e.Kind, e.File = ErrCorruptStore, d.File
		}
		return e
	}
	if bg := f.bgErr.Load(); bg != nil {
		e.Err = *bg
	}
	e.Detail = fmt.Sprintf("recovery could not write the store for %v (Options.StallTimeout)", f.stall)
	e.Hint = "free disk space (or fix the disk) and open it again"
	return e
}

// asOpenError turns an error of Open that is damage found in a file (a corrupt block read
// while opening) into an *OpenError of kind ErrCorruptStore naming the file; other errors are
// returned unchanged.
func asOpenError(dir string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpenError
	if errors.As(err, &oe) {
		if oe.Kind == ErrCorruptStore && oe.File == "" && oe.Err != nil {
			oe.File = fileOfDamage(dir, oe.Err) // e.g. a block found damaged while checking the format key
		}
		return oe
	}
	var d *fileDamage
	switch {
	case errors.As(err, &d):
		return &OpenError{Dir: dir, Kind: ErrCorruptStore, File: d.File, Offset: -1, Detail: "a file of the store is damaged",
			Hint: "restore the store from a backup or a checkpoint", Err: err}
	case pebble.IsCorruptionError(err):
		return &OpenError{Dir: dir, Kind: ErrCorruptStore, File: corruptFile(dir, err), Offset: -1, Detail: "a file of the store is damaged",
			Hint: "restore the store from a backup or a checkpoint", Err: err}
	}
	return err
}

// waitWriter waits for the writer to stop (done closed) after Close closed its queue. While
// the store is healthy it waits as long as the writer needs. Once the store has failed, it
// waits at most f.stall (a writer stuck in a write stall returns when the disk recovers, or
// never), and not at all once a goroutine is parked; false means the writer is still inside
// Pebble, or a Pebble goroutine is parked, and the database must not be closed from here:
// DB.Close would wait for the same locks.
func (f *failures) waitWriter(done <-chan struct{}) bool {
	select {
	case <-done:
		return !f.parked.Load()
	case <-f.ch:
	}
	wait := f.stall
	if wait <= 0 {
		wait = DefaultStallTimeout
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return !f.parked.Load()
		case <-tick.C:
			if f.parked.Load() {
				return false
			}
		case <-t.C:
			return false
		}
	}
}

// abandon is Close's end when Pebble cannot be closed now (waitWriter returned false): the
// database and the locks are handed to a goroutine that closes them once the writer returns
// from Pebble (the disk recovered), unless a Pebble goroutine is parked, in which case they
// stay open until the process ends. The error says so.
func (f *failures) abandon(done <-chan struct{}, closeAll func()) error {
	go func() {
		<-done
		if !f.parked.Load() {
			closeAll()
		}
	}()
	return fmt.Errorf("%w; Pebble is blocked, so the database stays open (and locked) until it returns, or until the process ends", f.err())
}

// leave ends a call registered by enter (deferred: defer s.leave(&err)). If the store failed
// during the call (the call's own read found a damaged block, and Pebble reported it to
// dataCorruption before returning the read's error), the call returns the store's failure,
// which names the file, instead of what it would have returned.
func (s *Store) leave(err *error) {
	s.closeMu.RUnlock()
	if ferr := s.fh.err(); ferr != nil {
		*err = ferr
	}
}
