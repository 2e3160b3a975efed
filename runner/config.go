package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/work"
)

// Handler runs one task. A nil error settles the task as succeeded with the returned output
// (a JSON value, or nil for null); an error releases it for a retry after a backoff, or fails
// it when the attempts are used up or the error is Permanent. The context is canceled when a
// cancel of the task is requested (the task then settles as canceled if the handler returns
// an error), when the runner loses the task's lease, or when a graceful stop runs out of time
// (in the last two cases nothing the handler returns is recorded).
type Handler func(ctx context.Context, t work.Task) (json.RawMessage, error)

// WakeHandler handles one wake; the wake is acknowledged when it returns nil. After an error
// (or a panic) the wake is not acknowledged and is delivered again once its lease expires.
type WakeHandler func(ctx context.Context, w work.Wake) error

// Defaults of Config's optional fields.
const (
	DefaultMaxAttempts     = 25
	DefaultWakeConcurrency = 4
	DefaultBackoffBase     = time.Second
	DefaultBackoffMax      = time.Hour
)

// Config configures a Runner. Handlers, Concurrency and LeaseFor are required; every other
// field has a default, which its zero value stands for. New checks every field in one step
// (a *ConfigError naming the first out of range) before the runner starts.
type Config struct {
	// Handlers maps each task kind the runner runs to its handler; the runner claims only
	// these kinds. It may be empty when WakeHandler is set: the runner then handles wakes
	// only, and claims no tasks (Concurrency may then be 0).
	Handlers map[string]Handler
	// Concurrency is the number of task handlers that may run at once (> 0).
	Concurrency int
	// Prefetch is how many tasks the runner may hold claimed beyond Concurrency, waiting for
	// a free slot (>= 0; default 0). A slot that frees then starts the next task at once,
	// without waiting for a claim's round trip (an fsync on a durable store), which is what
	// bounds the throughput of short handlers (docs/performance.md). The cost: those tasks'
	// leases run (and are heartbeaten) while they wait, and another runner cannot take
	// them meanwhile; Stop releases them at once.
	Prefetch int
	// LeaseFor is the lease of each claim (> 0); heartbeats renew it while a handler runs.
	LeaseFor time.Duration
	// Heartbeat is how often a running task's lease is extended; 0: LeaseFor/3. It must be
	// shorter than LeaseFor.
	Heartbeat time.Duration
	// LeaseMargin is how long before its lease runs out a handler's context ends when the
	// lease could not be extended (the queue cannot be reached: heartbeats fail with
	// work.ErrBackend): the context's cause is then ErrLeaseExpired, and the runner neither
	// settles nor releases the task (another worker may claim it once the lease expires), so
	// that two handlers of one task never run at once. The runner counts the lease on its own
	// monotonic clock from the moment it sent the call that set it (the claim, or the last
	// heartbeat that succeeded): the handler's context ends at that moment + LeaseFor -
	// LeaseMargin, never later than the lease on the queue's clock, whatever the offset
	// between the two clocks. LeaseMargin covers the rest: the time the handler takes to
	// return once its context ends, a late timer on a loaded host, and a drift in rate
	// between the clocks. 0: LeaseFor/5, or (LeaseFor-Heartbeat)/2 when that is shorter. It
	// must be shorter than LeaseFor-Heartbeat, else the context would end before a
	// heartbeat could extend the lease.
	LeaseMargin time.Duration
	// Timeout is the longest one attempt may run (> 0; 0: no limit). When an attempt runs
	// past its limit the handler's context is canceled with a cause that matches ErrTimeout
	// ("timeout after D"), and the attempt ends as a failure: retried after Backoff, up to
	// MaxAttempts, like any error (TaskResult.Err, the log and the hooks say "timeout after
	// D"). The runner stops extending the lease then: a handler that returns within what is
	// left of it (at least LeaseFor-Heartbeat-LeaseMargin) has its failure recorded; one
	// that ignores its context keeps its slot until it returns, and when its lease runs out
	// first its context's lease deadline passes (ErrLeaseExpired), nothing is recorded and
	// the task is delivered again once the lease expires. A late result is discarded, never
	// recorded twice. The limit and the lease share one deadline per attempt: the context
	// ends at the earlier of the two.
	Timeout time.Duration
	// KindTimeouts overrides Timeout for the kinds it names (each a kind of Handlers, each
	// limit > 0).
	KindTimeouts map[string]time.Duration
	// MaxAttempts is the number of attempts a task gets (claims, redeliveries after a crash
	// included): an error on the last one fails the task, and a task claimed beyond it
	// (its earlier workers died) fails without running. 0: DefaultMaxAttempts. Only the
	// attempts since the task was last retried count (work.Task.AttemptsAtRetry): a task an
	// operator retries with Session.Retry gets MaxAttempts more, and Backoff's attempt
	// starts again at 1.
	//
	// The collateral cost of a poison task: a task that kills the process (a crash, an
	// os.Exit, a fatal error a recover cannot catch) costs an attempt to every task this
	// runner held at that moment (the ones running beside it and the prefetched ones, all
	// claimed, each claim an attempt), since their attempts end without a result too. A
	// poison task is failed after MaxAttempts claims, but the tasks that kept company with it
	// may have lost as many attempts meanwhile: with a small MaxAttempts they can fail
	// without ever having failed themselves. Keep MaxAttempts well above the crashes an
	// innocent task may witness, or run suspect kinds in a runner of their own (Concurrency
	// 1, Prefetch 0).
	MaxAttempts int
	// Backoff is how long a task waits before its next attempt after attempt failed with
	// err; nil: ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax).
	Backoff func(attempt uint32, err error) time.Duration

	// WakeHandler, when set, handles the queue's wakes, with up to WakeConcurrency (0:
	// DefaultWakeConcurrency) at once and a lease of WakeLeaseFor (0: LeaseFor) each.
	WakeHandler     WakeHandler
	WakeConcurrency int
	WakeLeaseFor    time.Duration
	// WakeSessions, when not empty, restricts the wake handler to the wakes of these sessions
	// (work.Queue.ClaimSessionWakes): a runtime that serves some sessions leaves the others'
	// wakes to other runners. Empty: every session's wakes (ClaimWakes). It needs WakeHandler.
	WakeSessions []string

	// WorkerID is the worker identity every claim of this runner records (work.WithWorker:
	// the claim events, the deliveries' Worker, replay's attempts); at most 256 bytes.
	// "": work.DefaultWorker(), "<host name>:<process id>".
	WorkerID string

	// Logger receives the runner's log; nil: slog.Default().
	Logger *slog.Logger
	// Hooks, when set, is told about every task and wake the runner handles (metrics,
	// tracing); nil: none (NoHooks).
	Hooks Hooks
}

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError. It is work.ErrInvalidOptions
// (the same value): the one sentinel of every worklog options struct.
var ErrInvalidConfig = work.ErrInvalidOptions

// ConfigError is New's refusal of a Config: Options is "runner.Config", Field names the field
// and Message says what is wrong. It is work.OptionError (the same type): the one error shape
// of every worklog options struct.
type ConfigError = work.OptionError

// validate returns a *ConfigError naming the first field of cfg out of range, or nil. A zero
// optional field stands for its default and is valid. New calls it before anything starts.
func (cfg *Config) validate() error {
	bad := func(field, msg string) error { return optionerr.New("runner.Config", field, msg) }
	if len(cfg.Handlers) == 0 && cfg.WakeHandler == nil {
		// A runner of wakes alone has no kinds: it claims no tasks.
		return bad("Handlers", "must register at least one kind (or set WakeHandler)")
	}
	for k, h := range cfg.Handlers {
		if strings.TrimSpace(k) == "" {
			return bad("Handlers", "has a blank kind")
		}
		if h == nil {
			return bad("Handlers", fmt.Sprintf("kind %q has a nil handler", k))
		}
	}
	switch {
	case cfg.Concurrency < 0 || cfg.Concurrency == 0 && len(cfg.Handlers) > 0:
		return bad("Concurrency", "must be positive")
	case cfg.Prefetch < 0:
		return bad("Prefetch", "must not be negative")
	case cfg.LeaseFor <= 0:
		return bad("LeaseFor", "must be positive")
	case cfg.Heartbeat < 0:
		return bad("Heartbeat", "must not be negative (0 is the default, LeaseFor/3)")
	case cfg.Heartbeat >= cfg.LeaseFor:
		return bad("Heartbeat", "must be shorter than LeaseFor")
	case cfg.LeaseMargin < 0:
		return bad("LeaseMargin", "must not be negative (0 is the default, LeaseFor/5)")
	case cfg.LeaseMargin > 0 && cfg.LeaseMargin >= cfg.LeaseFor-cfg.heartbeat():
		return bad("LeaseMargin", fmt.Sprintf("must be shorter than LeaseFor-Heartbeat (%v): the handler's context would end before a heartbeat could extend the lease",
			cfg.LeaseFor-cfg.heartbeat()))
	case cfg.Timeout < 0:
		return bad("Timeout", "must not be negative (0 is the default: no limit)")
	case cfg.MaxAttempts < 0:
		return bad("MaxAttempts", fmt.Sprintf("must not be negative (0 is the default, %d)", DefaultMaxAttempts))
	case cfg.WakeConcurrency < 0:
		return bad("WakeConcurrency", fmt.Sprintf("must not be negative (0 is the default, %d)", DefaultWakeConcurrency))
	case cfg.WakeLeaseFor < 0:
		return bad("WakeLeaseFor", "must not be negative (0 is the default, LeaseFor)")
	case len(cfg.WorkerID) > events.MaxWorker:
		return bad("WorkerID", fmt.Sprintf("is %d bytes, longer than %d", len(cfg.WorkerID), events.MaxWorker))
	case len(cfg.WakeSessions) > 0 && cfg.WakeHandler == nil:
		return bad("WakeSessions", "needs WakeHandler")
	}
	for _, k := range slices.Sorted(maps.Keys(cfg.KindTimeouts)) {
		switch d := cfg.KindTimeouts[k]; {
		case d <= 0:
			return bad("KindTimeouts", fmt.Sprintf("kind %q has a limit of %v, not positive", k, d))
		case cfg.Handlers[k] == nil:
			return bad("KindTimeouts", fmt.Sprintf("kind %q has no handler", k))
		}
	}
	for _, sess := range cfg.WakeSessions {
		if strings.TrimSpace(sess) == "" {
			return bad("WakeSessions", "has a blank session")
		}
	}
	return nil
}

// heartbeat is Heartbeat, or its default when it is 0.
func (cfg *Config) heartbeat() time.Duration {
	if cfg.Heartbeat != 0 {
		return cfg.Heartbeat
	}
	if hb := cfg.LeaseFor / 3; hb > 0 {
		return hb
	}
	return cfg.LeaseFor
}

// withDefaults returns cfg with every zero optional field set to its default.
func (cfg Config) withDefaults() Config {
	cfg.Heartbeat = cfg.heartbeat()
	if cfg.LeaseMargin == 0 {
		cfg.LeaseMargin = min(cfg.LeaseFor/5, (cfg.LeaseFor-cfg.Heartbeat)/2)
	}
	cfg.KindTimeouts = maps.Clone(cfg.KindTimeouts)
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Backoff == nil {
		cfg.Backoff = ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax)
	}
	if cfg.WakeConcurrency == 0 {
		cfg.WakeConcurrency = DefaultWakeConcurrency
	}
	if cfg.WakeLeaseFor == 0 {
		cfg.WakeLeaseFor = cfg.LeaseFor
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Hooks == nil {
		cfg.Hooks = NoHooks{}
	}
	cfg.WakeSessions = slices.Clone(cfg.WakeSessions)
	return cfg
}

// New checks cfg and returns a runner over q. A bad configuration is a *ConfigError naming
// the field (a nil q: Options "runner.New", Field "q").
func New(q *work.Queue, cfg Config) (*Runner, error) {
	if q == nil {
		return nil, optionerr.New("runner.New", "q", "must not be nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	kinds := slices.Sorted(maps.Keys(cfg.Handlers))
	hb := cfg.Heartbeat
	// Every call to the queue derives its context from base, so every claim records the
	// runner's worker identity.
	base := context.Background()
	if cfg.WorkerID != "" {
		base = work.WithWorker(base, cfg.WorkerID)
	}
	r := &Runner{q: q, cfg: cfg, kinds: kinds, log: cfg.Logger, hooks: cfg.Hooks, heartbeat: hb,
		maxAttempts: uint32(min(cfg.MaxAttempts, 1<<31)), free: cfg.Concurrency + cfg.Prefetch, slots: cfg.Concurrency,
		running: make(map[*task]struct{}), kick: make(chan struct{}, 1)}
	r.claimCtx, r.claimCancel = context.WithCancel(base)
	r.runCtx, r.runCancel = context.WithCancel(context.Background())
	r.lifeCtx, r.giveUp = context.WithCancelCause(base)
	r.callBound = max(cfg.LeaseFor, cfg.WakeLeaseFor, minCallBound)
	return r, nil
}

// Kinds returns the task kinds the runner claims, sorted.
func (r *Runner) Kinds() []string { return slices.Clone(r.kinds) }
