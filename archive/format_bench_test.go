package archive_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// The archive's format was chosen by BenchmarkArchiveFormat (docs/performance.md,
// "Archive format"): a realistic history's events written and read back as
//   - frames of wire bytes, uncompressed (WriterOptions.NoCompression),
//   - frames of wire bytes, zstd per frame (the default),
//   - JSON lines of the decoded events (the shape of replay's export), zstd per 1 MiB,
// reporting bytes per event and the time to write and to read back (decoded) per event.

type wireEvent struct {
	seq  uint64
	wire []byte
}

// history runs a day of a small service through an in-memory queue: 40 sessions, tasks of
// four kinds with JSON inputs of 60-400 bytes, a third with completion wakes, outputs on
// success, retries after failures, direct wakes with payloads; every event's wire bytes.
func history(b testing.TB, tasks int) []wireEvent {
	q := work.NewInMemory()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	kinds := []string{"send-email", "charge-card", "render-report", "sync-inventory"}
	for i := range tasks {
		now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		s := q.Session(fmt.Sprintf("session-%04d", rng.IntN(40)))
		input := fmt.Sprintf(`{"order":%d,"customer":"cus_%08x","items":[%s],"note":%q}`, 4000+i, rng.Uint32(),
			bytes.Repeat([]byte(`{"sku":"sku-981","qty":2},`), 1+rng.IntN(8))[:0], fmt.Sprint(bytes.Repeat([]byte("x"), rng.IntN(200))))
		r := work.TaskRequest{Kind: kinds[rng.IntN(4)], Input: json.RawMessage(input), IdempotencyKey: fmt.Sprint("k-", i)}
		if i%3 == 0 {
			r.Wake = work.WakeOnCompletion
		}
		if _, err := s.SubmitAt(ctx, r, now); err != nil {
			b.Fatal(err)
		}
		ds, err := q.ClaimDueAt(ctx, now, time.Minute, 4)
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range ds {
			o := work.SuccessWithSummary("done", json.RawMessage(fmt.Sprintf(`{"id":"res_%08x","ms":%d}`, rng.Uint32(), rng.IntN(900))))
			if rng.IntN(10) == 0 {
				o = work.Failure("upstream 503: try again later")
			}
			if _, err := q.FinishAt(ctx, d, o, now.Add(time.Second)); err != nil {
				b.Fatal(err)
			}
		}
		if i%5 == 0 {
			if _, err := s.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"from":"ana","text":"thanks!"}`)}, now); err != nil {
				b.Fatal(err)
			}
		}
		ws, err := q.ClaimWakesAt(ctx, now.Add(2*time.Second), time.Minute, 8)
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range ws {
			if err := q.AckWakeAt(ctx, w, now.Add(3*time.Second)); err != nil {
				b.Fatal(err)
			}
		}
	}
	var out []wireEvent
	if err := q.ReadLog(ctx, 0, func(ev events.Event) error {
		w, err := events.Encode(ev)
		out = append(out, wireEvent{ev.Head().Seq, w})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return out
}

func BenchmarkArchiveFormat(b *testing.B) {
	evs := history(b, 20000)
	var wireBytes int
	for _, e := range evs {
		wireBytes += len(e.wire)
	}
	b.Logf("%d events, %.0f wire bytes per event", len(evs), float64(wireBytes)/float64(len(evs)))
	const group = 1300 // about one prune group of 256 subjects
	for _, c := range []struct {
		name   string
		nocomp bool
	}{{"frames-raw", true}, {"frames-zstd", false}} {
		b.Run(c.name, func(b *testing.B) {
			var size int64
			var wr, rd time.Duration
			for range b.N {
				dir := b.TempDir()
				t0 := time.Now()
				w, err := archive.OpenWriter(dir, &archive.WriterOptions{NoCompression: c.nocomp})
				if err != nil {
					b.Fatal(err)
				}
				for i, e := range evs {
					if err := w.Add(e.seq, e.wire); err != nil {
						b.Fatal(err)
					}
					if i%group == group-1 {
						if err := w.Commit(); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := errorsJoin(w.Commit(), w.Close()); err != nil {
					b.Fatal(err)
				}
				wr += time.Since(t0)
				t0 = time.Now()
				r, err := archive.Open(dir)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				if err := r.ReadEvents(context.Background(), 0, 0, func(events.Event) error { n++; return nil }); err != nil || n != len(evs) {
					b.Fatal(n, err)
				}
				rd += time.Since(t0)
				size = r.Size()
			}
			report(b, len(evs), size, wr, rd)
		})
	}
	b.Run("jsonl-zstd", func(b *testing.B) {
		var size int64
		var wr, rd time.Duration
		for range b.N {
			// Write: decode each event (the store holds wire bytes), marshal a flat line
			// with its type, compress each group as one zstd frame, append it to a file and
			// fsync it, as the frames do.
			f, err := os.Create(filepath.Join(b.TempDir(), "archive.jsonl.zst"))
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			enc, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
			var out, chunk []byte
			flush := func() {
				out = enc.EncodeAll(chunk, out[:0])
				chunk = chunk[:0]
				if _, err := f.Write(out); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				size += int64(len(out))
			}
			size = 0
			for i, e := range evs {
				ev, err := events.Decode(e.wire, e.seq)
				if err != nil {
					b.Fatal(err)
				}
				line, err := json.Marshal(ev)
				if err != nil {
					b.Fatal(err)
				}
				chunk = append(append(append(chunk, `{"event":"`+ev.Type().String()+`",`...), line[1:]...), '\n')
				if i%group == group-1 {
					flush()
				}
			}
			flush()
			f.Close()
			wr += time.Since(t0)
			// Read: decompress and unmarshal each line into its event type.
			t0 = time.Now()
			data, err := os.ReadFile(f.Name())
			if err != nil {
				b.Fatal(err)
			}
			dec, _ := zstd.NewReader(bytes.NewReader(data), zstd.WithDecoderConcurrency(1))
			sc := bufio.NewScanner(dec)
			sc.Buffer(nil, 1<<26)
			n := 0
			for sc.Scan() {
				var head struct {
					Type string `json:"event"`
				}
				if err := json.Unmarshal(sc.Bytes(), &head); err != nil {
					b.Fatal(err)
				}
				ev := newEvent(head.Type)
				if err := json.Unmarshal(sc.Bytes(), ev); err != nil {
					b.Fatal(err)
				}
				n++
			}
			if err := sc.Err(); err != nil && err != io.EOF || n != len(evs) {
				b.Fatal(n, err)
			}
			dec.Close()
			rd += time.Since(t0)
		}
		report(b, len(evs), size, wr, rd)
	})
}

func newEvent(name string) any {
	for _, e := range []events.Event{&events.TaskSubmitted{}, &events.TaskClaimed{}, &events.TaskSettled{},
		&events.TaskCancelRequested{}, &events.WakeRecorded{}, &events.WakeClaimed{}, &events.WakeAcked{},
		&events.TaskSettleRejected{}, &events.WakeAckRejected{}, &events.TaskExtended{}, &events.TaskReleased{}} {
		if e.Type().String() == name {
			return e
		}
	}
	return &map[string]any{}
}

func report(b *testing.B, n int, size int64, wr, rd time.Duration) {
	b.ReportMetric(float64(size)/float64(n), "B/event")
	b.ReportMetric(float64(wr.Nanoseconds())/float64(b.N*n), "write-ns/event")
	b.ReportMetric(float64(rd.Nanoseconds())/float64(b.N*n), "read-ns/event")
}

func errorsJoin(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
