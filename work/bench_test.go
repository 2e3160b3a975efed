package work_test

// Benchmarks of the durable store (work.Open), each beside a same-run baseline so that the
// ratio, not the absolute figure, is what carries over between runs on a noisy machine. See
// docs/performance.md for the figures, the targets and the commands that reproduce them.
//
// Pinned for every benchmark unless it says otherwise:
//   - worklog: work.Open with default Options (SyncAlways, 64 MiB block cache, 32 MiB
//     memtables, MaxBatchCommands 1024), except FS, which wraps vfs.Default only to count WAL
//     syncs (calls/walsync).
//   - task: kind "thumbnail", a 200-byte JSON input (benchInput), no idempotency key, no
//     RunAt, WakeNever; one session per caller.
//   - bare Pebble: its own pebble.DB with the Pebble options pebblelog uses (benchPebbleOptions),
//     one 300-byte value per synced commit under "e/"+8-byte big-endian seq.
//
// Benchmarks over a store of 1,000,000 settled tasks (ClaimLatency, Rebuild, RSS) run only
// when WORKLOG_BENCH_DIR names a scratch directory: the store is built there once (through
// the API, SyncNever) and reused by later runs; WORKLOG_BENCH_SETTLED changes its size.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// benchInput is the input of every benchmark task: 200 bytes of JSON.
var benchInput = func() json.RawMessage {
	s := `{"image":"s3://worklog-bench/uploads/2026/11/30/cover-000123.png","sizes":[64,128,256,512],"format":"webp","quality":82,"owner":"user_7f3a9c2e","note":"`
	s += strings.Repeat("x", 200-len(s)-2)
	return json.RawMessage(s + `"}`)
}()

// benchOutput is the output every benchmark worker finishes with.
var benchOutput = json.RawMessage(`{"thumb":"s3://worklog-bench/thumbs/cover-000123-64.webp","bytes":18211}`)

var benchRequest = work.TaskRequest{Kind: "thumbnail", Input: benchInput}

// ---------------------------------------------------------------------------------------
// Durable submit beside bare Pebble and a raw write+fdatasync group commit.

// BenchmarkSubmit: Session.SubmitAt on a durable queue (default SyncAlways) with N closed-loop
// callers, beside a bare Pebble synced write per call at the same N (the baseline),
// at 1 and 64 callers a bare Pebble synced batch of the keys a submit writes (what the
// storage costs without worklog's own work), and at 256 callers a raw write+fdatasync group
// commit (the disk's ceiling).
func BenchmarkSubmit(b *testing.B) {
	for _, n := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("callers=%d/store=worklog", n), func(b *testing.B) { benchSubmitWorklog(b, n) })
		b.Run(fmt.Sprintf("callers=%d/store=pebble", n), func(b *testing.B) { benchPebbleSynced(b, n) })
		if n == 1 || n == 64 {
			b.Run(fmt.Sprintf("callers=%d/store=pebble-submitkeys", n), func(b *testing.B) { benchPebbleSubmitKeys(b, n) })
		}
		if n == 256 {
			b.Run(fmt.Sprintf("callers=%d/store=rawgc", n), func(b *testing.B) { benchRawGroupCommit(b, n) })
		}
	}
}

func benchSubmitWorklog(b *testing.B, callers int) {
	fs := &syncCountFS{FS: vfs.Default}
	q, err := work.Open(b.TempDir(), &work.Options{FS: fs})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	sessions := make([]*work.Session, callers)
	for i := range sessions {
		sessions[i] = q.Session(fmt.Sprintf("session-%03d", i))
	}
	wal0 := fs.stats()
	closedLoop(b, callers, func(w int) error {
		_, err := sessions[w].SubmitAt(ctx, benchRequest, time.Now())
		return err
	})
	fs.stats().since(wal0).report(b, b.N)
}

// benchPebbleOptions are the Pebble options of the bare baselines: the ones pebblelog.Open
// sets (cache, memtables, pinned format), so a ratio isolates worklog's own work.
func benchPebbleOptions(fs vfs.FS) *pebble.Options {
	return &pebble.Options{
		FS:                          fs,
		Cache:                       pebble.NewCache(pebblelog.DefaultCacheSize + 2*pebblelog.DefaultMemTableSize), // as pebblelog.Open: blocks beside two memtables
		MemTableSize:                pebblelog.DefaultMemTableSize,
		MemTableStopWritesThreshold: 2,
		FormatMajorVersion:          pebble.FormatValueSeparation,
		Logger:                      quietLogger{},
	}
}

func openBarePebble(b *testing.B, dir string, fs vfs.FS) *pebble.DB {
	o := benchPebbleOptions(fs)
	db, err := pebble.Open(dir, o)
	o.Cache.Unref()
	if err != nil {
		b.Fatal(err)
	}
	return db
}

// barePebbleValue is a 300-byte value: a 73-byte fixed header of field names and 227 random
// bytes, like an encoded event (about a quarter compressible).
func barePebbleValue(r *rand.Rand) []byte {
	hdr := []byte("\x01\x01\x93\xa7session\xabsession-001\xa4task\xa9thumbnail\xa5input\xa4time\xa3at\xa4kind\xa5seq\x00")
	v := make([]byte, 300)
	n := copy(v, hdr[:min(len(hdr), 73)])
	for i := n; i < len(v); i++ {
		v[i] = byte(r.Uint32())
	}
	return v
}

// benchPebbleSynced: N closed-loop callers, each call one batch with one 300-byte Set under
// "e/"+seq (shared atomic counter), committed with pebble.Sync.
func benchPebbleSynced(b *testing.B, callers int) {
	benchBarePebble(b, callers, func(batch *pebble.Batch, w int, s uint64, v []byte) error {
		var key [10]byte
		copy(key[:], "e/")
		binary.BigEndian.PutUint64(key[2:], s)
		return batch.Set(key[:], v[:300], nil)
	})
}

// benchPebbleSubmitKeys: N closed-loop callers, each call one batch committed with
// pebble.Sync holding the keys a worklog submit writes (store format 3), at about the same
// sizes: the event (the 300-byte value plus 40 bytes) under e+seq, a session index key, a
// 300-byte task record under t+time-ordered id, a due-index entry, the kind's due-index
// entry, the session task list entry, the kind's pending count and the last sequence. The
// ratio of worklog to it is worklog's own overhead; its ratio to the one-value baseline is
// what writing the projection and indexes in the same batch costs the storage.
func benchPebbleSubmitKeys(b *testing.B, callers int) {
	sessions := make([][]byte, callers)
	lists := make([][]byte, callers)
	for i := range sessions {
		sessions[i] = fmt.Appendf(nil, "s\x0bsession-%03d", i)
		lists[i] = fmt.Appendf(nil, "l\x0bsession-%03d", i)
	}
	kindDue := []byte("D\x09thumbnail")
	count := []byte("c\x09thumbnail\x00")
	var pending atomic.Int64
	benchBarePebble(b, callers, func(batch *pebble.Batch, w int, s uint64, v []byte) error {
		now := uint64(time.Now().UnixNano())
		event := binary.BigEndian.AppendUint64([]byte{'e'}, s)
		session := binary.BigEndian.AppendUint64(slices.Clip(sessions[w]), s)
		id := fmt.Appendf(nil, "task_%016x%016x", now, s)
		due := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte{'d'}, now), s)
		kd := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(slices.Clip(kindDue), now), s)
		list := binary.BigEndian.AppendUint64(slices.Clip(lists[w]), s)
		n := binary.BigEndian.AppendUint64(nil, uint64(pending.Add(1)))
		return errors.Join(
			batch.Set(event, v, nil),
			batch.Set(session, nil, nil),
			batch.Set(append([]byte{'t'}, id...), v[:300], nil),
			batch.Set(due, id, nil),
			batch.Set(kd, id, nil),
			batch.Set(list, id, nil),
			batch.Set(count, n, nil),
			batch.Set([]byte("mlastseq"), event[1:], nil))
	})
}

// benchBarePebble runs the bare Pebble baselines: N closed-loop callers, each call one batch
// that fill fills for caller w and sequence s (a shared atomic counter), committed with
// pebble.Sync. v is caller w's 340-byte value (barePebbleValue plus 40 bytes) whose first
// 300 bytes end with s.
func benchBarePebble(b *testing.B, callers int, fill func(batch *pebble.Batch, w int, s uint64, v []byte) error) {
	fs := &syncCountFS{FS: vfs.Default}
	db := openBarePebble(b, b.TempDir(), fs)
	defer db.Close()
	var seq atomic.Uint64
	vals := make([][]byte, callers)
	for i := range vals {
		vals[i] = append(barePebbleValue(rand.New(rand.NewPCG(uint64(i), 1))), make([]byte, 40)...)
	}
	wal0 := fs.stats()
	closedLoop(b, callers, func(w int) error {
		s := seq.Add(1)
		v := vals[w]
		binary.BigEndian.PutUint64(v[300-8:300], s)
		batch := db.NewBatch()
		defer batch.Close()
		if err := fill(batch, w, s, v); err != nil {
			return err
		}
		return batch.Commit(pebble.Sync)
	})
	fs.stats().since(wal0).report(b, b.N)
}

// rawGroupCommit is the hand-written ceiling: callers append records to a shared buffer under
// a mutex and wait for their epoch; one flusher does one write and one fdatasync per epoch.
type rawGroupCommit struct {
	f    *os.File
	kick chan struct{}

	mu  sync.Mutex
	buf []byte
	cur *rawEpoch

	syncs atomic.Int64
}

type rawEpoch struct {
	done chan struct{}
	err  error
}

func newRawGroupCommit(path string) (*rawGroupCommit, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	g := &rawGroupCommit{f: f, kick: make(chan struct{}, 1), cur: &rawEpoch{done: make(chan struct{})}}
	go g.flushLoop()
	return g, nil
}

func (g *rawGroupCommit) append(rec []byte) error {
	g.mu.Lock()
	g.buf = append(g.buf, rec...)
	e := g.cur
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
	<-e.done
	return e.err
}

func (g *rawGroupCommit) flushLoop() {
	var spare []byte
	for range g.kick {
		g.mu.Lock()
		if len(g.buf) == 0 {
			g.mu.Unlock()
			continue
		}
		out, e := g.buf, g.cur
		g.buf, g.cur = spare[:0], &rawEpoch{done: make(chan struct{})}
		g.mu.Unlock()
		_, err := g.f.Write(out)
		if err == nil {
			err = unix.Fdatasync(int(g.f.Fd()))
		}
		g.syncs.Add(1)
		e.err = err
		close(e.done)
		spare = out
	}
}

func (g *rawGroupCommit) close() error {
	close(g.kick)
	return g.f.Close()
}

// benchRawGroupCommit: N closed-loop callers append 310-byte records to a growing file.
func benchRawGroupCommit(b *testing.B, callers int) {
	g, err := newRawGroupCommit(filepath.Join(b.TempDir(), "log"))
	if err != nil {
		b.Fatal(err)
	}
	defer g.close()
	recs := make([][]byte, callers)
	for i := range recs {
		recs[i] = append(barePebbleValue(rand.New(rand.NewPCG(uint64(i), 2))), make([]byte, 10)...)
	}
	var seq atomic.Uint64
	closedLoop(b, callers, func(w int) error {
		binary.BigEndian.PutUint64(recs[w][:8], seq.Add(1))
		return g.append(recs[w])
	})
	reportPerSync(b, b.N, g.syncs.Load())
}

// ---------------------------------------------------------------------------------------
// Duplicate submit.

// BenchmarkDuplicateSubmit: SubmitAt of a request whose idempotency key the session already
// holds (the same kind and input, so the existing task is the answer, read from state and
// nothing written), from 1 and 16 closed-loop callers, each on its own session cycling over
// 1,000 keys it submitted first; beside it, at the same callers, a bare Pebble Get of a
// stored key (the ceiling: one read).
func BenchmarkDuplicateSubmit(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d/store=worklog", n), func(b *testing.B) { benchDuplicateWorklog(b, n) })
		b.Run(fmt.Sprintf("callers=%d/store=pebble-get", n), func(b *testing.B) { benchPebbleGet(b, n) })
	}
}

const benchDuplicateKeys = 1000

func benchDuplicateWorklog(b *testing.B, callers int) {
	q, err := work.Open(b.TempDir(), &work.Options{Sync: work.SyncNever})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	sessions := make([]*work.Session, callers)
	reqs := make([]work.TaskRequest, benchDuplicateKeys)
	for i := range reqs {
		reqs[i] = benchRequest
		reqs[i].IdempotencyKey = fmt.Sprintf("key-%06d", i)
	}
	ids := make([][]string, callers)
	for w := range sessions {
		sessions[w] = q.Session(fmt.Sprintf("session-%03d", w))
		for _, r := range reqs {
			t, err := sessions[w].SubmitAt(ctx, r, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			ids[w] = append(ids[w], t.ID)
		}
	}
	b.ReportAllocs()
	next := make([]int, callers)
	closedLoop(b, callers, func(w int) error {
		i := next[w] % benchDuplicateKeys
		next[w]++
		t, err := sessions[w].SubmitAt(ctx, reqs[i], time.Now())
		if err == nil && t.ID != ids[w][i] {
			err = fmt.Errorf("duplicate submit returned task %s, want %s", t.ID, ids[w][i])
		}
		return err
	})
}

// benchPebbleGet: N closed-loop callers, each call one Get of one of 1,000 stored 300-byte
// values, copying the value out as a submit's answer does.
func benchPebbleGet(b *testing.B, callers int) {
	db := openBarePebble(b, b.TempDir(), vfs.Default)
	defer db.Close()
	v := barePebbleValue(rand.New(rand.NewPCG(1, 1)))
	keys := make([][]byte, benchDuplicateKeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "k\x0bsession-000key-%06d", i)
		if err := db.Set(keys[i], v, pebble.NoSync); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	next := make([]int, callers)
	closedLoop(b, callers, func(w int) error {
		k := keys[(next[w]+w)%benchDuplicateKeys]
		next[w]++
		val, closer, err := db.Get(k)
		if err != nil {
			return err
		}
		_ = slices.Clone(val)
		return closer.Close()
	})
}

// ---------------------------------------------------------------------------------------
// Runner W2.

// BenchmarkRunnerW2: the W2 workload's work phase on a durable queue (default SyncAlways):
// b.N tasks submitted first (untimed), then a runner with 16 slots and Prefetch 16 claims
// and settles them all, a handler that does nothing. cpu-µs/op and allocs/op are per task:
// its claim and its settlement, the runner's own work included.
func BenchmarkRunnerW2(b *testing.B) {
	fs := &syncCountFS{FS: vfs.Default}
	q, err := work.Open(b.TempDir(), &work.Options{FS: fs})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	sess := q.Session("bench")
	for range b.N {
		if _, err := sess.Submit(ctx, work.TaskRequest{Kind: "w2", Input: json.RawMessage(`{"n":1}`)}); err != nil {
			b.Fatal(err)
		}
	}
	done := make(chan struct{}, b.N)
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{"w2": func(context.Context, work.Task) (json.RawMessage, error) {
			done <- struct{}{}
			return json.RawMessage(`1`), nil
		}},
		Concurrency: 16, Prefetch: 16, LeaseFor: time.Minute,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	wal0, ru0 := fs.stats(), rusage()
	start := time.Now()
	if err := r.Start(); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		<-done
	}
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Stop(stop); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	ru := rusage().sub(ru0)
	b.StopTimer()
	ru.report(b, b.N)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "tasks/s")
	reportPerSync(b, b.N, fs.stats().since(wal0).syncs)
}

// ---------------------------------------------------------------------------------------
// Claim and finish.

// BenchmarkClaimFinish: 16 workers claim (ClaimDueAt, limit 1 or 16, lease 1 h) and finish
// (FinishAt, Success) b.N pre-submitted tasks on a durable queue (default SyncAlways); jobs/s
// is end to end. Beside it, bare Pebble synced writes at 16 callers: a limit-1 job is two
// synced commands (claim, finish), a limit-16 job about 1 1/16.
func BenchmarkClaimFinish(b *testing.B) {
	const workers = 16
	for _, limit := range []int{1, 16} {
		b.Run(fmt.Sprintf("workers=%d/limit=%d", workers, limit), func(b *testing.B) {
			benchClaimFinish(b, workers, limit)
		})
	}
	b.Run(fmt.Sprintf("workers=%d/pebble-synced-write", workers), func(b *testing.B) { benchPebbleSynced(b, workers) })
}

func benchClaimFinish(b *testing.B, workers, limit int) {
	dir := b.TempDir()
	if err := withQueue(dir, &work.Options{Sync: work.SyncNever}, func(q *work.Queue) error {
		return submitN(q, b.N, 64)
	}); err != nil {
		b.Fatal(err)
	}
	fs := &syncCountFS{FS: vfs.Default}
	q, err := work.Open(dir, &work.Options{FS: fs})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	wal0 := fs.stats()
	b.ResetTimer()
	ru0 := rusage()
	start := time.Now()
	claims, finishes, err := drain(q, workers, limit)
	elapsed := time.Since(start)
	ru := rusage().sub(ru0)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	ru.report(b, b.N)
	if finishes != b.N {
		b.Fatalf("finished %d of %d tasks", finishes, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	fs.stats().since(wal0).report(b, claims+finishes) // per call: a claim or a finish
}

// ---------------------------------------------------------------------------------------
// Claim latency against the number of settled tasks.

// BenchmarkClaimLatency: one caller claims (ClaimDueAt, limit 1) the oldest of b.N pending
// tasks and finishes it, in a store that already holds 1,000 or 1,000,000 settled tasks.
// claim-µs is the ClaimDueAt call alone; ns/op includes the finish. sync=never isolates the
// store's read and write work; sync=always is what a default queue sees (one fsync each).
// priorities=8 (issue 23's target: ≤ 1.1× the single-priority figure) submits the tasks at
// 8 priorities in turn, plus 64 tasks of a higher priority scheduled an hour ahead, so each
// claim walks past a future run and takes the highest priority that is due: the claim's seek
// per priority present (design §3, "Claims").
func BenchmarkClaimLatency(b *testing.B) {
	for _, mode := range []work.SyncMode{work.SyncNever, work.SyncAlways} {
		b.Run(fmt.Sprintf("sync=%v/settled=1k", mode), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "store")
			if _, err := buildSettled(dir, 1000); err != nil {
				b.Fatal(err)
			}
			benchClaimLatency(b, dir, mode, 1)
		})
		b.Run(fmt.Sprintf("sync=%v/settled=1k/priorities=8", mode), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "store")
			if _, err := buildSettled(dir, 1000); err != nil {
				b.Fatal(err)
			}
			benchClaimLatency(b, dir, mode, 8)
		})
		b.Run(fmt.Sprintf("sync=%v/settled=%s", mode, countName(settledCount())), func(b *testing.B) {
			benchClaimLatency(b, settledStore(b), mode, 1)
		})
	}
}

func benchClaimLatency(b *testing.B, dir string, mode work.SyncMode, priorities int) {
	q, err := work.Open(dir, &work.Options{Sync: mode})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	if priorities <= 1 {
		err = submitN(q, b.N, 64)
	} else {
		err = submitPriorities(q, b.N, priorities)
	}
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		ds, err := q.ClaimDueAt(ctx, time.Now(), time.Hour, 1)
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if len(ds) != 1 {
			b.Fatalf("claimed %d tasks, want 1", len(ds))
		}
		if _, err := q.FinishAt(ctx, ds[0], work.Success(benchOutput), time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	slices.Sort(lat)
	b.ReportMetric(float64(sum.Microseconds())/float64(len(lat)), "claim-µs")
	b.ReportMetric(float64(percentile(lat, 0.50).Nanoseconds())/1e3, "claim-p50-µs")
	b.ReportMetric(float64(percentile(lat, 0.99).Nanoseconds())/1e3, "claim-p99-µs")
}

// ---------------------------------------------------------------------------------------
// Rebuild: read the whole log from Pebble, decode, apply.

// BenchmarkRebuild reads the whole event log of the settled store (about 3 events per task)
// on one core (GOMAXPROCS 1), page cache warm:
//   - step=scan: a bare Pebble iterator over the event keys (Key, ValueAndErr), no decode;
//   - step=decode: pebblelog Store.ReadLog (iterate + events.Decode), events dropped;
//   - step=apply: Store.ReadLog + projection.Apply into a fresh projection.NewMem();
//   - step=apply-sized: Store.FoldRange (events decoded into reused structs) into
//     projection.NewMemSized(last seq / 3, 0) with its indexes deferred and built at the
//     end, as the replay tool and the in-memory engine's rebuilds do (a task's life is about
//     three events);
//   - step=fold: decode (an events.Decoder) + apply alone, from the log's bytes read into
//     memory beforehand, into a Mem set up as in step=apply-sized.
//
// The store is opened read-only (no compactions). Each op is one pass over the whole log;
// the garbage of the previous pass is collected before the timer restarts.
func BenchmarkRebuild(b *testing.B) {
	dir := settledStore(b)
	b.Run("step=scan", func(b *testing.B) {
		o := benchPebbleOptions(vfs.Default)
		o.ReadOnly = true
		db, err := pebble.Open(dir, o)
		o.Cache.Unref()
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		benchOneCore(b, func() (int, error) {
			it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte("e"), UpperBound: []byte("f")})
			if err != nil {
				return 0, err
			}
			n, sum := 0, 0
			for ok := it.First(); ok; ok = it.Next() {
				v, err := it.ValueAndErr()
				if err != nil {
					it.Close()
					return 0, err
				}
				sum += len(it.Key()) + len(v)
				n++
			}
			return n, errors.Join(it.Error(), it.Close())
		})
	})
	b.Run("step=decode", func(b *testing.B) {
		st := openReadOnly(b, dir)
		defer st.Close()
		benchOneCore(b, func() (int, error) {
			n := 0
			err := st.ReadLog(context.Background(), 1, func(events.Event) error { n++; return nil })
			return n, err
		})
	})
	b.Run("step=fold", func(b *testing.B) { benchRebuildFold(b, dir) })
	for _, sized := range []bool{false, true} {
		name := "step=apply"
		if sized {
			name = "step=apply-sized"
		}
		b.Run(name, func(b *testing.B) { benchRebuildApply(b, dir, sized) })
	}
}

func benchRebuildApply(b *testing.B, dir string, sized bool) {
	st := openReadOnly(b, dir)
	defer st.Close()
	last, err := st.LastSeq(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	benchOneCore(b, func() (int, error) {
		m := projection.NewMem()
		if sized { // as the library's rebuilds do (replay, the in-memory engine)
			m = projection.NewMemSized(int(last/3), 0)
			m.DeferIndexes()
		}
		n := 0
		read := st.ReadRange
		if sized {
			read = st.FoldRange // events decoded into reused structs, as the library folds
		}
		err := read(context.Background(), 1, 0, func(ev events.Event) error {
			n++
			return projection.Apply(m, ev)
		})
		m.BuildIndexes()
		runtime.KeepAlive(m)
		return n, err
	})
}

// benchRebuildFold is the "decode + apply" alone: the raw events of the whole log are
// read into memory first (untimed, into one pointer-free buffer so the GC does not scan
// them), then each pass decodes and applies all of them into NewMemSized, with no storage
// read.
func benchRebuildFold(b *testing.B, dir string) {
	st := openReadOnly(b, dir)
	last, err := st.LastSeq(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var buf []byte
	ends := make([]int, 0, last) // event i is buf[ends[i-1]:ends[i]]
	err = st.RawLog(context.Background(), 1, 0, func(_ uint64, v []byte) error {
		buf = append(buf, v...)
		ends = append(ends, len(buf))
		return nil
	})
	st.Close()
	if err != nil {
		b.Fatal(err)
	}
	benchOneCore(b, func() (int, error) {
		m := projection.NewMemSized(len(ends)/3, 0)
		m.DeferIndexes()
		var d events.Decoder
		start := 0
		for i, end := range ends {
			ev, err := d.Decode(buf[start:end], uint64(i+1))
			if err != nil {
				return i, err
			}
			if err := projection.Apply(m, ev); err != nil {
				return i, err
			}
			start = end
		}
		m.BuildIndexes()
		runtime.KeepAlive(m)
		return len(ends), nil
	})
}

func openReadOnly(b *testing.B, dir string) *pebblelog.Store {
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// benchOneCore runs pass b.N times with GOMAXPROCS 1 and reports events/s.
func benchOneCore(b *testing.B, pass func() (int, error)) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	var total int
	var elapsed time.Duration
	var used usage
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		runtime.GC()
		b.StartTimer()
		t0, ru0 := time.Now(), rusage()
		n, err := pass()
		elapsed += time.Since(t0)
		ru := rusage().sub(ru0)
		used.cpu += ru.cpu
		used.faults += ru.faults
		if err != nil {
			b.Fatal(err)
		}
		total += n
	}
	b.StopTimer()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "events/s")
	// The process's CPU time, GC included: with GOMAXPROCS 1 this is the rate on one core
	// even when other programs take turns on it.
	b.ReportMetric(float64(total)/used.cpu.Seconds(), "events/cpu-s")
	b.ReportMetric(float64(used.faults)/float64(total), "faults/event")
	b.ReportMetric(float64(total)/float64(b.N), "events/pass")
}

// ---------------------------------------------------------------------------------------
// Resident memory, in a child process.

// BenchmarkRSS runs internal/benchcmd in a child process: it opens the store with default
// options, submits 10,000 tasks (64 callers), claims and finishes them (16 workers, limit
// 16), reads 100,000 tasks by id and the whole log once, and reports VmRSS, VmHWM (peak)
// from /proc/self/status and the Go heap in use. Beside the 1M store, a 1k one.
func BenchmarkRSS(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "benchcmd")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/worklog/worklog/internal/benchcmd")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build benchcmd: %v\n%s", err, out)
	}
	b.Run("settled=1k", func(b *testing.B) {
		dir := filepath.Join(b.TempDir(), "store")
		if _, err := buildSettled(dir, 1000); err != nil {
			b.Fatal(err)
		}
		benchRSS(b, bin, dir)
	})
	b.Run("settled="+countName(settledCount()), func(b *testing.B) { benchRSS(b, bin, settledStore(b)) })
}

func benchRSS(b *testing.B, bin, dir string) {
	var last map[string]float64
	for range b.N {
		out, err := exec.Command(bin, "rss", "-dir", dir).CombinedOutput()
		if err != nil {
			b.Fatalf("benchcmd rss: %v\n%s", err, out)
		}
		last = parseKV(string(out))
	}
	for _, k := range []string{"rss_mb", "hwm_mb", "goheap_mb", "gosys_mb"} {
		v, ok := last[k]
		if !ok {
			b.Fatalf("benchcmd rss printed no %s", k)
		}
		b.ReportMetric(v, strings.Replace(k, "_mb", "-MB", 1))
	}
}

// parseKV reads the last line of key=value pairs.
func parseKV(out string) map[string]float64 {
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			k, v, ok := strings.Cut(f, "=")
			if x, err := strconv.ParseFloat(v, 64); ok && err == nil {
				m[k] = x
			}
		}
	}
	return m
}

// ---------------------------------------------------------------------------------------
// The settled store.

// settledCount is the size of the big settled store: WORKLOG_BENCH_SETTLED, default 1e6.
func settledCount() int {
	if s := os.Getenv("WORKLOG_BENCH_SETTLED"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	return 1_000_000
}

func countName(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

var settledMu sync.Mutex

// settledStore returns the directory of the big settled store under WORKLOG_BENCH_DIR,
// building it on first use (and logging the build time); without WORKLOG_BENCH_DIR the
// benchmark is skipped.
func settledStore(b *testing.B) string {
	root := os.Getenv("WORKLOG_BENCH_DIR")
	if root == "" || testing.Short() {
		b.Skip("set WORKLOG_BENCH_DIR to a scratch directory (and drop -short) to run the benchmarks over " +
			"the 1,000,000-task store; it is built there once (~3 min, ~600 MB) and reused")
	}
	settledMu.Lock()
	defer settledMu.Unlock()
	n := settledCount()
	dir := filepath.Join(root, "settled-"+countName(n))
	built := filepath.Join(root, "settled-"+countName(n)+".built")
	if info, err := os.ReadFile(built); err == nil {
		b.Logf("settled store %s: %s", dir, strings.TrimSpace(string(info)))
		return dir
	}
	if err := os.RemoveAll(dir); err != nil {
		b.Fatal(err)
	}
	took, err := buildSettled(dir, n)
	if err != nil {
		b.Fatal(err)
	}
	var usage int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			usage += fi.Size()
		}
		return nil
	})
	info := fmt.Sprintf("%d settled tasks built in %.1f s (%.0f tasks/s), %d MB on disk", n, took.Seconds(),
		float64(n)/took.Seconds(), usage>>20)
	if err := os.WriteFile(built, []byte(info+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("settled store %s: %s", dir, info)
	return dir
}

// buildSettled creates a store in dir holding n settled tasks, through the API: SyncNever,
// 256 concurrent submitters, then 64 workers claiming 64 at a time and finishing each.
func buildSettled(dir string, n int) (time.Duration, error) {
	start := time.Now()
	err := withQueue(dir, &work.Options{Sync: work.SyncNever}, func(q *work.Queue) error {
		if err := submitN(q, n, 256); err != nil {
			return err
		}
		_, _, err := drain(q, 64, 64)
		return err
	})
	return time.Since(start), err
}

func withQueue(dir string, o *work.Options, fn func(q *work.Queue) error) error {
	q, err := work.Open(dir, o)
	if err != nil {
		return err
	}
	return errors.Join(fn(q), q.Close())
}

// submitN submits n benchmark tasks from the given number of concurrent callers.
func submitN(q *work.Queue, n, callers int) error {
	ctx := context.Background()
	var next atomic.Int64
	var errs errOnce
	var wg sync.WaitGroup
	for w := range callers {
		s := q.Session(fmt.Sprintf("session-%03d", w))
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := s.SubmitAt(ctx, benchRequest, time.Now()); err != nil {
					errs.set(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errs.err
}

// submitPriorities submits n tasks at priorities 0..p-1 in turn, and 64 tasks of priority
// p scheduled an hour ahead (never due during the benchmark).
func submitPriorities(q *work.Queue, n, p int) error {
	ctx := context.Background()
	s := q.Session("session-priorities")
	for i := range 64 {
		r := benchRequest
		r.Priority, r.RunAt = p, time.Now().Add(time.Hour+time.Duration(i))
		if _, err := s.SubmitAt(ctx, r, time.Now()); err != nil {
			return err
		}
	}
	for i := range n {
		r := benchRequest
		r.Priority = i % p
		if _, err := s.SubmitAt(ctx, r, time.Now()); err != nil {
			return err
		}
	}
	return nil
}

// drain claims and finishes every due task with the given workers and claim limit, and
// returns how many claim calls (the last, empty one of each worker included) and finishes
// it made.
func drain(q *work.Queue, workers, limit int) (claims, finishes int, err error) {
	ctx := context.Background()
	var nclaims, nfinishes atomic.Int64
	var errs errOnce
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				ds, err := q.ClaimDueAt(ctx, time.Now(), time.Hour, limit)
				nclaims.Add(1)
				if err != nil || len(ds) == 0 {
					errs.set(err)
					return
				}
				for _, d := range ds {
					if _, err := q.FinishAt(ctx, d, work.Success(benchOutput), time.Now()); err != nil {
						errs.set(err)
						return
					}
					nfinishes.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(nclaims.Load()), int(nfinishes.Load()), errs.err
}

// ---------------------------------------------------------------------------------------
// Helpers.

// closedLoop runs b.N calls of op from callers goroutines, each calling again as soon as its
// call returns, and reports ops/s and the per-call latency p50 and p99.
func closedLoop(b *testing.B, callers int, op func(worker int) error) {
	var next atomic.Int64
	lats := make([][]time.Duration, callers)
	var errs errOnce
	var wg sync.WaitGroup
	b.ResetTimer()
	ru0 := rusage()
	start := time.Now()
	for w := range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := op(w); err != nil {
					errs.set(err)
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	ru := rusage().sub(ru0)
	b.StopTimer()
	if errs.err != nil {
		b.Fatal(errs.err)
	}
	ru.report(b, b.N)
	all := slices.Concat(lats...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(percentile(all, 0.50).Nanoseconds())/1e6, "p50-ms")
	b.ReportMetric(float64(percentile(all, 0.99).Nanoseconds())/1e6, "p99-ms")
}

// usage is the process's CPU time (user+system) and minor page faults: with other programs on
// the machine, CPU per op is steadier than wall time, and on this VM a first-touch page fault
// costs tens of µs (docs/performance.md).
type usage struct {
	cpu    time.Duration
	faults int64
}

func rusage() usage {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return usage{}
	}
	return usage{
		cpu:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		faults: ru.Minflt,
	}
}

func (u usage) sub(v usage) usage { return usage{u.cpu - v.cpu, u.faults - v.faults} }

func (u usage) report(b *testing.B, ops int) {
	b.ReportMetric(float64(u.cpu.Microseconds())/float64(ops), "cpu-µs/op")
	b.ReportMetric(float64(u.faults)/float64(ops), "faults/op")
}

func reportPerSync(b *testing.B, calls int, syncs int64) {
	if syncs > 0 {
		b.ReportMetric(float64(calls)/float64(syncs), "calls/walsync")
	}
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

type errOnce struct {
	mu  sync.Mutex
	err error
}

func (e *errOnce) set(err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err == nil {
		e.err = err
	}
}

// syncCountFS is vfs.Default with a count of syncs of WAL files (*.log); everything else is
// passed through unchanged.
type syncCountFS struct {
	vfs.FS
	walSyncs     atomic.Int64
	walBytes     atomic.Int64 // bytes written to WAL files
	walSyncNanos atomic.Int64 // time spent in WAL syncs, from the call to the goroutine's return
}

// walStats is a reading of the counters; since subtracts an earlier reading.
type walStats struct{ syncs, bytes, syncNanos int64 }

func (fs *syncCountFS) stats() walStats {
	return walStats{fs.walSyncs.Load(), fs.walBytes.Load(), fs.walSyncNanos.Load()}
}

func (w walStats) since(w0 walStats) walStats {
	return walStats{w.syncs - w0.syncs, w.bytes - w0.bytes, w.syncNanos - w0.syncNanos}
}

// report adds calls/walsync, wal-B/op (WAL bytes per call) and sync-µs (mean duration of a
// WAL sync, as the syncing goroutine sees it: the fdatasync plus getting a CPU back).
func (w walStats) report(b *testing.B, calls int) {
	reportPerSync(b, calls, w.syncs)
	b.ReportMetric(float64(w.bytes)/float64(calls), "wal-B/op")
	if w.syncs > 0 {
		b.ReportMetric(float64(w.syncNanos)/float64(w.syncs)/1e3, "sync-µs")
	}
}

func (fs *syncCountFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &syncCountFile{File: f, fs: fs}, nil
}

func (fs *syncCountFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *syncCountFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

func (fs *syncCountFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

type syncCountFile struct {
	vfs.File
	fs *syncCountFS
}

func (f *syncCountFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	f.fs.walBytes.Add(int64(n))
	return n, err
}

func (f *syncCountFile) timed(sync func() error) error {
	f.fs.walSyncs.Add(1)
	t0 := time.Now()
	err := sync()
	f.fs.walSyncNanos.Add(int64(time.Since(t0)))
	return err
}

func (f *syncCountFile) Sync() error     { return f.timed(f.File.Sync) }
func (f *syncCountFile) SyncData() error { return f.timed(f.File.SyncData) }

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
