package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

var (
	// ErrFormatTooNew: the schema holds tables of a newer worklog format; nothing was changed.
	ErrFormatTooNew = errors.New("postgres: worklog tables of a newer format")
	// ErrNotAQueue: the schema holds some of worklog's tables but not a whole queue (or, for
	// OpenReadOnly, none at all); nothing was changed.
	ErrNotAQueue = errors.New("postgres: not a worklog queue")
	// ErrInvalidDSN: the DSN cannot be parsed, or its search_path is malformed or resolves to
	// a system schema (a *DSNError naming search_path).
	ErrInvalidDSN = errors.New("postgres: invalid DSN")
	// ErrCorruptRow: a stored row does not decode, or the log has a gap. The error names
	// the table and the row.
	ErrCorruptRow = errors.New("postgres: corrupt row")
	// ErrCommitUnknown: the connection failed during a COMMIT and its outcome could not be
	// proven within Options.CommitResolveTimeout (the writer reads back its group's commit
	// mark, never trusting pg_xact_status, whose transaction ids a crash may reuse). The
	// call may or may not have taken effect; an idempotency key makes a retry safe.
	ErrCommitUnknown = errors.New("postgres: commit outcome unknown")
)

// Options configures Open. The zero value (or nil) is the defaults.
type Options struct {
	// MaxValueBytes is the largest JSON value accepted (input, payload, output). Default
	// work.DefaultMaxValueBytes (1 MiB); at most 64 MiB, as work.Options.MaxValueBytes.
	MaxValueBytes int
	// Entropy is the randomness for ids and lease tokens. Default (nil) crypto/rand.
	Entropy io.Reader
	// MaxBatchCommands bounds the commands one transaction runs. Default 256.
	MaxBatchCommands int
	// MaxConns is the size of the connection pool: one for the writer, the rest for reads
	// (at least 2). Default 8. The change listener holds one more connection of its own.
	MaxConns int32
	// CommitResolveTimeout bounds how long the writer asks the server whether a COMMIT whose
	// connection failed committed, before its callers get ErrCommitUnknown (default 30 s).
	CommitResolveTimeout time.Duration
	// WriteTimeout bounds each transaction of the writer, from its BEGIN to its COMMIT's
	// answer (default 30 s): past it, the connection's socket gets a deadline and is closed,
	// and the group's callers get ErrBackend — or, when its COMMIT was on its way, what the
	// server answers about it (ErrCommitUnknown when it cannot). A server that stops
	// answering (frozen, or behind a network that drops every packet) holds the writer this
	// long at most for each group.
	WriteTimeout time.Duration
	// CloseTimeout bounds how long Close waits for the writer's group in progress
	// (default 10 s). Past it Close ends the writer's statements and closes the connections:
	// a group whose COMMIT was on its way is reported to its callers as ErrCommitUnknown
	// (never as a success, nor as rolled back), an earlier one as ErrBackend (it cannot have
	// committed). Close itself returns within CloseTimeout plus a few seconds.
	CloseTimeout time.Duration
	// Retention and PruneInterval are work.Options' fields of the same names: with
	// Retention set (default 0: keep all history), the queue prunes in the background,
	// every PruneInterval (default work.DefaultPruneInterval, one minute), what became
	// prunable more than Retention ago. Several
	// processes may each do so: their prunes take turns on the log head like every write.
	Retention, PruneInterval time.Duration
	// Logger receives the background pruner's messages, and the shared writer's when the
	// process elected cannot lead (SharedWriter). Default: discarded.
	Logger *slog.Logger
	// SharedWriter: the processes of the queue that set it elect one of them, whose writer
	// runs the claims and settles of them all (Queue.SettleAndClaimAt, a runner's rounds, and
	// ClaimDueAt, ClaimKindsAt, FinishAt), so that they commit in one stream of groups
	// instead of taking turns on the log head (design §9 "The shared writer"). Default
	// false: each process runs its own. The elected process listens on SharedWriterAddr and
	// writes that address, with a random token the others must present, into the schema's
	// table shared_writer; the calls travel unencrypted (lease tokens included), so give a
	// routable address only on a network you trust. A call whose answer is lost with its
	// connection ends in ErrBackend, its outcome unknown (as a lost COMMIT's); while no
	// elected process is reachable, each process runs its calls itself. The election holds
	// one more connection of its own (beside the pool and the listener's).
	SharedWriter bool
	// SharedWriterAddr is the TCP address the elected process listens on (default
	// "127.0.0.1:0": any free port, reachable from this host only). Processes on several
	// hosts need an address the others can reach, written as they must dial it.
	SharedWriterAddr string
}

// maxMaxValueBytes is work.Options' bound on MaxValueBytes.
const maxMaxValueBytes = 64 << 20

// withDefaults returns a copy of o with every zero field set to its default; validate then
// checks it, before Open touches the database.
func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.MaxValueBytes == 0 {
		r.MaxValueBytes = work.DefaultMaxValueBytes
	}
	if r.MaxBatchCommands == 0 {
		r.MaxBatchCommands = 256
	}
	if r.MaxConns == 0 {
		r.MaxConns = 8
	}
	if r.CommitResolveTimeout == 0 {
		r.CommitResolveTimeout = 30 * time.Second
	}
	if r.PruneInterval == 0 {
		r.PruneInterval = work.DefaultPruneInterval
	}
	if r.WriteTimeout == 0 {
		r.WriteTimeout = 30 * time.Second
	}
	if r.CloseTimeout == 0 {
		r.CloseTimeout = 10 * time.Second
	}
	if r.SharedWriterAddr == "" {
		r.SharedWriterAddr = "127.0.0.1:0"
	}
	return r
}

// validate returns a *work.OptionError naming the first field of o out of range, or nil.
func (o *Options) validate() error {
	bad := func(field, msg string) error { return optionerr.New("postgres.Options", field, msg) }
	switch {
	case o.MaxValueBytes < 0 || o.MaxValueBytes > maxMaxValueBytes:
		return bad("MaxValueBytes", fmt.Sprintf("must be between 1 and %d, or 0 for the default %d", maxMaxValueBytes, work.DefaultMaxValueBytes))
	case o.MaxBatchCommands < 1:
		return bad("MaxBatchCommands", "must be positive")
	case o.MaxConns < 2:
		return bad("MaxConns", "must be at least 2 (the writer's connection and one for reads)")
	case o.CommitResolveTimeout < 0:
		return bad("CommitResolveTimeout", "must not be negative")
	case o.WriteTimeout < 0:
		return bad("WriteTimeout", "must not be negative (0 is the default, 30 s)")
	case o.CloseTimeout < 0:
		return bad("CloseTimeout", "must not be negative (0 is the default, 10 s)")
	case o.Retention < 0:
		return bad("Retention", "must not be negative (0 keeps all history)")
	case o.PruneInterval < 0:
		return bad("PruneInterval", "must not be negative (0 is the default, one minute)")
	}
	if _, _, err := net.SplitHostPort(o.SharedWriterAddr); err != nil {
		return bad("SharedWriterAddr", fmt.Sprintf("must be host:port: %v", err))
	}
	return nil
}

// idleInTransactionTimeout is the server's bound, on the queue's read-write connections, on a
// transaction left idle between two statements (idle_in_transaction_session_timeout).
const idleInTransactionTimeout = "60s"

// engine is internal/engine.Engine on PostgreSQL.
type engine struct {
	pool    *pgxpool.Pool
	schema  string
	channel string
	// listenKeys: the advisory locks of the channel's listeners; watcherSlot: the slot this
	// process's watcher owns while it listens, -1 when none (listeners.go)
	listenKeys  listenKeys
	watcherSlot atomic.Int32
	st          *statements
	opts        Options

	ctx     context.Context // ends at Close: every statement in flight stops
	cancel  context.CancelFunc
	sockets *socketSet // every connection's, for Close to cut those a frozen server holds

	mu         sync.RWMutex // closed, and sending to cmds
	closed     bool
	cmds       chan *command
	closing    chan struct{}
	writerDone chan struct{}
	cache      *cache    // the writer's
	hints      keyHints  // keys ViewDurable found absent, for the writer (readfirst.go)
	readFirst  readFirst // whether a keyed Submit reads its key first (readfirst.go)

	mark commitMark // the writer's row in commit_marks: the proof of a lost COMMIT (writer.go)
	head headStats  // the log head's hold per committed group (headstats.go), read by benchmarks
	plan claimPlan  // what the writer's recent claims read, read by its next begins (claimpre.go)
	// claimReads: the next claim's reads, made after the last commit (claimpre.go); alone:
	// the writer's groups in a row that found no other writer's commit before them.
	claimReads *claimReads
	alone      int

	changed     chan struct{}
	watcherDone chan struct{}
	waiters     waiters     // whether this process's waiters need other processes' commits (listeners.go)
	inbox       *inbox      // SubmitTx's rows (submittx.go)
	queue       *work.Queue // the queue over this engine, for SubmitTx's lookup (Close forgets it)
	keyReads    [2]keyReads // read-first's key reads, coalesced: tasks' [0], wakes' [1] (readfirst.go)

	// savepointEach: a SAVEPOINT round trip before each command of a group, only to measure
	// what a savepoint-per-command design would cost (BenchmarkSubmit); never set otherwise.
	savepointEach bool

	// ordinaryCommits: every group begins under the lock and ends its commit batch with its
	// COMMIT (no fast path, no reads after the COMMIT): set by the tests that fail or count
	// the ordinary commit batch; never otherwise.
	ordinaryCommits bool
	trace           tracer // nil but in tests

	sw *sharedWriter // Options.SharedWriter's election and connections (sharedwriter.go); nil without

	// stuckWait is readStuckWait as open found it (nanoseconds): background reads (the
	// inbox's check) run from Open to Close, and a test shortens a later engine's bound
	// without racing them.
	stuckWait atomic.Int64
}

// tracer is told of the writer's steps, for a test to count them, look at a batch, or fail a
// step (close the connection). Production leaves engine.trace nil, and nothing the engine
// does depends on whether it is set.
type tracer interface {
	// sendingCommit: a group's commit batch (fast: the fast path's one batch), about to be
	// sent on conn; statements queued into b after its COMMIT go in its round trip.
	sendingCommit(conn *pgx.Conn, b *pgx.Batch, fast bool)
	sentCommit(conn *pgx.Conn)           // the ordinary commit batch is sent, its answers not read
	readRecord()                         // a group reads a task or wake record from the server
	readKeys(ctx context.Context, n int) // a round of n key reads is sent (readfirst.go)
}

var (
	_ engineapi.Engine  = (*engine)(nil)
	_ engineapi.Watcher = (*engine)(nil)
)

// Open connects to the database dsn names (a postgres:// URL or key=value DSN, as pgx
// parses it) and returns a queue whose tables live in the schema worklog (DefaultSchema), or
// the one the DSN's search_path chooses (the first existing schema of the path, as
// PostgreSQL resolves it; the first of the path when none exists), so one database holds
// several queues. It creates the schema and its tables when they are missing, and refuses a
// schema of a newer format (ErrFormatTooNew) or one holding part of a queue (ErrNotAQueue),
// naming the schema, without changing it; a system schema, a malformed search_path, or no
// search_path while a queue of an older version is in public (name it: search_path=public)
// are a *DSNError (ErrInvalidDSN). Errors are ErrBackend errors wrapping those; invalid
// options are a *work.OptionError (work.ErrInvalidOptions) naming the field (Options
// "postgres.Options", Field "MaxConns"), before the database is touched.
func Open(ctx context.Context, dsn string, opts *Options) (*work.Queue, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	e, err := open(ctx, dsn, o, false)
	if err != nil {
		return nil, work.NewBackendError(err)
	}
	e.startWriter()
	// The server's clock decides: the queue's plain methods read it (clock.go).
	clock, err := newServerClock(ctx, e.ctx, e.serverTime)
	if err != nil {
		return nil, work.NewBackendError(errors.Join(err, e.Close()))
	}
	if o.SharedWriter {
		e.sw = newSharedWriter(e, o.SharedWriterAddr) // started below: Close waits for it
	}
	// The background pruner is work's (Queue.Close stops it before it closes this engine).
	// An input longer than cacheValueMax is copied into the group's event and row encodings
	// and dropped from the cache when the group ends (adopt): the queue need not copy it first.
	q := engineapi.NewQueue(e, engineapi.Config{MaxValueBytes: o.MaxValueBytes, Entropy: o.Entropy,
		BorrowedInputMin: cacheValueMax,
		Retention:        o.Retention, PruneInterval: o.PruneInterval, Logger: o.Logger, Clock: clock.Now}).(*work.Queue)
	e.queue = q
	queues.Store(q, e) // SubmitTx's lookup (submittx.go)
	if e.sw != nil {
		e.sw.start() // after NewQueue gave it the rounds' server
	}
	return q, nil
}

func open(ctx context.Context, dsn string, o Options, readOnly bool) (*engine, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidDSN, err)
	}
	cfg.MaxConns = o.MaxConns
	// The session settings the queue's own connections need, whatever the database or the
	// role sets (the application's connections keep theirs): no statement or lock timeout
	// (a writer waits its turn on the log head, Verify reads whole tables), and a bound on a
	// transaction left idle (a process paused while its writer holds the log head would stall
	// every writer of every process) long enough for any pause between two statements of the
	// queue's own. A read-only store's transactions lock out no writer: no bound.
	idle := idleInTransactionTimeout
	if readOnly {
		idle = "0"
	}
	for k, v := range map[string]string{"statement_timeout": "0", "lock_timeout": "0",
		"idle_in_transaction_session_timeout": idle} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	// TCP keepalives on every connection: a peer that vanished (a host down, a network that
	// drops every packet) is noticed on an idle connection, the listener's above all, within
	// about 30 s. A connection waiting for an answer is bounded by its context instead (the
	// writer's by WriteTimeout): pgx sets a deadline on the socket when the context ends.
	// Once Close has ended the statements in flight, nothing dials: pgx answers a failed
	// connection with a cancel request on a new one, which a frozen server holds for 15 s,
	// and the pool's Close waits for it.
	ectx, cancel := context.WithCancel(context.Background())
	dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second,
		Interval: 5 * time.Second, Count: 3}}
	sockets := &socketSet{open: map[*socket]struct{}{}}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ectx.Err() != nil {
			return nil, errClosed()
		}
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return sockets.add(c), nil
	}
	if testConfigHook != nil {
		testConfigHook(cfg)
	}
	if readOnly {
		// Every transaction of the pool is read-only: the server refuses any write.
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		cancel()
		return nil, err
	}
	schema, defaulted, err := schemaOf(ctx, pool)
	if err == nil {
		err = ensureSchema(ctx, pool, schema, defaulted, readOnly)
	}
	st := newStatements(schema)
	if err == nil && readOnly {
		err = st.withoutPriority(ctx, pool, schema)
	}
	if err == nil && readOnly {
		err = st.withoutPolicySessions(ctx, pool, schema)
	}
	if err != nil {
		cancel()
		pool.Close()
		return nil, err
	}
	e := &engine{
		pool: pool, schema: schema, channel: channelName(schema), listenKeys: newListenKeys(channelName(schema)), st: st, opts: o,
		ctx: ectx, cancel: cancel, sockets: sockets, cmds: make(chan *command, 4096), closing: make(chan struct{}),
		writerDone: make(chan struct{}), cache: newCache(), changed: make(chan struct{}, 1),
		watcherDone: make(chan struct{}), inbox: newInbox(schema),
	}
	e.watcherSlot.Store(-1)
	e.waiters.came = make(chan struct{}, 1)
	e.stuckWait.Store(int64(readStuckWait))
	return e, nil
}

func (e *engine) startWriter() {
	go e.writer()
	go e.watch()
}

// Schema is the schema the engine's tables are in.
func (e *engine) Schema() string { return e.schema }

func backendError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) && !errors.Is(err, work.ErrClosed) {
		return fmt.Errorf("postgres: %w (the queue was closed, or the caller's context ended)", err)
	}
	return fmt.Errorf("postgres: %w", err)
}

// View runs fn in a read-only, repeatable-read transaction: one consistent committed state.
func (e *engine) View(ctx context.Context, fn func(projection.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.isClosed() {
		return errClosed()
	}
	ctx, stop := e.untilClose(ctx)
	defer stop()
	conn, err := e.beginView(ctx) // submittx.go: after a SubmitTx's commit, with its task
	if err != nil {
		return backendError(err)
	}
	defer conn.Release()
	defer rollback(conn)
	if err := fn(viewReader{ctx: ctx, tx: conn.Conn(), st: e.st}); err != nil {
		return err
	}
	return nil
}

// untilClose is ctx, ended also by Close (after its CloseTimeout): a read in flight on a server
// that stopped answering does not hold Close, which waits for the pool's connections.
func (e *engine) untilClose(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

func (e *engine) isClosed() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.closed
}

// ReadLog reads the log in pages, holding no connection while fn runs.
func (e *engine) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	if e.isClosed() {
		return errClosed()
	}
	return e.readRange(ctx, from, 0, fn)
}

func (e *engine) readRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	ctx, stop := e.untilClose(ctx)
	defer stop()
	next := max(from, 1)
	for tries := 1; ; tries++ {
		stuck, err := e.readRangeBounded(ctx, next, to, func(ev events.Event) error {
			if err := fn(ev); err != nil {
				return err
			}
			next, tries = ev.Head().Seq+1, 0 // progress: the tries count again
			return nil
		})
		if !stuck {
			return err
		}
		if tries >= readStuckTries {
			return backendError(fmt.Errorf("postgres: a read of the log from seq %d got no answer in %v, %d times: %w",
				next, e.readStuck(), tries, context.DeadlineExceeded))
		}
	}
}

// readStuckWait bounds a read of the log while it hands out nothing (the time its callback
// takes is not counted; after a row, the bound is up to twice it): a statement that has not
// answered in it — its pooled connection's
// server process stopped or stuck while the socket stays open, which no keepalive notices —
// is ended, and the read goes on from the next event, at most readStuckTries times in a row
// without progress. A reader that keeps its context for its life (a follower: Store.Follow,
// Queue.Follow) would otherwise wait forever. pgx closes a connection whose statement a
// context ended, so the pool does not hand that one out again. 15 s is far above a page's
// read on a loaded server, and notices a stuck read before a dead network would be (about
// 30 s: open's dialer).
var readStuckWait = 15 * time.Second

// readStuck is the engine's readStuckWait (engine.stuckWait).
func (e *engine) readStuck() time.Duration { return time.Duration(e.stuckWait.Load()) }

const readStuckTries = 4

// readRangeBounded is one try of readRange, ended when readStuckWait passes with no row
// handed out and no callback running (stuck: that ended it). A goroutine looks every
// readStuckWait, so a read after rows ends within twice that; a row costs two atomic
// operations, not a timer's reset.
func (e *engine) readRangeBounded(ctx context.Context, from, to uint64, fn func(events.Event) error) (stuck bool, err error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var rows atomic.Int64 // callbacks begun
	var inFn, fired atomic.Bool
	done := make(chan struct{})
	defer close(done)
	wait := e.readStuck()
	go func() {
		t := time.NewTicker(wait)
		defer t.Stop()
		seen := int64(0)
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if n := rows.Load(); n != seen || inFn.Load() {
				seen = n
				continue
			}
			fired.Store(true)
			cancel()
			return
		}
	}()
	var fnErr error
	err = readLog(rctx, e, e.st, from, to, func(seq uint64, body []byte) error {
		if fired.Load() {
			return rctx.Err() // the bound ended the read as this row came: it is read again
		}
		rows.Add(1)
		inFn.Store(true)
		defer inFn.Store(false)
		ev, err := events.Decode(body, seq)
		if err != nil {
			return fmt.Errorf("%w: events row %d: %w", ErrCorruptRow, seq, err)
		}
		fnErr = fn(ev)
		return fnErr
	})
	switch {
	case err == nil:
		return false, nil
	case err == fnErr:
		return false, err // the callback's own error, as it returned it
	case fired.Load() && ctx.Err() == nil:
		return true, err
	}
	return false, backendError(err)
}

// Changed is the Watcher's channel: it receives a value after another process's commit (or
// this one's: the notification is the server's) that may have made work claimable.
func (e *engine) Changed() <-chan struct{} { return e.changed }

func (e *engine) signal() {
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// closeGrace bounds what Close waits for once it has ended every statement: the writer's
// last answers, the listener, the pool's connections.
const closeGrace = 5 * time.Second

// Close stops the writer (the commands already queued are answered first: a group in
// progress commits or fails; the others get the closed error), the listener and the pool.
// It waits for the group in progress at most Options.CloseTimeout: then it ends every
// statement in flight (the writer's callers learn what became of their group, see
// CloseTimeout), and returns after at most closeGrace more, with an error when the
// connections were still busy (they close as their calls end).
func (e *engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.closing)
	e.mu.Unlock()
	if e.queue != nil {
		queues.Delete(e.queue)
	}
	wait := time.NewTimer(e.opts.CloseTimeout)
	defer wait.Stop()
	select {
	case <-e.writerDone:
	case <-wait.C:
	}
	e.cancel()
	poolClosed := make(chan struct{})
	go func() {
		<-e.writerDone
		<-e.watcherDone
		if e.sw != nil {
			<-e.sw.done
		}
		e.pool.Close() // waits for the connections' polite goodbyes
		close(poolClosed)
	}()
	// A connection whose statement was ended says goodbye with a cancel request and waits
	// for the server to close it (15 s in pgx): cut the sockets that still wait after a
	// moment, as on a frozen server or a network that drops every packet.
	select {
	case <-poolClosed:
		return nil
	case <-time.After(time.Second):
		e.sockets.closeAll()
	}
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-poolClosed:
		return nil
	case <-grace.C:
		return fmt.Errorf("postgres: closed, but the server did not answer within %v: connections still in use close as their calls end",
			e.opts.CloseTimeout+closeGrace)
	}
}

// watch listens for the commits of every process on the queue's channel and signals
// Changed; it reconnects (and signals, as it may have missed some) when its connection fails.
func (e *engine) watch() {
	defer close(e.watcherDone)
	wait := 50 * time.Millisecond
	for e.ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(e.ctx, e.listenerConfig())
		if err == nil {
			var slot int
			slot, err = e.startListening(e.ctx, conn, true)
			e.watcherSlot.Store(int32(slot))
			if err == nil {
				wait = 50 * time.Millisecond
				e.listenOn(conn, slot)
			}
			e.watcherSlot.Store(-1)
			conn.Close(context.Background())
		}
		select {
		case <-e.ctx.Done():
		case <-time.After(wait):
			wait = min(2*wait, 2*time.Second)
		}
	}
}

// listenOn is the watcher's loop on conn, registered with slot (-1: none): it signals
// Changed, or the inbox, at each notification, holds the listener keys only while this
// process has waiters (listeners.go, "No waiter, no notification"), and returns when conn
// fails or the queue closes: the caller makes the listener again.
func (e *engine) listenOn(conn *pgx.Conn, slot int) {
	e.signal()
	e.signalInbox() // a SubmitTx may have committed while nobody listened
	w := &e.waiters
	w.held.Store(slot >= 0) // the registration took the keys
	idle := w.start()
	quiet := time.Now() // since the last notification or recheck
	for {
		release := time.Time{} // when hold may let the keys go (zero: never)
		if slot >= 0 {
			if err := w.hold(e.ctx, e, conn, slot, idle); err != nil {
				return
			}
			if w.held.Load() && w.waiting.Load() != nil {
				release = idle.at.Add(watchIdle)
			}
		}
		// Bounded like Store.Follow's wait (follow.go): a listener whose server process
		// stopped with its socket open delivers nothing and fails nothing, and every waiter
		// and Queue.Follow of this process would miss the other processes' commits for as
		// long. After watchRecheck of silence, the waiters and the inbox are woken (they read
		// again: a lost notification costs at most that long) and the listener must answer a
		// ping, or it is made again (follow.go). The wait also ends when hold may let the
		// keys go, and, while they are not held, when a waiter comes.
		recheck := quiet.Add(watchRecheck)
		until := recheck
		if !release.IsZero() && release.Before(until) {
			until = release
		}
		n, err := w.wait(e.ctx, conn, slot < 0 || w.held.Load(), until)
		if err != nil {
			return
		}
		if n == nil && time.Now().Before(recheck) {
			continue // hold's turn, or a waiter's
		}
		quiet = time.Now()
		switch {
		case n == nil: // the recheck
			if pingListener(e.ctx, conn) != nil {
				return
			}
			e.signal()
			e.signalInbox()
		case n.Payload == inboxPayload:
			e.signalInbox()
		default:
			e.signal()
		}
	}
}

// testConfigHook lets a test change the pool's configuration (its DialFunc, to cut the
// network).
var testConfigHook func(*pgxpool.Config)

func isUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}

// socketSet holds the open sockets of an engine's connections (the pool's, the listener's and
// pgx's cancel requests), so that Close can cut those that still wait on a server that stopped
// answering.
type socketSet struct {
	mu   sync.Mutex
	open map[*socket]struct{}
}

type socket struct {
	net.Conn
	set *socketSet
}

func (s *socketSet) add(c net.Conn) net.Conn {
	k := &socket{Conn: c, set: s}
	s.mu.Lock()
	s.open[k] = struct{}{}
	s.mu.Unlock()
	return k
}

func (k *socket) Close() error {
	k.set.mu.Lock()
	delete(k.set.open, k)
	k.set.mu.Unlock()
	return k.Conn.Close()
}

func (s *socketSet) closeAll() {
	s.mu.Lock()
	open := make([]*socket, 0, len(s.open))
	for k := range s.open {
		open = append(open, k)
	}
	s.mu.Unlock()
	for _, k := range open {
		k.Close()
	}
}
