package postgres

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

func (kr *keyReads) pendingLen() int {
	kr.mu.Lock()
	defer kr.mu.Unlock()
	return len(kr.pending)
}

// TestConcurrentKeyReadsShareOneStatement (issue 24, W3 from 16 goroutines): read-first's
// key reads that come while keyRoundsMax are on the wire go together in the next statement.
// 16 concurrent keyed submits, 8 of them repeats and 8 new keys, cost keyRoundsMax + 1
// statements (the first keyRoundsMax alone, each held on the wire, then the rest together),
// each caller gets its own key's answer, and the new keys are stored once each. Before, each
// read was a statement of its own: 16.
func TestConcurrentKeyReadsShareOneStatement(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	readFirstAlways(e) // as after a repeat (the writer's cache would answer the repeats)
	ctx := context.Background()
	s := q.Session("s")
	existing := map[string]string{}
	for i := range 8 {
		task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(fmt.Sprint(i)), IdempotencyKey: fmt.Sprint("old-", i)})
		if err != nil {
			t.Fatal(err)
		}
		existing[fmt.Sprint("old-", i)] = task.ID
	}
	held := keyRoundsMax
	var mu sync.Mutex
	var rounds []int
	entered, release := make(chan struct{}, held), make(chan struct{})
	tracing(e).keyRead = func(_ context.Context, n int) {
		mu.Lock()
		rounds = append(rounds, n)
		hold := len(rounds) <= held
		mu.Unlock()
		if hold {
			entered <- struct{}{}
			<-release
		}
	}
	type answer struct {
		key string
		id  string
		err error
	}
	answers := make(chan answer, 16)
	submit := func(key string, i int) {
		task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(fmt.Sprint(i)), IdempotencyKey: key})
		answers <- answer{key, task.ID, err}
	}
	key := func(i int) string {
		if i >= 8 {
			return fmt.Sprint("new-", i)
		}
		return fmt.Sprint("old-", i)
	}
	for i := range held { // one at a time: each a round of one, on the wire
		go submit(key(i), i)
		<-entered
	}
	for i := held; i < 16; i++ {
		go submit(key(i), i)
	}
	waitFor(t, 10*time.Second, fmt.Sprint(16-held, " key reads pending"), func() bool { return e.keyReads[0].pendingLen() == 16-held })
	close(release)
	ids := map[string]bool{}
	for range 16 {
		var a answer
		select {
		case a = <-answers:
		case <-time.After(10 * time.Second):
			t.Fatal("a keyed submit did not return in 10 s: its key read was left pending")
		}
		switch {
		case a.err != nil:
			t.Errorf("submit %s: %v", a.key, a.err)
		case existing[a.key] != "" && a.id != existing[a.key]:
			t.Errorf("repeat of %s answered task %s, want %s", a.key, a.id, existing[a.key])
		case existing[a.key] == "" && (ids[a.id] || a.id == ""):
			t.Errorf("new key %s answered task %q, already answered", a.key, a.id)
		}
		ids[a.id] = true
	}
	mu.Lock()
	want := append(slices.Repeat([]int{1}, held), 16-held)
	if !slices.Equal(rounds, want) {
		t.Errorf("key read statements of 16 concurrent submits: %v reads each, want %v", rounds, want)
	}
	mu.Unlock()
	tracing(e).keyRead = nil
	waitFor(t, 10*time.Second, "no round on the wire", func() bool {
		kr := &e.keyReads[0]
		kr.mu.Lock()
		defer kr.mu.Unlock()
		return kr.running == 0
	})
	if n := logLen(t, q); n != 16 {
		t.Errorf("the log has %d events, want 16 (8 submits before, 8 new keys)", n)
	}
	mustVerify(t, q)
}

// TestKeyReadCallerLeaves: a caller whose context ends while its round is on the wire returns
// at once; the round, whose callers have all left, is cancelled; and the next read is served
// (no round is left holding the others).
func TestKeyReadCallerLeaves(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	readFirstAlways(e)
	ctx := context.Background()
	s := q.Session("s")
	task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "a"})
	if err != nil {
		t.Fatal(err)
	}
	var cancelled atomic.Bool
	tracing(e).keyRead = func(rctx context.Context, _ int) {
		select {
		case <-rctx.Done():
			cancelled.Store(true)
		case <-time.After(10 * time.Second):
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.Submit(short, work.TaskRequest{Kind: "k", IdempotencyKey: "a"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("repeat whose caller left: %v, want its context's error", err)
	}
	waitFor(t, 10*time.Second, "the round to end", func() bool {
		kr := &e.keyReads[0]
		kr.mu.Lock()
		defer kr.mu.Unlock()
		return kr.running == 0
	})
	if !cancelled.Load() {
		t.Error("the round of a caller that left was not cancelled")
	}
	tracing(e).keyRead = nil
	got, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "a"})
	if err != nil || got.ID != task.ID {
		t.Fatalf("repeat after: %+v, %v; want task %s", got, err, task.ID)
	}
}

// BenchmarkDuplicateSubmit is W3 on postgres.Open: a repeat of a stored key from 1 and 16
// goroutines, and the statements read-first sent per repeat (reads/dup, a count: 1 before
// the reads were coalesced). pgtest's server (fsync off; a repeat writes nothing anyway).
func BenchmarkDuplicateSubmit(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			e, q := openEngine(b, pgtest.Schema(b), nil)
			s := q.Session("bench")
			ctx := context.Background()
			// As many keys as bench/'s W1 stores: with a small table the server reads
			// task_keys whole (a hash join over a sequential scan: 1,000 keys cost a round
			// 140 µs, against 50 µs through the index at 20,000).
			const keys = 20000
			reqs := make([]work.TaskRequest, 0, work.MaxSubmitMany)
			for i := range keys {
				reqs = append(reqs, work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprint(i)})
				if len(reqs) == cap(reqs) || i == keys-1 {
					if _, err := s.SubmitMany(ctx, reqs); err != nil {
						b.Fatal(err)
					}
					reqs = reqs[:0]
				}
			}
			if _, err := e.pool.Exec(ctx, "ANALYZE"); err != nil {
				b.Fatal(err)
			}
			var rounds atomic.Int64
			tracing(e).keyRead = func(context.Context, int) { rounds.Add(1) }
			var next atomic.Int64
			dup := func() error {
				_, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprint(next.Add(1) % keys)})
				return err
			}
			b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			if callers == 1 {
				for i := 0; i < b.N; i++ {
					if err := dup(); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := dup(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(rounds.Load())/float64(b.N), "reads/dup")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "dups/s")
		})
	}
}
