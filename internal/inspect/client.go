package inspect

import (
	"bufio"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/projection"
)

// Client reads a held store through its endpoint: a source.Source over the live store (each
// call answers from what was committed when it began, as a live PostgreSQL queue does), and
// a follower (Follow). It holds no connection between calls; Close releases nothing.
type Client struct {
	dir  string
	addr string
}

var _ source.Source = (*Client)(nil)

// Dial finds the endpoint of the store in dir and checks that it answers.
func Dial(ctx context.Context, dir string) (*Client, error) {
	addr, err := resolve(dir)
	if err != nil {
		return nil, err
	}
	c := &Client{dir: dir, addr: addr}
	if _, err := c.LastSeq(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Addr is the socket address the client reads from.
func (c *Client) Addr() string { return c.addr }

// conn is one call's connection.
type conn struct {
	nc   net.Conn
	dec  *gob.Decoder
	stop func() bool
}

func (c *Client) dial(ctx context.Context, req request) (*conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.addr)
	if err != nil {
		return nil, fmt.Errorf("the inspection endpoint of %s (%s): %w", c.dir, c.addr, err)
	}
	cn := &conn{nc: nc, dec: gob.NewDecoder(bufio.NewReaderSize(nc, 64<<10))}
	cn.stop = context.AfterFunc(ctx, func() { nc.Close() })
	if err := cn.send(req); err != nil {
		cn.close()
		return nil, c.connErr(ctx, err)
	}
	return cn, nil
}

func (cn *conn) send(req request) error { return writeRequest(cn.nc, req) }

func (cn *conn) close() {
	cn.stop()
	cn.nc.Close()
}

func (c *Client) connErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("reading %s through its inspection endpoint: %w", c.dir, err)
}

// recv reads the next reply; a reply with an error is that error.
func (cn *conn) recv() (reply, error) {
	var r reply
	err := cn.recvInto(&r)
	return r, err
}

// recvInto is recv into *r, which it clears first but for the capacity of r.Events: a
// stream of event batches decodes into one buffer (gob reuses a byte slice's capacity).
func (cn *conn) recvInto(r *reply) error {
	*r = reply{Events: r.Events[:0]}
	if err := cn.dec.Decode(r); err != nil {
		return err
	}
	return r.Err.err()
}

// call sends req on a connection of its own and hands every reply to fn, until the last.
// The packed events of a reply are fn's until it returns (their buffer is reused).
func (c *Client) call(ctx context.Context, req request, fn func(reply) error) error {
	cn, err := c.dial(ctx, req)
	if err != nil {
		return err
	}
	defer cn.close()
	var r reply // fn may not keep r.Events: the next reply reuses it
	for {
		err := cn.recvInto(&r)
		var re *RemoteError
		if errors.As(err, &re) {
			return err
		}
		if err != nil {
			return c.connErr(ctx, err)
		}
		if err := fn(r); err != nil {
			return err
		}
		if r.Done {
			return nil
		}
	}
}

func (c *Client) one(ctx context.Context, req request) (reply, error) {
	var out reply
	err := c.call(ctx, req, func(r reply) error { out = r; return nil })
	return out, err
}

func (c *Client) LastSeq(ctx context.Context) (uint64, error) {
	r, err := c.one(ctx, request{Op: opLastSeq})
	return r.U64, err
}

func (c *Client) RawEvent(ctx context.Context, seq uint64) ([]byte, bool, error) {
	r, err := c.one(ctx, request{Op: opEvent, Seq: seq})
	return r.Bytes, r.OK, err
}

func (c *Client) Event(ctx context.Context, seq uint64) (events.Event, error) {
	raw, ok, err := c.RawEvent(ctx, seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w at seq %d: the event is missing", events.ErrCorrupt, seq)
	}
	return events.Decode(raw, seq)
}

func (c *Client) RawLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error {
	return c.raws(ctx, request{Op: opRawLog, From: from, To: to}, fn)
}

func (c *Client) raws(ctx context.Context, req request, fn func(seq uint64, raw []byte) error) error {
	var last uint64
	return c.call(ctx, req, func(r reply) (err error) {
		last, err = eachEvent(r.Events, last, fn)
		return err
	})
}

func decoded(fn func(events.Event) error) func(uint64, []byte) error {
	return func(seq uint64, raw []byte) error {
		ev, err := events.Decode(raw, seq)
		if err != nil {
			return err
		}
		return fn(ev)
	}
}

func (c *Client) ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return c.RawLog(ctx, from, to, decoded(fn))
}

func (c *Client) FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return c.ReadRange(ctx, from, to, fn)
}

func (c *Client) Sessions(ctx context.Context, fn func(session string) error) error {
	return c.call(ctx, request{Op: opSessions}, func(r reply) error {
		for _, s := range r.Strs {
			if err := fn(s); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *Client) SessionSeqs(ctx context.Context, session string, from uint64, fn func(seq uint64) error) error {
	return c.call(ctx, request{Op: opSessionSeqs, Session: session, From: from}, func(r reply) error {
		for _, s := range r.Seqs {
			if err := fn(s); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *Client) SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error {
	return c.raws(ctx, request{Op: opSessionLog, Session: session, From: from}, decoded(fn))
}

func (c *Client) ScanTasks(ctx context.Context, fn func(*projection.Task) error) error {
	return c.call(ctx, request{Op: opScanTasks}, func(r reply) error {
		for _, t := range r.Tasks {
			if err := fn(t); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *Client) ScanWakes(ctx context.Context, fn func(*projection.Wake) error) error {
	return c.call(ctx, request{Op: opScanWakes}, func(r reply) error {
		for _, x := range r.Wakes {
			if err := fn(x); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *Client) PrunedRanges(ctx context.Context) (projection.SeqRanges, error) {
	r, err := c.one(ctx, request{Op: opPrunedRanges})
	return r.Ranges, err
}

func (c *Client) DiskUsage(ctx context.Context) (uint64, error) {
	r, err := c.one(ctx, request{Op: opDiskUsage})
	return r.U64, err
}

// Verify checks the live store in the serving process, on a snapshot: its writers go on.
// vo.Progress is not called (the check runs over there).
func (c *Client) Verify(ctx context.Context, vo source.VerifyOptions) ([]string, error) {
	r, err := c.one(ctx, request{Op: opVerify})
	return r.Strs, err
}

// Follow calls fn with every event from from on as it becomes durable in the serving
// process, until ctx ends (its error is returned), fn fails, or the process closes the
// queue. The event is fn's until it returns (its strings and byte strings may be kept):
// a follow decodes into structs it reuses, as FoldRange may.
func (c *Client) Follow(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return c.FollowFlushing(ctx, from, fn, nil)
}

// FollowFlushing is Follow that also calls flush (when not nil) after the events of each
// frame the serving process sends: a caller that buffers what fn prints writes it once per
// frame, which holds all the events that became durable together, not once per event.
func (c *Client) FollowFlushing(ctx context.Context, from uint64, fn func(events.Event) error, flush func() error) error {
	var dec events.Decoder
	each := func(seq uint64, raw []byte) error {
		ev, err := dec.Decode(raw, seq)
		if err != nil {
			return err
		}
		return fn(ev)
	}
	last := max(from, 1) - 1
	err := c.call(ctx, request{Op: opFollow, From: from}, func(r reply) (err error) {
		if len(r.Events) == 0 {
			return nil
		}
		if last, err = eachEvent(r.Events, last, each); err != nil {
			return err
		}
		if flush != nil {
			return flush()
		}
		return nil
	})
	if ctx.Err() == nil && (err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
		// The serving process ended the follow: it closed the queue, or it exited.
		return fmt.Errorf("%s: the process that held the store closed it or exited: no more events will come", c.dir)
	}
	return err
}

func (c *Client) Close() error { return nil }

// View calls fn with the projection of one snapshot of the live store: the serving process
// holds the snapshot while fn runs (at most a few minutes, and fn may not pause between two
// reads for longer than 30 s).
func (c *Client) View(ctx context.Context, fn func(projection.Reader) error) error {
	cn, err := c.dial(ctx, request{Op: opView})
	if err != nil {
		return err
	}
	defer cn.close()
	if _, err := cn.recv(); err != nil {
		return c.connErr(ctx, err)
	}
	rr := &remoteReader{c: c, cn: cn, ctx: ctx}
	if err := fn(rr); err != nil {
		return err
	}
	if rr.broken != nil {
		return rr.broken
	}
	if err := cn.send(request{Op: opEnd}); err != nil {
		return c.connErr(ctx, err)
	}
	if _, err := cn.recv(); err != nil {
		return c.connErr(ctx, err)
	}
	return nil
}

// remoteReader is the projection.Reader of a remote view: one request per call.
type remoteReader struct {
	c      *Client
	cn     *conn
	ctx    context.Context
	broken error // the connection failed: every later call returns it
}

// call sends req and hands each batch of the answer to fn; fn returns false to stop a scan.
func (rr *remoteReader) call(req request, fn func(reply) bool) error {
	if rr.broken != nil {
		return rr.broken
	}
	fail := func(err error) error {
		rr.broken = rr.c.connErr(rr.ctx, err)
		return rr.broken
	}
	if err := rr.cn.send(req); err != nil {
		return fail(err)
	}
	stopped := false
	for {
		var r reply
		if err := rr.cn.dec.Decode(&r); err != nil {
			return fail(err)
		}
		if !stopped && !fn(r) {
			stopped = true
		}
		if !r.More {
			return r.Err.err()
		}
		next := opMore
		if stopped {
			next = opStop
		}
		if err := rr.cn.send(request{Op: next}); err != nil {
			return fail(err)
		}
	}
}

func (rr *remoteReader) one(req request) (reply, error) {
	var out reply
	err := rr.call(req, func(r reply) bool { out = r; return true })
	return out, err
}

func (rr *remoteReader) Task(id string) (*projection.Task, error) {
	r, err := rr.one(request{Op: opTask, ID: id})
	if err != nil || len(r.Tasks) == 0 {
		return nil, err
	}
	return r.Tasks[0], nil
}

func (rr *remoteReader) Wake(id string) (*projection.Wake, error) {
	r, err := rr.one(request{Op: opWake, ID: id})
	if err != nil || len(r.Wakes) == 0 {
		return nil, err
	}
	return r.Wakes[0], nil
}

func (rr *remoteReader) TaskKey(sessionID, key string) (string, error) {
	r, err := rr.one(request{Op: opTaskKey, Session: sessionID, Key: key})
	return r.Str, err
}

func (rr *remoteReader) WakeKey(sessionID, key string) (string, error) {
	r, err := rr.one(request{Op: opWakeKey, Session: sessionID, Key: key})
	return r.Str, err
}

func (rr *remoteReader) LastSeq() (uint64, error) {
	r, err := rr.one(request{Op: opViewLastSeq})
	return r.U64, err
}

func (rr *remoteReader) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	return rr.call(request{Op: opScanIndex, Index: uint8(ix), Part: part, Min: from, Max: to}, func(r reply) bool {
		for _, e := range r.Entries {
			if !fn(e) {
				return false
			}
		}
		return true
	})
}

func (rr *remoteReader) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(submitSeq uint64, taskID string) bool) error {
	return rr.call(request{Op: opSessionTasks, Session: sessionID, Seq: afterSeq}, func(r reply) bool {
		for i, seq := range r.Seqs {
			if i >= len(r.Strs) || !fn(seq, r.Strs[i]) {
				return false
			}
		}
		return true
	})
}

func (rr *remoteReader) Counts(fn func(kind string, state events.TaskState, n int64) bool) error {
	return rr.call(request{Op: opCounts}, func(r reply) bool {
		for _, c := range r.Counts {
			if !fn(c.Kind, c.State, c.N) {
				return false
			}
		}
		return true
	})
}

func (rr *remoteReader) Schedule(sessionID, name string) (*projection.Schedule, error) {
	r, err := rr.one(request{Op: opSchedule, Session: sessionID, ID: name})
	if err != nil || len(r.Scheds) == 0 {
		return nil, err
	}
	return r.Scheds[0], nil
}

func (rr *remoteReader) ScanSessionSchedules(sessionID string, fn func(*projection.Schedule) bool) error {
	return rr.call(request{Op: opSessionScheds, Session: sessionID}, func(r reply) bool {
		for _, x := range r.Scheds {
			if !fn(x) {
				return false
			}
		}
		return true
	})
}

func (rr *remoteReader) ScanScheduleDue(maxAt int64, fn func(projection.ScheduleEntry) bool) error {
	return rr.call(request{Op: opScheduleDue, Max: maxAt}, func(r reply) bool {
		for _, e := range r.SchedDue {
			if !fn(e) {
				return false
			}
		}
		return true
	})
}

func (rr *remoteReader) KindPolicy(kind string) (*projection.KindPolicy, error) {
	r, err := rr.one(request{Op: opKindPolicy, ID: kind})
	if err != nil || len(r.Policies) == 0 {
		return nil, err
	}
	return r.Policies[0], nil
}

func (rr *remoteReader) KindPolicies(fn func(*projection.KindPolicy) bool) error {
	return rr.call(request{Op: opKindPolicies}, func(r reply) bool {
		for _, p := range r.Policies {
			if !fn(p) {
				return false
			}
		}
		return true
	})
}
