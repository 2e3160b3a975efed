package postgres

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// The shared writer (Options.SharedWriter; design §9 "Many processes", option 2). Every
// writing transaction of every process takes the log head's lock, so the processes of one
// queue take turns, and a turn taken after another process's costs more than one taken
// after the writer's own (a second round trip, the catch-up of the other's events):
// four processes ran 0.8× of one. With the option, the processes
// elect one of them (a session advisory lock on a connection of its own); it listens on a
// TCP address, which it writes with a random token into the table shared_writer, and the
// others send it their runners' rounds (Queue.SettleAndClaimAt) and their single claims and
// finishes, as rounds (work/forward.go), which its writer runs in its groups beside its
// own: one group stream, one cache that stays valid, groups as large as every process's
// rounds together.
//
// Forwarding is never needed for correctness: every process may still write (Submit,
// Cancel, ... always run in their own process, and a round runs here whenever no elected
// process is reachable), and the log head's lock orders them all as before. So the
// election needs no fencing: two processes that both believe they are elected for a moment
// are just two writers. What a lost connection costs: a round whose answer did not come
// back is resolved by its sender, as a COMMIT whose answer was lost is from its commit mark:
// it runs the round again in its own writer (work/forward.go), where a settle that committed
// here is found in the task's state, and the tasks the lost round may have claimed go back
// to the queue when their leases expire.

// sharedWriterPoll is how often a process that is not elected tries the election's lock
// and reads the elected process's address, and how often the elected one checks its
// election connection: the longest a queue runs its rounds itself after the elected
// process is gone.
var sharedWriterPoll = time.Second

const (
	swMagic        = "worklog shared writer 1\n"
	swTokenLen     = 32
	swMaxFrame     = 256 << 20 // a round's settles with their outputs (MaxValueBytes, 64 MiB at most, each)
	swDialTimeout  = 2 * time.Second
	swStatusRan    = 0 // the answer follows
	swStatusRefuse = 1 // the round did not run: the sender runs it
	swStatusPing   = 2 // the sender asks whether the elected process still reads
	swStatusPong   = 3 // its answer, sent by the reading goroutine itself
)

// swPingEvery and swPingWait: a follower pings the elected process every swPingEvery, and
// gives the connection up when it has heard nothing on it for swPingWait: a process that
// stopped (SIGSTOP, a host that froze, a network that drops every packet) keeps its socket
// and its election lock, and would otherwise hold every round sent to it until the caller's
// deadline, again and again. Its rounds in flight end with errSharedWriterLost; the
// follower runs its rounds itself, and dials again at its next look (which a stopped process
// does not answer: the handshake has a deadline). An elected process whose writer waits on
// the database still answers pings: a slow round is bounded by its caller's ctx, as a local
// one.
var (
	swPingEvery = time.Second
	swPingWait  = 5 * time.Second
)

// sharedWriterDDL is the one row saying where the elected process listens. Created by the
// first process elected, outside the schema's format: a queue that never uses the option
// has no such table, and one created by this version is readable by any other.
const sharedWriterDDL = `CREATE TABLE IF NOT EXISTS {s}.shared_writer (
	one boolean PRIMARY KEY DEFAULT true CHECK (one),
	addr text NOT NULL, token bytea NOT NULL, since timestamptz NOT NULL DEFAULT now())`

type sharedWriter struct {
	e     *engine
	addr  string // to listen on when elected
	key   int64  // the election's advisory lock
	serve func(ctx context.Context, req []byte) ([]byte, error)

	cur     atomic.Pointer[swConn] // the connection to the elected process; nil: none
	leading atomic.Bool
	lost    chan struct{} // a connection to the elected process failed: look again now
	done    chan struct{} // run has returned

	forwarded, served atomic.Int64 // rounds: sent and answered, run for others

	// cut is a test's (nil in production): called for each round served, before it runs
	// (ran false) and after it ran (ran true, before its answer is sent); true closes the
	// connection there, so the sender loses the round's answer.
	cut atomic.Pointer[func(ran bool) bool]

	lastWarning string // run's: the last failure to lead that was logged
}

// warn logs, once until it changes or the process leads, why the process elected cannot
// lead: it gives the election up (its connection is closed, so another may take it) and
// every process runs its own rounds meanwhile.
func (s *sharedWriter) warn(doing string, err error) {
	msg := fmt.Sprintf("postgres: shared writer: elected, but %s failed: %v (each process runs its own rounds)", doing, err)
	if msg == s.lastWarning || s.e.opts.Logger == nil {
		return
	}
	s.lastWarning = msg
	s.e.opts.Logger.Warn(msg)
}

// q puts the queue's schema into sql.
func (s *sharedWriter) q(sql string) string {
	return strings.ReplaceAll(sql, "{s}", pgx.Identifier{s.e.schema}.Sanitize())
}

func newSharedWriter(e *engine, addr string) *sharedWriter {
	h := fnv.New64a()
	h.Write([]byte("worklog shared writer " + e.channel))
	return &sharedWriter{e: e, addr: addr, key: int64(h.Sum64() & math.MaxInt64),
		lost: make(chan struct{}, 1), done: make(chan struct{})}
}

// CanForward, Forward and SetForwardServer make the engine an engineapi.Forwarder.
func (e *engine) CanForward() bool {
	if e.sw == nil {
		return false
	}
	c := e.sw.cur.Load()
	return c != nil && !c.isDead()
}

func (e *engine) Forward(ctx context.Context, req []byte) ([]byte, bool, error) {
	// A closed queue, or a ctx already done, runs nothing anywhere: the local path says so
	// (ErrClosed, ctx.Err()).
	if e.sw == nil || ctx.Err() != nil || e.isClosed() {
		return nil, false, nil
	}
	return e.sw.forward(ctx, req)
}

func (e *engine) SetForwardServer(serve func(ctx context.Context, req []byte) ([]byte, error)) {
	if e.sw != nil {
		e.sw.serve = serve
	}
}

func (s *sharedWriter) forward(ctx context.Context, req []byte) ([]byte, bool, error) {
	c := s.cur.Load()
	if c == nil || len(req) > swMaxFrame-16 {
		return nil, false, nil
	}
	resp, sent, err := c.call(ctx, req)
	if !sent {
		return nil, false, nil
	}
	if err == nil {
		s.forwarded.Add(1)
	}
	return resp, true, err
}

// start runs the election until the engine closes (e.ctx).
func (s *sharedWriter) start() { go s.run() }

func (s *sharedWriter) run() {
	defer close(s.done)
	defer func() {
		if c := s.cur.Swap(nil); c != nil {
			c.close()
		}
	}()
	for s.e.ctx.Err() == nil {
		cfg := s.e.pool.Config().ConnConfig.Copy()
		ctx, cancel := context.WithTimeout(s.e.ctx, 10*time.Second)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		cancel()
		if err == nil {
			s.term(conn)
			conn.Close(context.Background()) // the election's lock goes with the session
		}
		s.sleep(sharedWriterPoll)
	}
}

func (s *sharedWriter) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.e.ctx.Done():
	case <-s.lost:
	case <-t.C:
	}
}

// term tries the election's lock on conn until it fails: the elected process leads, the
// others keep a connection to it.
func (s *sharedWriter) term(conn *pgx.Conn) {
	for s.e.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(s.e.ctx, 10*time.Second)
		var got bool
		err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, s.key).Scan(&got)
		cancel()
		if err != nil {
			return
		}
		if got {
			s.lead(conn)
			return
		}
		s.follow(conn)
		s.sleep(sharedWriterPoll)
	}
}

// follow keeps a connection to the process the table names.
func (s *sharedWriter) follow(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(s.e.ctx, 10*time.Second)
	defer cancel()
	var addr string
	var token []byte
	err := conn.QueryRow(ctx, s.q(`SELECT addr, token FROM {s}.shared_writer`)).Scan(&addr, &token)
	if err != nil { // no table or no row yet (nobody was elected), or a failed read
		return
	}
	if c := s.cur.Load(); c != nil && c.addr == addr && bytes.Equal(c.token, token) && !c.isDead() {
		return
	}
	c, err := dialShared(ctx, addr, token, s.lost)
	if err != nil {
		return
	}
	if old := s.cur.Swap(c); old != nil {
		old.close()
	}
}

// lead listens for the other processes' rounds while conn (which holds the election's
// lock) answers.
func (s *sharedWriter) lead(conn *pgx.Conn) {
	if c := s.cur.Swap(nil); c != nil {
		c.close()
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.warn("listening on SharedWriterAddr", err)
		return
	}
	defer ln.Close()
	token := make([]byte, swTokenLen)
	rand.Read(token) // crypto/rand
	ctx, cancel := context.WithTimeout(s.e.ctx, 10*time.Second)
	_, err = conn.Exec(ctx, s.q(sharedWriterDDL))
	if err == nil {
		_, err = conn.Exec(ctx, s.q(`INSERT INTO {s}.shared_writer (addr, token) VALUES ($1, $2)
			ON CONFLICT (one) DO UPDATE SET addr = excluded.addr, token = excluded.token, since = now()`),
			ln.Addr().String(), token)
	}
	cancel()
	if err != nil {
		s.warn("writing its address into the table shared_writer", err)
		return
	}
	s.lastWarning = ""
	s.leading.Store(true)
	defer s.leading.Store(false)
	lctx, stop := context.WithCancel(s.e.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.accept(lctx, ln, token)
	}()
	defer wg.Wait()
	defer stop()
	defer ln.Close()
	for {
		t := time.NewTimer(sharedWriterPoll)
		select {
		case <-s.e.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.e.ctx, 5*time.Second)
		_, err := conn.Exec(ctx, "SELECT 1")
		cancel()
		if err != nil {
			return
		}
	}
}

func (s *sharedWriter) accept(ctx context.Context, ln net.Listener, token []byte) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, nc, token)
		}()
	}
}

// serveConn runs the rounds one connection sends, each in its own goroutine (so that the
// rounds of every process join the writer's groups together), until ctx ends or the
// connection fails; then it waits for the rounds in flight, sends their answers, and
// closes the connection.
func (s *sharedWriter) serveConn(ctx context.Context, nc net.Conn, token []byte) {
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(swDialTimeout))
	hello := make([]byte, len(swMagic)+swTokenLen)
	if _, err := io.ReadFull(nc, hello); err != nil || string(hello[:len(swMagic)]) != swMagic ||
		subtle.ConstantTimeCompare(hello[len(swMagic):], token) != 1 {
		return
	}
	if _, err := nc.Write([]byte{1}); err != nil {
		return
	}
	nc.SetDeadline(time.Time{})
	out := make(chan swFrame, 64)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		writeFrames(nc, out, nil)
	}()
	var rounds sync.WaitGroup
	ended := make(chan struct{}) // the loop below ended on its own
	defer close(ended)
	go func() { // a connection that outlives ctx stops reading, which ends the loop below
		select {
		case <-ctx.Done():
		case <-ended:
			return
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.CloseRead()
		} else {
			nc.Close()
		}
	}()
	r := bufio.NewReaderSize(nc, 64<<10)
	for {
		f, err := readFrame(r)
		if err != nil {
			break
		}
		if f.status == swStatusPing {
			out <- swFrame{status: swStatusPong}
			continue
		}
		if ctx.Err() != nil || s.serve == nil || s.e.isClosed() {
			out <- swFrame{id: f.id, status: swStatusRefuse}
			continue
		}
		rounds.Add(1)
		go func() {
			defer rounds.Done()
			if s.cutHere(nc, false) {
				return
			}
			resp, err := s.serve(s.e.ctx, f.body)
			if err != nil {
				out <- swFrame{id: f.id, status: swStatusRefuse}
				return
			}
			s.served.Add(1)
			if s.cutHere(nc, true) {
				return
			}
			out <- swFrame{id: f.id, status: swStatusRan, body: resp}
		}()
	}
	rounds.Wait()
	close(out)
	<-wrote
}

// cutHere runs the test's cut, if any, and closes nc when it says so.
func (s *sharedWriter) cutHere(nc net.Conn, ran bool) bool {
	if f := s.cut.Load(); f != nil && (*f)(ran) {
		nc.Close()
		return true
	}
	return false
}

// swFrame is one round or answer on the wire: length (of what follows it), id, status, body.
type swFrame struct {
	id     uint64
	status byte
	body   []byte
}

func readFrame(r *bufio.Reader) (swFrame, error) {
	var h [13]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return swFrame{}, err
	}
	n := binary.BigEndian.Uint32(h[:4])
	if n < 9 || n > swMaxFrame {
		return swFrame{}, fmt.Errorf("postgres: shared writer: a frame of %d bytes", n)
	}
	f := swFrame{id: binary.BigEndian.Uint64(h[4:12]), status: h[12], body: make([]byte, n-9)}
	_, err := io.ReadFull(r, f.body)
	return f, err
}

// writeFrames writes what out carries, flushing when it has nothing more waiting, until out
// is closed or stop ends (nil: never). After a failed write it only drains out.
func writeFrames(nc net.Conn, out <-chan swFrame, stop <-chan struct{}) {
	w := bufio.NewWriterSize(nc, 64<<10)
	var err error
	put := func(f swFrame) {
		if err != nil {
			return
		}
		var h [13]byte
		binary.BigEndian.PutUint32(h[:4], uint32(9+len(f.body)))
		binary.BigEndian.PutUint64(h[4:12], f.id)
		h[12] = f.status
		if _, err = w.Write(h[:]); err == nil {
			_, err = w.Write(f.body)
		}
		if err != nil {
			nc.Close()
		}
	}
	for {
		select {
		case f, ok := <-out:
			if !ok {
				if err == nil {
					w.Flush()
				}
				return
			}
			put(f)
		case <-stop:
			return
		}
	more:
		for {
			select {
			case f, ok := <-out:
				if !ok {
					break more
				}
				put(f)
			default:
				break more
			}
		}
		if err == nil {
			if err = w.Flush(); err != nil {
				nc.Close()
			}
		}
	}
}

// swConn is a follower's connection to the elected process.
type swConn struct {
	addr  string
	token []byte
	nc    net.Conn
	out   chan swFrame
	lost  chan struct{} // the sharedWriter's: told once when this connection fails

	heard atomic.Int64 // when a frame last came (Unix nanoseconds)

	mu      sync.Mutex
	pending map[uint64]chan swFrame
	next    uint64
	dead    chan struct{}
	once    sync.Once
}

var errSharedWriterLost = errors.New("postgres: the connection to the shared writer failed before its answer: the round's outcome is unknown")

func dialShared(ctx context.Context, addr string, token []byte, lost chan struct{}) (*swConn, error) {
	d := net.Dialer{Timeout: swDialTimeout, KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second,
		Interval: 5 * time.Second, Count: 3}}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Now().Add(swDialTimeout))
	hello := append([]byte(swMagic), token...)
	var ok [1]byte
	if _, err := nc.Write(hello); err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := io.ReadFull(nc, ok[:]); err != nil || ok[0] != 1 {
		nc.Close()
		return nil, fmt.Errorf("postgres: shared writer at %s refused the token", addr)
	}
	nc.SetDeadline(time.Time{})
	c := &swConn{addr: addr, token: token, nc: nc, out: make(chan swFrame, 64), lost: lost,
		pending: map[uint64]chan swFrame{}, dead: make(chan struct{})}
	c.heard.Store(time.Now().UnixNano())
	go writeFrames(nc, c.out, c.dead)
	go c.read()
	go c.ping()
	return c, nil
}

// ping sends a ping every swPingEvery and fails the connection once nothing came on it
// for swPingWait.
func (c *swConn) ping() {
	t := time.NewTicker(swPingEvery)
	defer t.Stop()
	for {
		select {
		case <-c.dead:
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, c.heard.Load())) > swPingWait {
			c.fail()
			return
		}
		select {
		case c.out <- swFrame{status: swStatusPing}:
		case <-c.dead:
			return
		}
	}
}

func (c *swConn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// fail marks the connection dead, once: every round waiting for its answer gets
// errSharedWriterLost, and the sharedWriter looks for the elected process again.
func (c *swConn) fail() {
	c.once.Do(func() {
		c.nc.Close()
		select { // before dead: a round that returns errSharedWriterLost finds the look asked for
		case c.lost <- struct{}{}:
		default:
		}
		c.mu.Lock()
		close(c.dead)
		c.mu.Unlock()
	})
}

func (c *swConn) close() { c.fail() }

func (c *swConn) read() {
	defer c.fail()
	r := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		f, err := readFrame(r)
		if err != nil {
			return
		}
		c.heard.Store(time.Now().UnixNano())
		if f.status == swStatusPong {
			continue
		}
		c.mu.Lock()
		ch := c.pending[f.id]
		delete(c.pending, f.id)
		c.mu.Unlock()
		if ch != nil {
			ch <- f
		}
	}
}

// call sends req and waits for its answer. sent false: the round was not sent, or was
// refused (it did not run).
func (c *swConn) call(ctx context.Context, req []byte) (resp []byte, sent bool, err error) {
	ch := make(chan swFrame, 1)
	c.mu.Lock()
	if c.isDead() {
		c.mu.Unlock()
		return nil, false, nil
	}
	c.next++
	id := c.next
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}
	select {
	case c.out <- swFrame{id: id, body: req}:
	case <-c.dead:
		forget()
		return nil, false, nil
	case <-ctx.Done():
		forget()
		return nil, false, nil
	}
	select {
	case f := <-ch:
		if f.status != swStatusRan {
			return nil, false, nil
		}
		return f.body, true, nil
	case <-c.dead:
		select { // the answer may have come just before the connection failed
		case f := <-ch:
			if f.status != swStatusRan {
				return nil, false, nil
			}
			return f.body, true, nil
		default:
		}
		return nil, true, errSharedWriterLost
	case <-ctx.Done():
		forget()
		return nil, true, ctx.Err()
	}
}
