package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/console"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

const serveLong = `Serve the web console (package console) over a store, read-only: the overview, sessions
with their timelines, each task's history with the fold's rules, the log, stats and verify, each
at any past seq (?at_seq=N). Open it in a browser at the address printed.

DIR is a Pebble store: one that no process holds is opened read-only and nothing in it is
changed; one that a running process holds (work.Open) is served live through that process's
inspection endpoint, as is a postgres:// URL: each page reads what was committed since the
last. --archive DIR reads the store's archive of pruned events with it.

The console listens on 127.0.0.1 (this machine only) unless --addr names another interface.
It answers only to the Host names it listens on: localhost and the loopback addresses, the
address of --addr (every address of this machine's interfaces for 0.0.0.0 or ::), and each
name given with --allow-host; any other Host gets 421 Misdirected Request, so that a page of
another site cannot read the store through a DNS name of its own that points here (DNS
rebinding). It has no login of its own: mount package console in your application, with
console.Options.Authorize, to expose it further.`

func (a *app) serveCommand() *cobra.Command {
	var addr string
	var allow []string
	c := &cobra.Command{
		Use:   "serve DIR|URL",
		Short: "Serve the web console over a store, read-only",
		Long:  serveLong,
		Example: `  replay serve ./store
  replay serve ./store --addr 127.0.0.1:9000
  replay serve ./store --addr 0.0.0.0:9000 --allow-host ops-box.internal
  replay serve postgres://localhost/app`,
		Args: storeArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			return a.serve(c.Context(), displayName(args[0]), addr, allow, nil)
		},
	}
	c.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "the address to listen on (host:port); the default answers this machine only")
	allowHostFlag(c, &allow, "")
	return c
}

// allowHostFlag is serve's and demo's --allow-host; what prefixes its help.
func allowHostFlag(c *cobra.Command, allow *[]string, what string) {
	c.Flags().StringArrayVar(allow, "allow-host", nil, what+"also answer to the Host `NAME` (a host name or address, optionally with :port; repeat for more); \"*\" answers to any Host and turns off the DNS-rebinding check")
}

// serveHosts is what the console of replay serve answers to besides the loopback names:
// the address it listens on (each of this machine's interface addresses when that is
// 0.0.0.0 or ::), then the --allow-host names.
func serveHosts(ln net.Addr, allow []string) []string {
	var hosts []string
	host, _, _ := net.SplitHostPort(ln.String())
	ip := net.ParseIP(host)
	switch {
	case ip == nil, ip.IsLoopback():
	case ip.IsUnspecified():
		addrs, _ := net.InterfaceAddrs() // none on an error: the loopback names and --allow-host remain
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				hosts = append(hosts, n.IP.String())
			}
		}
	default:
		hosts = append(hosts, ip.String())
	}
	return append(hosts, allow...)
}

// serve opens dir read-only, builds a queue over it and serves the console on addr until
// ctx ends, answering to the Host names of serveHosts. ready, when not nil, receives the
// listening address (tests).
func (a *app) serve(ctx context.Context, dir, addr string, allow []string, ready chan<- string) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	st, err := a.openStore(dir)
	if err != nil {
		return err
	}
	q, err := readOnlyQueue(st, isPostgresURL(dir) || isLive(st))
	if err != nil {
		st.Close()
		return err
	}
	defer q.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v", addr, err)
	}
	defer ln.Close()
	hosts := serveHosts(ln.Addr(), allow)
	// Read-only: no Actions (console's default), so every POST is refused.
	h, err := console.New(q, &console.Options{AllowedHosts: hosts, Logger: slog.New(slog.NewTextHandler(a.stderr, nil))})
	var oe *console.OptionError
	if errors.As(err, &oe) && oe.Field == "AllowedHosts" {
		return fmt.Errorf("--allow-host: %s", oe.Message)
	}
	if err != nil {
		return fmt.Errorf("%s: %v", dir, err)
	}
	url := "http://" + ln.Addr().String() + "/"
	scope := "this machine only"
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		scope = "every host that can reach " + host + ": the console has no login of its own"
	}
	fmt.Fprintf(a.out, "Serving the console of %s read-only at %s (listening on %s: %s). Ctrl-C stops.\n", dir, url, ln.Addr(), scope)
	names := "localhost and the loopback addresses"
	if len(hosts) > 0 {
		names += ", " + strings.Join(hosts, ", ")
	}
	if slices.Contains(hosts, "*") {
		names = "any Host (--allow-host \"*\": the DNS-rebinding check is off)"
	}
	fmt.Fprintf(a.out, "It answers to the Host names %s; any other Host is refused (--allow-host adds one).\n", names)
	a.out.Flush()
	if ready != nil {
		ready <- ln.Addr().String()
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	fmt.Fprintln(a.out, "Stopped.")
	return nil
}

// readOnlyQueue is a *work.Queue over a store replay opened read-only: every read of the
// queue's API works (the log, the projection, Stats, Verify); every command fails with
// ErrBackend before anything is written. A Pebble store's clock is the time of its last
// event (what "due now" means for a store at rest); a PostgreSQL queue's is the wall clock.
func readOnlyQueue(st store, live bool) (*work.Queue, error) {
	clock := time.Now
	if !live {
		last, err := st.LastSeq(context.Background())
		if err != nil {
			return nil, err
		}
		at := time.Unix(0, 0).UTC()
		if last > 0 {
			if ev, err := st.Event(context.Background(), last); err == nil {
				at = time.Unix(0, ev.Head().At).UTC()
			}
		}
		clock = func() time.Time { return at }
	}
	return engine.NewQueue(&roEngine{st: st}, engine.Config{Clock: clock}).(*work.Queue), nil
}

var errReadOnly = errors.New("replay serve: the store is open read-only")

// roEngine is the engine of readOnlyQueue.
type roEngine struct {
	st store

	mu      sync.Mutex
	changed chan struct{}      // Changed's channel, made on the first call
	stop    context.CancelFunc // ends the follow that feeds changed
}

func (e *roEngine) Update(context.Context, func(engine.Txn) error) error { return errReadOnly }
func (e *roEngine) View(ctx context.Context, fn func(projection.Reader) error) error {
	return e.st.View(ctx, fn)
}
func (e *roEngine) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return e.st.ReadRange(ctx, from, 0, fn)
}
func (e *roEngine) Verify(ctx context.Context) ([]string, error) {
	return e.st.Verify(ctx, source.VerifyOptions{})
}

// Changed is the engine's Watcher: the queue's waiters and followers (the console's live
// tail) wake on it when another process commits. Over a PostgreSQL store it is fed by the
// store's own Follow (LISTEN, no polling) from the log's head on, and over a held store by
// the inspection endpoint's follow; a store directory that replay opened itself has no
// other writer while replay holds it, and its channel never fires.
func (e *roEngine) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.changed != nil {
		return e.changed
	}
	e.changed = make(chan struct{}, 1)
	f, ok := e.st.(follower)
	if !ok {
		return e.changed
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	last, err := e.st.LastSeq(ctx)
	if err != nil {
		return e.changed // a waiter then wakes on its timer only
	}
	go f.Follow(ctx, last+1, func(events.Event) error {
		select {
		case e.changed <- struct{}{}:
		default:
		}
		return nil
	})
	return e.changed
}

func (e *roEngine) Close() error {
	e.mu.Lock()
	if e.stop != nil {
		e.stop()
	}
	e.mu.Unlock()
	return e.st.Close()
}

// runDemoServe builds the demo store (in dir, or a temporary directory) and serves the
// console on it until interrupted.
func (a *app) runDemoServe(ctx context.Context, dir string, seed uint64, seeded, keep bool, addr string, allow []string) error {
	temp := dir == ""
	if temp {
		d, err := os.MkdirTemp("", "worklog-demo-")
		if err != nil {
			return fmt.Errorf("making a temporary directory: %v", err)
		}
		dir = d
	} else if names, err := os.ReadDir(dir); err == nil && len(names) > 0 {
		return fmt.Errorf("%s is not empty: demo builds a new store and never writes into an existing directory's files; give a new or empty directory", dir)
	}
	err := a.demoIn(ctx, dir, seed, seeded, true)
	if err == nil {
		fmt.Fprintln(a.out)
		err = a.serve(ctx, dir, addr, allow, nil)
	}
	if temp && !keep {
		if rerr := os.RemoveAll(dir); rerr != nil {
			return errors.Join(err, fmt.Errorf("removing the temporary store %s: %v", dir, unwrapPathError(rerr)))
		}
		fmt.Fprintf(a.out, "Removed the temporary store %s.\n", dir)
	} else if temp {
		fmt.Fprintf(a.out, "Kept the store in %s.\n", dir)
	}
	return err
}
