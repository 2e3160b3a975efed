// Package postgres runs worklog's queue on PostgreSQL: the same *work.Queue, the same events
// and the same decide and fold code as the embedded store, on a database that any number of
// processes on any number of hosts share.
//
// The log is the events table (the wire bytes of package events, one row per sequence
// number); the projection is in tables beside it (tasks, wakes, idempotency keys, the
// eligibility indexes, each session's task list, the counts), written in the same
// transaction as the events it folds. projection.Apply runs in Go against a
// projection.State over the transaction: no SQL re-implements a rule.
//
// Every writing transaction locks the one row of log_head first, so sequence numbers are
// gap-free and in commit order across every process; each process keeps its throughput by
// running every command waiting for it in one transaction (group commit, as the Pebble
// store's writer does). docs/design.md §9 describes the schema, the log head and the
// failures.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

var (
	// ErrFormatTooNew: the schema holds tables of a newer worklog format; nothing was changed.
	ErrFormatTooNew = errors.New("postgres: worklog tables of a newer format")
	// ErrNotAQueue: the schema holds some of worklog's tables but not a whole queue (or, for
	// OpenReadOnly, none at all); nothing was changed.
	ErrNotAQueue = errors.New("postgres: not a worklog queue")
	// ErrInvalidDSN: the DSN does not say which schema to use, or cannot be parsed.
	ErrInvalidDSN = errors.New("postgres: invalid DSN")
	// ErrCorruptRow: a stored row does not decode, or the log has a gap. The error names
	// the table and the row.
	ErrCorruptRow = errors.New("postgres: corrupt row")
	// ErrCommitUnknown: the connection failed during a COMMIT and the server could not be
	// asked, within Options.CommitResolveTimeout, whether it committed. The call may or
	// may not have taken effect; an idempotency key makes a retry safe.
	ErrCommitUnknown = errors.New("postgres: commit outcome unknown")
)

// Options configures Open. The zero value (or nil) is the defaults.
type Options struct {
	// MaxValueBytes is the largest JSON value accepted (input, payload, output); 0 means
	// work.DefaultMaxValueBytes.
	MaxValueBytes int
	// Entropy is the randomness for ids and lease tokens; nil means crypto/rand.
	Entropy io.Reader
	// MaxBatchCommands bounds the commands one transaction runs (default 256).
	MaxBatchCommands int
	// MaxConns is the size of the connection pool (default 8): one for the writer, the rest
	// for reads. The change listener holds one more connection of its own.
	MaxConns int32
	// CommitResolveTimeout bounds how long the writer asks the server whether a COMMIT whose
	// connection failed committed, before its callers get ErrCommitUnknown (default 30 s).
	CommitResolveTimeout time.Duration
	// Retention and PruneInterval are work.Options' fields of the same names: with
	// Retention set, the queue prunes in the background, every PruneInterval (default
	// work.DefaultPruneInterval), what became prunable more than Retention ago. Several
	// processes may each do so: their prunes take turns on the log head like every write.
	Retention, PruneInterval time.Duration
	// Logger receives the background pruner's messages. Default: discarded.
	Logger *slog.Logger
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
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
	return r
}

func (o *Options) validate() error {
	bad := func(field, msg string) error {
		return &work.Error{Kind: work.ErrInvalidRequest, Field: "options." + field, Message: msg}
	}
	switch {
	case o.MaxValueBytes < 0:
		return bad("MaxValueBytes", "must not be negative")
	case o.MaxBatchCommands < 1:
		return bad("MaxBatchCommands", "must be positive")
	case o.MaxConns < 2:
		return bad("MaxConns", "must be at least 2 (the writer's connection and one for reads)")
	case o.CommitResolveTimeout < 0:
		return bad("CommitResolveTimeout", "must not be negative")
	case o.Retention < 0:
		return bad("Retention", "must not be negative (0 keeps all history)")
	case o.PruneInterval < 0:
		return bad("PruneInterval", "must not be negative (0 is the default, one minute)")
	}
	return nil
}

// engine is internal/engine.Engine on PostgreSQL.
type engine struct {
	pool    *pgxpool.Pool
	schema  string
	channel string
	st      *statements
	opts    Options

	ctx    context.Context // ends at Close: every statement in flight stops
	cancel context.CancelFunc

	mu         sync.RWMutex // closed, and sending to cmds
	closed     bool
	cmds       chan *command
	closing    chan struct{}
	writerDone chan struct{}
	cache      *cache // the writer's

	changed     chan struct{}
	watcherDone chan struct{}

	// savepointEach: a SAVEPOINT round trip before each command of a group, only to measure
	// what a savepoint-per-command design would cost (BenchmarkSubmit); never set otherwise.
	savepointEach bool

	// Test hooks: around sending the commit batch (close the connection to lose it).
	hookBeforeCommit    func(*pgx.Conn)
	hookAfterCommitSent func(*pgx.Conn)
}

var (
	_ engineapi.Engine  = (*engine)(nil)
	_ engineapi.Watcher = (*engine)(nil)
)

// Open connects to the database dsn names (a postgres:// URL or key=value DSN, as pgx
// parses it) and returns a queue whose tables live in the schema the DSN's search_path names
// first (the server's current_schema() when it names none), so one database holds several
// queues. It creates the schema and its tables when they are missing, and refuses a schema
// of a newer format (ErrFormatTooNew) or one holding part of a queue (ErrNotAQueue), naming
// the schema, without changing it. Errors are ErrBackend errors wrapping those; invalid
// options are ErrInvalidRequest naming the field ("options.MaxConns").
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
	// The background pruner is work's (Queue.Close stops it before it closes this engine).
	return work.NewEngineQueue(e, engineapi.Config{MaxValueBytes: o.MaxValueBytes, Entropy: o.Entropy,
		Retention: o.Retention, PruneInterval: o.PruneInterval, Logger: o.Logger, Clock: clock.Now}), nil
}

func open(ctx context.Context, dsn string, o Options, readOnly bool) (*engine, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidDSN, err)
	}
	cfg.MaxConns = o.MaxConns
	if testConfigHook != nil {
		testConfigHook(cfg)
	}
	if readOnly {
		// Every transaction of the pool is read-only: the server refuses any write.
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	schema, err := schemaOf(ctx, pool)
	if err == nil {
		err = ensureSchema(ctx, pool, schema, readOnly)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	ectx, cancel := context.WithCancel(context.Background())
	e := &engine{
		pool: pool, schema: schema, channel: channelName(schema), st: newStatements(schema), opts: o,
		ctx: ectx, cancel: cancel, cmds: make(chan *command, 4096), closing: make(chan struct{}),
		writerDone: make(chan struct{}), cache: newCache(), changed: make(chan struct{}, 1),
		watcherDone: make(chan struct{}),
	}
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
	tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return backendError(err)
	}
	defer tx.Rollback(context.Background())
	if err := fn(viewReader{ctx: ctx, tx: tx, st: e.st}); err != nil {
		return err
	}
	return nil
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
	var fnErr error
	err := readLog(ctx, e.pool, e.st, from, to, func(seq uint64, body []byte) error {
		ev, err := events.Decode(body, seq)
		if err != nil {
			return fmt.Errorf("%w: events row %d: %w", ErrCorruptRow, seq, err)
		}
		fnErr = fn(ev)
		return fnErr
	})
	if err != nil && err == fnErr {
		return err // the callback's own error, as it returned it
	}
	return backendError(err)
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

// Close stops the writer (the commands already queued are answered first: a group in
// progress commits or fails; the others get the closed error), the listener and the pool.
func (e *engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.closing)
	e.mu.Unlock()
	<-e.writerDone
	e.cancel()
	<-e.watcherDone
	e.pool.Close()
	return nil
}

// watch listens for the commits of every process on the queue's channel and signals
// Changed; it reconnects (and signals, as it may have missed some) when its connection fails.
func (e *engine) watch() {
	defer close(e.watcherDone)
	wait := 50 * time.Millisecond
	for e.ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(e.ctx, e.pool.Config().ConnConfig.Copy())
		if err == nil {
			_, err = conn.Exec(e.ctx, "LISTEN "+pgx.Identifier{e.channel}.Sanitize())
			if err == nil {
				wait = 50 * time.Millisecond
				e.signal()
				for {
					if _, err = conn.WaitForNotification(e.ctx); err != nil {
						break
					}
					e.signal()
				}
			}
			conn.Close(context.Background())
		}
		select {
		case <-e.ctx.Done():
		case <-time.After(wait):
			wait = min(2*wait, 2*time.Second)
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
