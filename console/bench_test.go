package console_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/console"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// The console's speed (issue 21 §5) on a generated Pebble store of 1M events: 200k tasks in
// 2k sessions, each submitted, claimed, heartbeaten twice and settled (one in 20 failed).
// Server time of each page and JSON answer, now and at a past seq. Building the store takes
// a while; WORKLOG_CONSOLE_BENCH_DIR keeps it (and reuses it), WORKLOG_CONSOLE_BENCH_TASKS
// sizes it (default 200000). docs/performance.md has the figures.
//
//	go test ./console -run '^$' -bench Console -benchtime 20x

var bench struct {
	once sync.Once
	dir  string
	n    int
	err  error
}

const benchSessions = 2000

func benchStore(b *testing.B) (string, int) {
	bench.once.Do(func() {
		bench.n = 200_000
		if s := os.Getenv("WORKLOG_CONSOLE_BENCH_TASKS"); s != "" {
			bench.n, bench.err = strconv.Atoi(s)
			if bench.err != nil {
				return
			}
		}
		bench.dir = os.Getenv("WORKLOG_CONSOLE_BENCH_DIR")
		if bench.dir == "" {
			d, err := os.MkdirTemp("", "worklog-console-bench-")
			if err != nil {
				bench.err = err
				return
			}
			bench.dir = filepath.Join(d, "store")
		}
		if _, err := os.Stat(filepath.Join(bench.dir, "WORKLOG")); err == nil {
			return
		}
		bench.err = buildBenchStore(bench.dir, bench.n)
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return bench.dir, bench.n
}

// buildBenchStore writes the events straight into the log (pebblelog.AppendLog, replay
// import's path: each event folded as a command's), in batches.
func buildBenchStore(dir string, tasks int) error {
	st, err := pebblelog.Open(dir, nil)
	if err != nil {
		return err
	}
	base := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC).UnixNano()
	var seq uint64
	var batch []events.Event
	flush := func() error {
		err := st.AppendLog(context.Background(), batch, nil)
		batch = batch[:0]
		return err
	}
	h := func(session string, at int64) events.Header {
		seq++
		return events.Header{Seq: seq, SessionID: session, At: at}
	}
	for i := range tasks {
		s := fmt.Sprintf("sess-%04d", i%benchSessions)
		id := fmt.Sprintf("task_%032x", i+1)
		tok := fmt.Sprintf("tok-%d", i)
		at := base + int64(i)*int64(10*time.Millisecond)
		batch = append(batch,
			&events.TaskSubmitted{Header: h(s, at), TaskID: id, Kind: fmt.Sprintf("kind-%d", i%7), Input: []byte(`{"n":` + strconv.Itoa(i) + `}`)},
			&events.TaskClaimed{Header: h(s, at+1e6), TaskID: id, Attempt: 1, LeaseToken: tok, LeaseExpiresAt: at + 30e9, Worker: "worker-1"},
			&events.TaskExtended{Header: h(s, at+2e6), TaskID: id, Attempt: 1, LeaseExpiresAt: at + 40e9},
			&events.TaskExtended{Header: h(s, at+3e6), TaskID: id, Attempt: 1, LeaseExpiresAt: at + 50e9},
		)
		o := events.Outcome{State: events.StateSucceeded, Output: []byte(`{"ok":true}`)}
		if i%20 == 0 {
			o = events.Outcome{State: events.StateFailed, Error: "upstream said no"}
		}
		batch = append(batch, &events.TaskSettled{Header: h(s, at+4e6), TaskID: id, Attempt: 1, LeaseToken: tok, Outcome: o})
		if len(batch) >= 20_000 {
			if err := flush(); err != nil {
				st.Close()
				return err
			}
		}
	}
	if len(batch) > 0 {
		if err := flush(); err != nil {
			st.Close()
			return err
		}
	}
	return st.Close()
}

func BenchmarkConsole(b *testing.B) {
	dir, n := benchStore(b)
	q, err := work.Open(dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	start := time.Now()
	h, err := console.New(q, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("console.New read and folded %d events in %v (once, at start)", n*5, time.Since(start).Round(time.Millisecond))
	last := uint64(n * 5)
	mid := strconv.FormatUint(last/2, 10)
	task := fmt.Sprintf("task_%032x", n/2+1) // submitted near mid: alive at last/2 + a few
	early := fmt.Sprintf("task_%032x", n/4+1)
	for _, c := range []struct{ name, path string }{
		{"overview", "/"},
		{"overview_past", "/?at_seq=" + mid},
		{"sessions", "/sessions"},
		{"sessions_past", "/sessions?at_seq=" + mid},
		{"sessions_prefix", "/sessions?prefix=sess-19"},
		{"session", "/sessions/sess-0042"},
		{"session_past", "/sessions/sess-0042?at_seq=" + mid},
		{"task", "/tasks/" + task},
		{"task_past", "/tasks/" + early + "?at_seq=" + strconv.FormatUint(uint64(n/4)*5+2, 10)},
		{"api_task_past", "/api/tasks/" + early + "?at_seq=" + strconv.FormatUint(uint64(n/4)*5+2, 10)},
		{"api_stats", "/api/stats"},
		{"log", "/log"},
		{"log_type_rare", "/log?type=task_settle_rejected"},
		{"log_session", "/log?session=sess-0042"},
		{"stats", "/stats"},
		{"stats_past", "/stats?at_seq=" + mid},
		{"tasks", "/tasks"},
		{"tasks_failed", "/tasks?state=failed"},
		{"tasks_failed_past", "/tasks?state=failed&at_seq=" + mid},
		{"tasks_kind_session", "/tasks?kind=kind-3&session=sess-0042"},
		{"api_tasks_q", "/api/tasks?q=" + task},
		{"api_tasks_deep_page", "/api/tasks?before=" + mid},
		{"kinds", "/kinds"},
		{"kinds_past", "/kinds?at_seq=" + mid},
		{"schedules", "/schedules"},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, c.path, nil)
			req.Host = "localhost" // not httptest's example.com, which the console does not answer to
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", c.path, w.Code, w.Body.String())
				}
			}
		})
	}
}

// BenchmarkLiveTail is the live tail's latency (issue 21 §5: commit → browser ≤ 200 ms p99):
// from a submit's call to its event's line arriving at an SSE client of /log/stream, over
// real HTTP, on a durable Pebble queue (fsync per call) and in memory. It reports p50 and
// p99 of the iterations.
func BenchmarkLiveTail(b *testing.B) {
	for _, store := range []string{"memory", "pebble"} {
		b.Run("store="+store, func(b *testing.B) {
			q := work.NewInMemory()
			if store == "pebble" {
				var err error
				if q, err = work.Open(b.TempDir(), nil); err != nil {
					b.Fatal(err)
				}
			}
			defer q.Close()
			h, err := console.New(q, nil)
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer func() { srv.CloseClientConnections(); srv.Close() }()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/log/stream?from=1", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Body.Close()
			lines := make(chan string, 1024)
			go func() {
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if l := sc.Text(); strings.HasPrefix(l, "data: ") {
						lines <- l
					}
				}
				close(lines)
			}()
			s := q.Session("tail")
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				tk, err := s.Submit(context.Background(), work.TaskRequest{Kind: "k"})
				if err != nil {
					b.Fatal(err)
				}
				for l := range lines {
					if strings.Contains(l, tk.ID) {
						break
					}
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}

// BenchmarkConsoleCost is what an open console costs the queue (issue 21 §5: ≤ 5% of W2's
// throughput): workers submit, claim and finish on a durable Pebble queue, in parallel, with
// no console (console=off) and with one open on the overview, refreshed every 100 ms, and a
// live tail streaming every event (console=on). Compare the two tasks/s figures.
func BenchmarkConsoleCost(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("console=%v", map[bool]string{false: "off", true: "on"}[on]), func(b *testing.B) {
			q, err := work.Open(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			if on {
				h, err := console.New(q, nil)
				if err != nil {
					b.Fatal(err)
				}
				srv := httptest.NewServer(h)
				defer func() { cancel(); wg.Wait(); srv.CloseClientConnections(); srv.Close() }()
				wg.Add(2)
				go func() { // the live tail
					defer wg.Done()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/log/stream?from=1", nil)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return
					}
					defer resp.Body.Close()
					sc := bufio.NewScanner(resp.Body)
					for sc.Scan() {
					}
				}()
				go func() { // the overview, refreshed
					defer wg.Done()
					tick := time.NewTicker(100 * time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-ctx.Done():
							return
						case <-tick.C:
						}
						req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/", nil)
						if resp, err := http.DefaultClient.Do(req); err == nil {
							resp.Body.Close()
						}
					}
				}()
			}
			start := time.Now()
			b.SetParallelism(8) // 16 workers on this 2-core machine, as W2
			b.RunParallel(func(pb *testing.PB) {
				s := q.Session("w2")
				for pb.Next() {
					if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
						b.Error(err)
						return
					}
					ds, err := q.ClaimKinds(ctx, []string{"k"}, time.Minute, 1)
					if err != nil {
						b.Error(err)
						return
					}
					for _, d := range ds {
						if _, err := q.Finish(ctx, d, work.Success(nil)); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tasks/s")
		})
	}
}
