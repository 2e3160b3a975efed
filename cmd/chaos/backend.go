package main

import (
	"bufio"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

const (
	envRole    = "CHAOS_ROLE"
	envID      = "CHAOS_ID"
	envInc     = "CHAOS_INC"
	envDSN     = "CHAOS_DSN"
	envStore   = "CHAOS_STORE"
	envHist    = "CHAOS_HIST"
	envSeed    = "CHAOS_SEED"
	envSkew    = "CHAOS_SKEW"
	envGroups  = "CHAOS_GROUPS"
	envMaxOps  = "CHAOS_MAXOPS"
	keysPerRun = 24
)

// proc is one client process (PostgreSQL) or the owning process (Pebble).
type proc struct {
	id, inc int
	name    string // "c2.1"; the owning process's groups are "g2.1"
	cmd     *exec.Cmd
	done    chan struct{}
	ctl     io.WriteCloser // the owning process's stdin (Pebble): link cuts
}

type cluster struct {
	cfg     config
	backend string
	dir     string
	h       *hist // the controller's: nemesis actions, process ends
	rng     *rand.Rand

	mu      sync.Mutex
	procs   []*proc // by client id (Pebble: one)
	proxies []*proxy
	server  *pgtest.Server
	dsn     string // direct, with the run's search_path
	store   string
	skews   []time.Duration
}

func (c *cluster) env(p *proc) []string {
	e := append(os.Environ(),
		envID+"="+strconv.Itoa(p.id), envInc+"="+strconv.Itoa(p.inc), envHist+"="+c.dir,
		envSeed+"="+strconv.FormatInt(c.cfg.seed*1000+int64(p.id*100+p.inc), 10),
		envMaxOps+"="+strconv.Itoa(c.cfg.maxOps))
	if c.backend == "postgres" {
		e = append(e, envRole+"=client", envDSN+"="+proxiedDSN(c.dsn, c.proxies[p.id].addr()),
			envSkew+"="+c.skews[p.id].String())
	} else {
		s := ""
		for i, k := range c.skews {
			if i > 0 {
				s += ","
			}
			s += k.String()
		}
		e = append(e, envRole+"=owner", envStore+"="+c.store, envGroups+"="+strconv.Itoa(c.cfg.clients), envSkew+"="+s)
	}
	return e
}

func proxiedDSN(dsn, addr string) string {
	// The server's DSN is postgres://postgres@127.0.0.1:PORT/postgres?...: swap the address.
	at := indexOf(dsn, "@")
	slash := indexOf(dsn[at:], "/") + at
	return dsn[:at+1] + addr + dsn[slash:]
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// start starts incarnation inc of process id.
func (c *cluster) start(id, inc int) error {
	p := &proc{id: id, inc: inc, done: make(chan struct{})}
	p.name = fmt.Sprintf("c%d.%d", id, inc)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.OpenFile(fmt.Sprintf("%s/%s.log", c.dir, p.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.cmd = exec.Command(self, "-test.run=^TestChaosChild$")
	p.cmd.Env = c.env(p)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if c.backend == "pebble" {
		if p.ctl, err = p.cmd.StdinPipe(); err != nil {
			log.Close()
			return err
		}
	}
	// The child dies with its parent, whatever ends the parent.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	c.h.write(rec{T: "nemesis", F: "start", Target: p.name, Pid: p.cmd.Process.Pid})
	go func() {
		err := p.cmd.Wait()
		log.Close()
		c.h.write(rec{T: "nemesis", F: "exit", Target: p.name})
		if ps := p.cmd.ProcessState; err != nil && ps != nil && ps.ExitCode() > 0 {
			// It ended by itself with an error (a signal of ours gives -1): the checker
			// counts it.
			c.h.write(rec{T: "nemesis", F: "crash", Target: p.name, Err: err.Error()})
		}
		close(p.done)
	}()
	c.mu.Lock()
	for len(c.procs) <= id {
		c.procs = append(c.procs, nil)
	}
	c.procs[id] = p
	c.mu.Unlock()
	return nil
}

func (c *cluster) signal(p *proc, sig syscall.Signal, what string) {
	c.h.write(rec{T: "nemesis", F: what, Target: p.name, Pid: p.cmd.Process.Pid})
	p.cmd.Process.Signal(sig)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (c *cluster) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)+1))
}

// nemesis runs faults, one at a time, chosen from the seed, until ctx ends.
func (c *cluster) nemesis(ctx context.Context) {
	var faults []string
	for _, n := range c.cfg.nemeses {
		switch {
		case n == "skew": // given to the processes when they start
		case c.backend == "pebble" && (n == "restart" || n == "terminate"):
			// No server apart from the owning process.
		default:
			faults = append(faults, n)
		}
	}
	if len(faults) == 0 {
		<-ctx.Done()
		return
	}
	for ctx.Err() == nil {
		sleepCtx(ctx, c.between(300*time.Millisecond, 1500*time.Millisecond))
		if ctx.Err() != nil {
			return
		}
		f := faults[c.rng.IntN(len(faults))]
		i := c.rng.IntN(len(c.procs))
		p := c.procs[i]
		hold := c.between(500*time.Millisecond, 4*time.Second)
		switch f {
		case "kill":
			c.signal(p, syscall.SIGKILL, "kill")
			<-p.done
			sleepCtx(context.Background(), c.between(100*time.Millisecond, time.Second))
			if err := c.start(p.id, p.inc+1); err != nil {
				c.h.write(rec{T: "nemesis", F: "error", Err: err.Error()})
				return
			}
		case "pause":
			c.signal(p, syscall.SIGSTOP, "stop")
			sleepCtx(ctx, hold)
			c.signal(p, syscall.SIGCONT, "cont")
		case "partition":
			mode := []string{"freeze", "drop", "delay"}[c.rng.IntN(3)]
			hold += 1500 * time.Millisecond // past the runner's lease
			delay := c.between(20*time.Millisecond, 300*time.Millisecond)
			if c.backend == "pebble" {
				// A group's link inside the owning process.
				g := c.rng.IntN(c.cfg.clients)
				target := fmt.Sprintf("g%d.%d", g, p.inc)
				c.h.write(rec{T: "nemesis", F: "partition-" + mode, Target: target})
				fmt.Fprintf(p.ctl, "%d %s %d\n", g, mode, delay)
				sleepCtx(ctx, hold)
				fmt.Fprintf(p.ctl, "%d heal 0\n", g)
				c.h.write(rec{T: "nemesis", F: "heal", Target: target})
				continue
			}
			px := c.proxies[i]
			c.h.write(rec{T: "nemesis", F: "partition-" + mode, Target: p.name})
			px.set(mode, delay)
			sleepCtx(ctx, hold)
			px.set("", 0)
			c.h.write(rec{T: "nemesis", F: "heal", Target: p.name})
		case "restart":
			c.h.write(rec{T: "nemesis", F: "pg-stop-immediate", Target: "server"})
			if err := c.server.StopServer("immediate"); err != nil {
				c.h.write(rec{T: "nemesis", F: "error", Err: err.Error()})
			}
			sleepCtx(context.Background(), c.between(100*time.Millisecond, 2*time.Second))
			if err := c.server.StartServer(); err != nil {
				c.h.write(rec{T: "nemesis", F: "error", Err: err.Error()})
				return
			}
			c.h.write(rec{T: "nemesis", F: "pg-start", Target: "server"})
		case "terminate":
			c.h.write(rec{T: "nemesis", F: "pg-terminate-backend", Target: "server"})
			c.server.Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity " +
				"WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND random() < 0.5")
		}
	}
}

// runBackend runs one backend's clients and nemesis for cfg.duration, stops them and checks.
func runBackend(ctx context.Context, cfg config, backend, dir string) result {
	res := result{seed: cfg.seed}
	seed := uint64(cfg.seed)
	if backend == "postgres" {
		seed++
	}
	h, err := newHist(dir+"/nemesis.jsonl", "nemesis")
	if err != nil {
		res.err = err
		return res
	}
	defer h.close()
	c := &cluster{cfg: cfg, backend: backend, dir: dir, h: h, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))}
	c.skews = make([]time.Duration, cfg.clients)
	if contains(cfg.nemeses, "skew") && cfg.skew > 0 {
		for i := range c.skews {
			c.skews[i] = c.between(-cfg.skew, cfg.skew)
		}
	}
	defer c.cleanup()
	var q *work.Queue
	switch backend {
	case "postgres":
		var s *pgtest.Server
		s, err = pgtest.Start()
		if err != nil {
			res.skipped = append(res.skipped, "postgres")
			res.err = fmt.Errorf("no PostgreSQL server: %w", err)
			return res
		}
		c.server = s
		schema := fmt.Sprintf("chaos_%d", cfg.seed)
		if err := s.Exec("CREATE SCHEMA " + schema); err != nil {
			res.err = err
			return res
		}
		c.dsn = pgtest.WithSearchPath(s.DSN, schema)
		for i := 0; i < cfg.clients; i++ {
			px, err := newProxy(fmt.Sprintf("127.0.0.1:%s", portOf(s.DSN)))
			if err != nil {
				res.err = err
				return res
			}
			c.proxies = append(c.proxies, px)
		}
		q, err = postgres.Open(ctx, c.dsn, nil)
	default:
		c.store = dir + "/store"
		q, err = work.Open(c.store, nil)
	}
	if err != nil {
		res.err = err
		return res
	}
	for k, p := range map[string]work.KindPolicy{kindLimited: {MaxRunning: limitedMax}, kindRunOne: {MaxRunning: 1}} {
		if err := q.SetKindPolicy(ctx, k, p); err != nil {
			q.Close()
			res.err = err
			return res
		}
	}
	q.Close()
	procs := cfg.clients
	if backend == "pebble" {
		procs = 1
	}
	for i := 0; i < procs; i++ {
		if err := c.start(i, 0); err != nil {
			res.err = err
			return res
		}
	}
	nctx, cancel := context.WithTimeout(ctx, cfg.duration)
	c.nemesis(nctx)
	cancel()
	// Heal, let the runners end their handlers, and stop every process (SIGTERM: a graceful
	// end that writes the last completions; SIGKILL after 15 s).
	for _, px := range c.proxies {
		px.set("", 0)
	}
	if c.server != nil {
		c.server.StartServer() // an error: it runs
	}
	for _, p := range c.procs {
		c.signal(p, syscall.SIGCONT, "cont")
		c.signal(p, syscall.SIGTERM, "term")
	}
	for _, p := range c.procs {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			c.signal(p, syscall.SIGKILL, "kill")
			<-p.done
		}
	}
	if ctx.Err() != nil {
		res.err = ctx.Err()
		return res
	}
	return c.check(context.Background(), res)
}

func portOf(dsn string) string {
	at := indexOf(dsn, "@")
	rest := dsn[at+1:]
	colon := indexOf(rest, ":")
	slash := indexOf(rest, "/")
	return rest[colon+1 : slash]
}

// cleanup ends every process and server the run started.
func (c *cluster) cleanup() {
	for _, p := range c.procs {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	for _, px := range c.proxies {
		px.close()
	}
	if c.server != nil {
		c.server.Stop()
	}
}

// openFinal opens the queue for the final reads, directly (no proxy).
func (c *cluster) openFinal(ctx context.Context) (*work.Queue, error) {
	if c.backend == "postgres" {
		return postgres.Open(ctx, c.dsn, nil)
	}
	return work.Open(c.store, nil)
}

// clientMain is a client process on PostgreSQL: one client on its own queue, through its
// proxy.
func clientMain() int {
	id, _ := strconv.Atoi(os.Getenv(envID))
	inc, _ := strconv.Atoi(os.Getenv(envInc))
	skew, _ := time.ParseDuration(os.Getenv(envSkew))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	oc, cancel := context.WithTimeout(ctx, time.Minute)
	var q *work.Queue
	var err error
	for {
		// The server may be restarting, the proxy cut: try until it answers.
		q, err = postgres.Open(oc, os.Getenv(envDSN), nil)
		if err == nil || oc.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos client:", err)
		return 1
	}
	defer q.Close()
	c, err := newClient(q, fmt.Sprintf("c%d.%d", id, inc), skew)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos client:", err)
		return 1
	}
	c.serve(ctx)
	return 0
}

func newClient(q *work.Queue, name string, skew time.Duration) (*client, error) {
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	h, err := newHist(fmt.Sprintf("%s/%s.jsonl", os.Getenv(envHist), name), name)
	if err != nil {
		return nil, err
	}
	// Each client's choices come from the run's seed and its name (g2.1: group 2 of the owning
	// process's incarnation 1).
	f := fnv.New64a()
	f.Write([]byte(name))
	stream := f.Sum64()
	c := &client{q: q, h: h, rng: rand.New(rand.NewPCG(seed, stream)), hrng: rand.New(rand.NewPCG(seed, stream+1)),
		skew: skew, keys: keysPerRun}
	if err := c.startRunner(name); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *client) serve(ctx context.Context) {
	maxOps, _ := strconv.Atoi(os.Getenv(envMaxOps))
	c.loop(ctx, maxOps)
	<-ctx.Done()
	c.stopRunner()
	c.h.close()
}

// ownerMain is the process that owns the Pebble store: Pebble is embedded and single-process
// (the store is locked by the process that opened it, and worklog has no server to reach
// it), so the clients are goroutine groups of this process, each with its own history, its
// own clock skew and its own runner; the nemesis kills, pauses and restarts this process.
func ownerMain() int {
	inc, _ := strconv.Atoi(os.Getenv(envInc))
	groups, _ := strconv.Atoi(os.Getenv(envGroups))
	var skews []time.Duration
	for _, s := range splitComma(os.Getenv(envSkew)) {
		d, _ := time.ParseDuration(s)
		skews = append(skews, d)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	q, err := work.Open(os.Getenv(envStore), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos owner:", err)
		return 1
	}
	defer q.Close()
	var wg sync.WaitGroup
	links := make([]*link, groups)
	for g := 0; g < groups; g++ {
		var skew time.Duration
		if g < len(skews) {
			skew = skews[g]
		}
		links[g] = newLink(q)
		c, err := newClient(work.New(links[g]), fmt.Sprintf("g%d.%d", g, inc), skew)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos owner:", err)
			return 1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.serve(ctx)
		}()
	}
	// The controller cuts and heals the groups' links through stdin: "<group> <mode> <delay>".
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var g int
			var mode string
			var delay time.Duration
			if _, err := fmt.Sscan(sc.Text(), &g, &mode, &delay); err != nil || g < 0 || g >= groups {
				continue
			}
			if mode == "heal" {
				mode = ""
			}
			links[g].set(mode, delay)
		}
	}()
	wg.Wait()
	return 0
}

func splitComma(s string) []string {
	var out []string
	for s != "" {
		i := indexOf(s, ",")
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i])
		s = s[i+1:]
	}
	return out
}
