package work_test

import (
	"context"
	"encoding/binary"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/inspect"
	"github.com/worklog/worklog/work"
)

// The inspection endpoint of a durable queue (Options.NoInspect; internal/inspect): these
// tests speak its protocol by hand, as a hostile or broken client of the same user would.
// cmd/replay's inspect_test.go reads a held store through it with the real replay binary.

// inspectReply is the part of the endpoint's reply frames these tests read.
type inspectReply struct {
	Done   bool
	More   bool
	Err    *struct{ Msg, Kind string }
	U64    uint64
	OK     bool
	Events []byte // a batch of events, packed: uvarint seq, uvarint length, wire bytes
}

func openInspected(t *testing.T) (*work.Queue, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "q")
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if _, err := q.Session("s").Submit(context.Background(), work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	return q, filepath.Join(dir, "WORKLOG.sock")
}

func dialInspect(t *testing.T, sock string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sendFrame(t *testing.T, c net.Conn, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	if _, err := c.Write(append(hdr[:], b...)); err != nil {
		t.Fatal(err)
	}
}

func frame(s string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
}

// readReply reads one reply frame, within 10 s.
func readReply(c net.Conn, dec *gob.Decoder) (inspectReply, error) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var r inspectReply
	err := dec.Decode(&r)
	return r, err
}

func lastSeqOf(t *testing.T, q *work.Queue) uint64 {
	t.Helper()
	var n uint64
	if err := q.ReadLog(context.Background(), 1, func(events.Event) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestInspectRefusesWritesAndGarbage: no request writes. A request naming any operation
// that is not one of the endpoint's reads (the names of the queue's commands, the store's
// writes), at the top or inside a view, is answered with an error and changes nothing;
// garbage, an oversized frame and a frame of another protocol version are refused; the
// queue goes on.
func TestInspectRefusesWritesAndGarbage(t *testing.T) {
	q, sock := openInspected(t)
	before := lastSeqOf(t, q)
	writes := []string{"submit", "update", "append", "append_log", "prune", "checkpoint", "cancel", "retry",
		"close", "claim", "finish", "set_kind_policy", "import", "compact", "put_task", "delete"}
	for _, op := range writes {
		c := dialInspect(t, sock)
		sendFrame(t, c, map[string]any{"v": 2, "op": op, "id": "task_x", "session": "s"})
		r, err := readReply(c, gob.NewDecoder(c))
		if err != nil || r.Err == nil || !strings.Contains(r.Err.Msg, "only reads") {
			t.Errorf("op %q: %+v %v, want a refusal", op, r, err)
		}
	}
	// Inside a view: the same.
	c := dialInspect(t, sock)
	dec := gob.NewDecoder(c)
	sendFrame(t, c, map[string]any{"v": 2, "op": "view"})
	if r, err := readReply(c, dec); err != nil || !r.OK {
		t.Fatalf("view: %+v %v", r, err)
	}
	sendFrame(t, c, map[string]any{"v": 2, "op": "submit"})
	if r, err := readReply(c, dec); err != nil || r.Err == nil || !strings.Contains(r.Err.Msg, "only reads") {
		t.Errorf("submit in a view: %+v %v", r, err)
	}
	// An index that does not exist (it indexed past projection.Indexes: a panic in the
	// holder) is refused.
	c = dialInspect(t, sock)
	dec = gob.NewDecoder(c)
	sendFrame(t, c, map[string]any{"v": 2, "op": "view"})
	if r, err := readReply(c, dec); err != nil || !r.OK {
		t.Fatalf("view: %+v %v", r, err)
	}
	sendFrame(t, c, map[string]any{"v": 2, "op": "scan_index", "index": 200})
	if r, err := readReply(c, dec); err != nil || r.Err == nil || !strings.Contains(r.Err.Msg, "no index 200") {
		t.Errorf("scan_index 200: %+v %v", r, err)
	}

	garbage := [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), // a frame of 1.2 GB by its header
		{0, 0, 0, 5, '{', 'x', 'y', 'z', '}'},       // not JSON
		{0, 0, 0, 0},                                // empty
		frame(`{"op":"x"}`),                         // no version
		frame(`{"v":99,"op":"last_seq"}`),           // another version
		frame(`{"v":1,"op":"last_seq"}`),            // version 1: events were a gob value each
	}
	for i, g := range garbage {
		c := dialInspect(t, sock)
		if _, err := c.Write(g); err != nil {
			t.Fatal(err)
		}
		r, err := readReply(c, gob.NewDecoder(c))
		if err != nil || r.Err == nil || !strings.Contains(r.Err.Msg, "bad request") {
			t.Errorf("garbage %d: %+v %v, want a refusal", i, r, err)
		}
	}
	if after := lastSeqOf(t, q); after != before {
		t.Errorf("the log went from seq %d to %d through the endpoint", before, after)
	}
	// The endpoint still answers, and the queue still works.
	c = dialInspect(t, sock)
	sendFrame(t, c, map[string]any{"v": 2, "op": "last_seq"})
	if r, err := readReply(c, gob.NewDecoder(c)); err != nil || r.U64 != before {
		t.Errorf("last_seq after the garbage: %+v %v", r, err)
	}
	if _, err := q.Session("s").Submit(context.Background(), work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
}

// TestInspectCloseNotHeldUp: clients that hang (one sends nothing, one holds a view open and
// goes quiet, one follows) do not hold Close up: Close closes their connections and returns
// within a bound far below the endpoint's own timeouts (a quiet view is dropped after 30 s,
// and holds the store's snapshot meanwhile).
func TestInspectCloseNotHeldUp(t *testing.T) {
	q, sock := openInspected(t)
	dialInspect(t, sock) // sends nothing
	v := dialInspect(t, sock)
	vdec := gob.NewDecoder(v)
	sendFrame(t, v, map[string]any{"v": 2, "op": "view"})
	if r, err := readReply(v, vdec); err != nil || !r.OK {
		t.Fatalf("view: %+v %v", r, err)
	}
	f := dialInspect(t, sock)
	sendFrame(t, f, map[string]any{"v": 2, "op": "follow", "from": 1})
	if r, err := readReply(f, gob.NewDecoder(f)); err != nil || r.Err != nil {
		t.Fatalf("follow: %+v %v", r, err)
	}
	start := time.Now()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v with hanging inspectors", d)
	}
	// The view's connection was closed under it.
	if _, err := readReply(v, vdec); err == nil {
		t.Error("the view's connection is still open after Close")
	}
}

// TestInspectClientLimit: at most 16 clients are served at once; the next is told so and
// dropped, and a slot frees when a client goes.
func TestInspectClientLimit(t *testing.T) {
	_, sock := openInspected(t)
	var held []net.Conn
	for range 16 {
		held = append(held, dialInspect(t, sock))
	}
	time.Sleep(100 * time.Millisecond) // let the server take them
	c := dialInspect(t, sock)
	r, err := readReply(c, gob.NewDecoder(c))
	if err != nil || r.Err == nil || !strings.Contains(r.Err.Msg, "16 clients at once") {
		t.Fatalf("the 17th client: %+v %v", r, err)
	}
	held[0].Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c := dialInspect(t, sock)
		sendFrame(t, c, map[string]any{"v": 2, "op": "last_seq"})
		r, err := readReply(c, gob.NewDecoder(c))
		if err == nil && r.Err == nil && r.U64 > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no slot after a client left: %+v %v", r, err)
		}
	}
}

// TestNoInspect: Options.NoInspect serves nothing.
func TestNoInspect(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "q")
	q, err := work.Open(dir, &work.Options{NoInspect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := net.Dial("unix", filepath.Join(dir, "WORKLOG.sock")); err == nil {
		t.Error("an endpoint with NoInspect")
	}
}

// TestInspectFollowManySmallAdvances: a follow through the endpoint while submits run, from
// several callers and with pauses (advances faster and slower than the endpoint's read
// interval), delivers every event once, in order, as the queue's own log has it, and the
// client's flush comes after the last of them.
func TestInspectFollowManySmallAdvances(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "q")
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := inspect.Dial(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seqs []uint64
	var flushed uint64 // how many events had been delivered at the last flush
	followErr := make(chan error, 1)
	go func() {
		followErr <- c.FollowFlushing(ctx, 1, func(ev events.Event) error {
			mu.Lock()
			seqs = append(seqs, ev.Head().Seq)
			mu.Unlock()
			return nil
		}, func() error {
			mu.Lock()
			flushed = uint64(len(seqs))
			mu.Unlock()
			return nil
		})
	}()
	const callers, each = 4, 150
	var wg sync.WaitGroup
	for w := range callers {
		s := q.Session(fmt.Sprintf("s%d", w))
		wg.Go(func() {
			for i := range each {
				if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
					t.Error(err)
					return
				}
				if i%10 == w {
					time.Sleep(time.Duration(w*7) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	want := lastSeqOf(t, q)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n, f := uint64(len(seqs)), flushed
		mu.Unlock()
		if n >= want && f == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower has %d events (%d flushed), the log %d", n, f, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // an event past the head would come now
	cancel()
	if err := <-followErr; !errors.Is(err, context.Canceled) {
		t.Errorf("follow ended with %v, want context.Canceled", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if uint64(len(seqs)) != want {
		t.Fatalf("the follower has %d events, the log %d", len(seqs), want)
	}
	for i, seq := range seqs {
		if seq != uint64(i+1) {
			t.Fatalf("event %d of the follow has seq %d", i, seq)
		}
	}
}

// TestInspectFollowStalledFollower: a follower that stops reading costs the queue a bounded
// amount: its submits go on, each frame the endpoint sends holds at most about 1 MiB of
// events (however much became durable since the last read), and once it reads again it gets
// every event exactly once, in order, across frames. Then, with the endpoint blocked writing
// to it again, Close returns without waiting for that write (no call is left running).
func TestInspectFollowStalledFollower(t *testing.T) {
	var logs strings.Builder
	var logMu sync.Mutex
	dir := filepath.Join(t.TempDir(), "q")
	q, err := work.Open(dir, &work.Options{Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	input, _ := json.Marshal(strings.Repeat("x", 60<<10))
	submit := func(n int) {
		t.Helper()
		s := q.Session("big")
		for range n {
			if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: input}); err != nil {
				t.Fatal(err)
			}
		}
	}
	f := dialInspect(t, filepath.Join(dir, "WORKLOG.sock"))
	sendFrame(t, f, map[string]any{"v": 2, "op": "follow", "from": 1})
	submit(60) // ~3.6 MiB, more than the socket holds: the endpoint blocks writing to f
	want := lastSeqOf(t, q)

	dec := gob.NewDecoder(f)
	var next uint64 = 1
	frames := 0
	for next <= want {
		r, err := readReply(f, dec)
		if err != nil || r.Err != nil {
			t.Fatalf("follow, after seq %d: %+v %v", next-1, r, err)
		}
		if len(r.Events) > 1<<20+len(input)+64 {
			t.Fatalf("a frame of %d bytes of events (the bound is 1 MiB and an event)", len(r.Events))
		}
		frames++
		for b := r.Events; len(b) > 0; {
			seq, n := binary.Uvarint(b)
			size, m := binary.Uvarint(b[n:])
			if n <= 0 || m <= 0 || uint64(len(b)-n-m) < size {
				t.Fatalf("a garbled batch after seq %d", next-1)
			}
			if seq != next {
				t.Fatalf("the follow sent seq %d, want %d (none skipped, none twice)", seq, next)
			}
			if _, err := events.Decode(b[n+m:n+m+int(size)], seq); err != nil {
				t.Fatal(err)
			}
			next++
			b = b[n+m+int(size):]
		}
	}
	if frames < 4 {
		t.Errorf("%d frames for %d events of 60 KiB: frames are not bounded", frames, want)
	}

	submit(60) // stalled again: the endpoint blocks in a write to f
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v with a follower that does not read", d)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), "still running at Close") {
		t.Errorf("Close left the stalled follow running: %s", logs.String())
	}
}

// lockedWriter is a log destination that goroutines share.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
