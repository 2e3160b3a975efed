package inspect

import (
	"bufio"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/projection"
)

// Store is what the endpoint serves: a store's read-only source, a consistent snapshot for
// a view, and the durable head that a follow reads up to (*pebblelog.Store).
type Store interface {
	source.Source
	ViewSnapshot(fn func(projection.Reader) error) error
	Durable() (seq uint64, grown <-chan struct{}, err error)
}

// The bounds that keep a client from costing the queue anything: a client that sends
// nothing, or stops reading, is disconnected; at most MaxClients are served at once.
const (
	MaxClients     = 16
	RequestTimeout = 5 * time.Second  // to send the request (and, in a view, each next call: viewIdle)
	WriteTimeout   = 10 * time.Second // for each reply frame to be taken
	viewIdle       = 30 * time.Second
	maxViewTime    = 5 * time.Minute
	CloseTimeout   = time.Second // how long Close waits for the calls in flight to end
	maxBatchBytes  = 1 << 20
)

// Server is a running endpoint.
type Server struct {
	st    Store
	ln    *net.UnixListener
	addr  string
	files []string // removed by Close: the socket file and the pointer file
	log   *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{}
	verify chan struct{} // one Verify at a time: it rebuilds the projection in this process
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Serve starts the endpoint of the store in dir, which the caller holds open (its lock
// proves that no other process serves it: a socket or pointer file found there is a crashed
// process's and is removed). logger may be nil.
func Serve(dir string, st Store, logger *slog.Logger) (*Server, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cd, err := canonical(dir)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(cd, SocketName)
	pointer := filepath.Join(cd, PointerName)
	// Stale files of a crashed process: the store's lock, which the caller holds, proves it.
	if err := removeStale(sock); err != nil {
		return nil, err
	}
	if err := os.Remove(pointer); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	addr := sock
	if len(sock) > maxPathLen() {
		if addr, err = fallbackAddr(cd); err != nil {
			return nil, fmt.Errorf("no socket address for %s: %w", cd, err)
		}
		if !strings.HasPrefix(addr, "@") {
			if err := removeStale(addr); err != nil {
				return nil, err
			}
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, err
	}
	s := &Server{st: st, ln: ln, addr: addr, log: logger, sem: make(chan struct{}, MaxClients),
		verify: make(chan struct{}, 1), conns: map[net.Conn]struct{}{}}
	if !strings.HasPrefix(addr, "@") {
		s.files = append(s.files, addr)
		if err := os.Chmod(addr, 0o600); err != nil {
			ln.Close()
			return nil, err
		}
	}
	if addr != sock {
		if err := writePointer(pointer, addr); err != nil {
			ln.Close()
			return nil, err
		}
		s.files = append(s.files, pointer)
	}
	ln.SetUnlinkOnClose(false) // Close removes the files itself, in order
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// removeStale removes a socket file left at path; anything else there is an error (never
// removed: it is not ours).
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	return os.Remove(path)
}

func writePointer(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Addr is the endpoint's socket address (a path, or "@name" for an abstract socket).
func (s *Server) Addr() string { return s.addr }

// Close stops the endpoint: no new connection is taken, every open one (a view, a follow, a
// client that hangs) is closed, and Close waits at most CloseTimeout for the calls in
// flight to return. Closing twice is fine.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	var rerr error
	for i := len(s.files) - 1; i >= 0; i-- { // the pointer first: it must never name a missing socket
		if e := os.Remove(s.files[i]); e != nil && !errors.Is(e, fs.ErrNotExist) {
			rerr = errors.Join(rerr, e)
		}
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(CloseTimeout):
		s.log.Warn("worklog: inspection endpoint: a call was still running at Close")
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return errors.Join(err, rerr)
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Warn("worklog: inspection endpoint stopped", "err", err)
			return
		}
		select {
		case s.sem <- struct{}{}:
		default:
			c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			newWriter(c).send(reply{Done: true, Err: &wireError{Msg: fmt.Sprintf("the inspection endpoint serves %d clients at once: try again", MaxClients)}})
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			<-s.sem
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.handle(c)
	}
}

func (s *Server) handle(c *net.UnixConn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
		<-s.sem
		s.wg.Done()
	}()
	defer func() {
		// Never the host's crash: a bug that a request reaches ends that connection only.
		if r := recover(); r != nil {
			s.log.Error("worklog: inspection endpoint: internal error", "panic", r)
		}
	}()
	if !samePeer(c) {
		return
	}
	c.SetReadDeadline(time.Now().Add(RequestTimeout))
	req, err := readRequest(c)
	w := newWriter(c)
	if err != nil {
		if errors.Is(err, ErrBadRequest) {
			w.send(reply{Done: true, Err: toWire(err)})
		}
		return
	}
	c.SetReadDeadline(time.Time{})
	if err := s.serve(c, w, req); err != nil && !w.broken {
		w.send(reply{Done: true, Err: toWire(err)})
	}
}

// writer sends gob replies, each within WriteTimeout.
type writer struct {
	c      net.Conn
	bw     *bufio.Writer
	enc    *gob.Encoder
	broken bool // a send failed: the connection is done
}

func newWriter(c net.Conn) *writer {
	bw := bufio.NewWriterSize(c, 64<<10)
	return &writer{c: c, bw: bw, enc: gob.NewEncoder(bw)}
}

func (w *writer) send(r reply) error {
	if w.broken {
		return net.ErrClosed
	}
	w.c.SetWriteDeadline(time.Now().Add(WriteTimeout))
	err := w.enc.Encode(&r)
	if err == nil {
		err = w.bw.Flush()
	}
	if err != nil {
		w.broken = true
	}
	return err
}

// batch collects a stream's items and sends them a frame at a time.
type batch struct {
	w     *writer
	r     reply
	n     int
	bytes int
}

func (b *batch) add(size int) error {
	b.n++
	b.bytes += size
	if b.n < defaultBatchSize && b.bytes < maxBatchBytes {
		return nil
	}
	return b.flush()
}

// flush sends what the batch holds, if anything, and empties it; the packed events' buffer
// is kept for the next batch (gob has copied it).
func (b *batch) flush() error {
	if b.n == 0 {
		return nil
	}
	err := b.w.send(b.r)
	b.r, b.n, b.bytes = reply{Events: b.r.Events[:0]}, 0, 0
	return err
}

func (b *batch) done() error {
	b.r.Done = true
	return b.w.send(b.r)
}

// connError marks an error of the connection itself (a failed send): the call ends without
// an error reply.
type connError struct{ error }

func (s *Server) serve(c *net.UnixConn, w *writer, req request) error {
	st := s.st
	ctx := s.ctx
	if req.Op != opView {
		// The client sends nothing after its request: a read returns when it hangs up, and
		// ends the call (a Verify, a follow) with it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			var one [1]byte
			c.Read(one[:])
			cancel()
		}()
	}
	b := &batch{w: w}
	var err error
	switch req.Op {
	case opLastSeq:
		b.r.U64, err = st.LastSeq(ctx)
	case opEvent:
		b.r.Bytes, b.r.OK, err = st.RawEvent(ctx, req.Seq)
	case opRawLog:
		err = st.RawLog(ctx, req.From, req.To, func(seq uint64, raw []byte) error {
			b.r.Events = appendEvent(b.r.Events, seq, raw)
			return b.add(len(raw))
		})
	case opSessionLog:
		err = st.SessionSeqs(ctx, req.Session, req.From, func(seq uint64) error {
			raw, ok, err := st.RawEvent(ctx, seq)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("session %q: the event at seq %d is missing", req.Session, seq)
			}
			b.r.Events = appendEvent(b.r.Events, seq, raw)
			return b.add(len(raw))
		})
	case opSessions:
		err = st.Sessions(ctx, func(session string) error {
			b.r.Strs = append(b.r.Strs, session)
			return b.add(len(session))
		})
	case opSessionSeqs:
		err = st.SessionSeqs(ctx, req.Session, req.From, func(seq uint64) error {
			b.r.Seqs = append(b.r.Seqs, seq)
			return b.add(8)
		})
	case opScanTasks:
		err = st.ScanTasks(ctx, func(t *projection.Task) error {
			b.r.Tasks = append(b.r.Tasks, t)
			return b.add(len(t.Input) + len(t.Outcome.Output) + 200)
		})
	case opScanWakes:
		err = st.ScanWakes(ctx, func(x *projection.Wake) error {
			b.r.Wakes = append(b.r.Wakes, x)
			return b.add(len(x.Payload) + len(x.Outcome.Output) + 200)
		})
	case opPrunedRanges:
		b.r.Ranges, err = st.PrunedRanges(ctx)
	case opDiskUsage:
		b.r.U64, err = st.DiskUsage(ctx)
	case opVerify:
		select {
		case s.verify <- struct{}{}:
		default:
			return errors.New("a verify is already running in the process that holds the store: try again when it ends")
		}
		b.r.Strs, err = st.Verify(ctx, source.VerifyOptions{})
		<-s.verify
	case opFollow:
		err = s.follow(ctx, b, req.From)
	case opView:
		err = s.view(c, w, b)
	default:
		return fmt.Errorf("%w: no operation %q (the endpoint only reads)", ErrBadRequest, req.Op)
	}
	if err != nil {
		if w.broken {
			return connError{err}
		}
		return err
	}
	return b.done()
}

// followInterval is the least time between two reads of a follow: advances that come
// faster are read together, one iterator and one frame for many, so a follower of a busy
// queue costs it a read per interval, not one per durable advance (group commit). An
// advance after a quiet interval is read at once. Each frame costs both processes a
// wake-up, a read and a write whatever it holds, so fewer and fuller frames cost less per
// event (at 64 submitters, 50 ms rather than 10 took replay's CPU per event down a fifth);
// a person watching a terminal does not see 50 ms.
const followInterval = 50 * time.Millisecond

// follow sends every durable event from from on, as it becomes durable, until the client
// goes away or the server closes.
func (s *Server) follow(ctx context.Context, b *batch, from uint64) error {
	next := max(from, 1)
	var read time.Time // when the last read began
	for {
		if wait := followInterval - time.Since(read); !read.IsZero() && wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		read = time.Now()
		durable, grown, err := s.st.Durable()
		if err != nil {
			return err
		}
		if durable >= next {
			// One frame for all that became durable since the last read, up to
			// maxBatchBytes a frame.
			err := s.st.RawLog(ctx, next, durable, func(seq uint64, raw []byte) error {
				b.r.Events = appendEvent(b.r.Events, seq, raw)
				b.n++
				if len(b.r.Events) < maxBatchBytes {
					return nil
				}
				return b.flush()
			})
			if err != nil {
				return err
			}
			if err := b.flush(); err != nil {
				return err
			}
			next = durable + 1
		}
		select {
		case <-grown:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// view holds one snapshot while the client calls the projection.Reader's methods, one
// request each, until it sends end (or goes quiet for viewIdle, or maxViewTime passes).
func (s *Server) view(c *net.UnixConn, w *writer, b *batch) error {
	deadline := time.Now().Add(maxViewTime)
	return s.st.ViewSnapshot(func(r projection.Reader) error {
		if err := w.send(reply{OK: true}); err != nil {
			return err
		}
		for {
			d := time.Now().Add(viewIdle)
			if d.After(deadline) {
				d = deadline
			}
			c.SetReadDeadline(d)
			req, err := readRequest(c)
			if err != nil {
				if errors.Is(err, ErrBadRequest) {
					return err
				}
				return connError{err}
			}
			if req.Op == opEnd {
				return nil
			}
			if err := s.viewCall(c, w, r, req); err != nil {
				return err
			}
		}
	})
}

// viewCall answers one Reader call. Its error ends the view: a failed connection, or a
// request that is not a Reader call; a Reader's own error is the call's answer.
func (s *Server) viewCall(c *net.UnixConn, w *writer, r projection.Reader, req request) error {
	a := &acker{c: c, w: w, size: 16}
	var err error
	switch req.Op {
	case opTask:
		var t *projection.Task
		if t, err = r.Task(req.ID); t != nil {
			a.r.Tasks = []*projection.Task{t}
		}
	case opWake:
		var x *projection.Wake
		if x, err = r.Wake(req.ID); x != nil {
			a.r.Wakes = []*projection.Wake{x}
		}
	case opTaskKey:
		a.r.Str, err = r.TaskKey(req.Session, req.Key)
	case opWakeKey:
		a.r.Str, err = r.WakeKey(req.Session, req.Key)
	case opViewLastSeq:
		a.r.U64, err = r.LastSeq()
	case opScanIndex:
		if req.Index >= uint8(projection.NumIndexes) {
			return fmt.Errorf("%w: no index %d", ErrBadRequest, req.Index)
		}
		err = r.ScanIndex(projection.Index(req.Index), req.Part, req.Min, req.Max, func(e projection.IndexEntry) bool {
			a.r.Entries = append(a.r.Entries, e)
			return a.add()
		})
	case opSessionTasks:
		err = r.ScanSessionTasks(req.Session, req.Seq, func(seq uint64, id string) bool {
			a.r.Seqs = append(a.r.Seqs, seq)
			a.r.Strs = append(a.r.Strs, id)
			return a.add()
		})
	case opCounts:
		err = r.Counts(func(kind string, state events.TaskState, n int64) bool {
			a.r.Counts = append(a.r.Counts, countRow{Kind: kind, State: state, N: n})
			return a.add()
		})
	case opSchedule:
		var x *projection.Schedule
		if x, err = r.Schedule(req.Session, req.ID); x != nil {
			a.r.Scheds = []*projection.Schedule{x}
		}
	case opSessionScheds:
		err = r.ScanSessionSchedules(req.Session, func(x *projection.Schedule) bool {
			a.r.Scheds = append(a.r.Scheds, x)
			return a.add()
		})
	case opScheduleDue:
		err = r.ScanScheduleDue(req.Max, func(e projection.ScheduleEntry) bool {
			a.r.SchedDue = append(a.r.SchedDue, e)
			return a.add()
		})
	case opKindPolicy:
		var p *projection.KindPolicy
		if p, err = r.KindPolicy(req.ID); p != nil {
			a.r.Policies = []*projection.KindPolicy{p}
		}
	case opKindPolicies:
		err = r.KindPolicies(func(p *projection.KindPolicy) bool {
			a.r.Policies = append(a.r.Policies, p)
			return a.add()
		})
	default:
		return fmt.Errorf("%w: no operation %q in a view (the endpoint only reads)", ErrBadRequest, req.Op)
	}
	if a.err != nil {
		return a.err
	}
	a.r.Done = true
	a.r.Err = toWire(err)
	a.r.More = false
	if err := w.send(a.r); err != nil {
		return connError{err}
	}
	return nil
}

// acker sends a scan's entries in batches (16, then 64, 256, 1024 at most), and after each
// one waits for the client's more or stop: a scan that the client's function ends early
// ends here too, and the view goes on.
type acker struct {
	c    *net.UnixConn
	w    *writer
	r    reply
	n    int
	size int
	err  error
}

func (a *acker) add() bool {
	a.n++
	if a.n < a.size {
		return true
	}
	a.r.More = true
	if err := a.w.send(a.r); err != nil {
		a.err = connError{err}
		return false
	}
	a.r, a.n = reply{}, 0
	a.size = min(a.size*4, 1024)
	a.c.SetReadDeadline(time.Now().Add(viewIdle))
	req, err := readRequest(a.c)
	switch {
	case err != nil:
		a.err = connError{err}
		return false
	case req.Op == opStop:
		return false
	case req.Op != opMore:
		a.err = fmt.Errorf("%w: %q after a batch (more or stop)", ErrBadRequest, req.Op)
		return false
	}
	return true
}
