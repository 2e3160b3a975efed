// Package pgtest starts a throwaway PostgreSQL server for tests: initdb and pg_ctl from
// Debian's postgresql package in a temporary directory, listening on a free 127.0.0.1 port,
// run as the postgres user when the tests run as root (initdb refuses root). One server
// serves a whole test binary (Main, from TestMain); each test gets a schema of its own
// (Schema), so tests never see each other's tables.
//
// Without the server binaries Main prints one line naming the package to install and the
// tests skip (Need). WORKLOG_TEST_PG_DSN names an existing server instead; child processes
// that a test starts inherit the DSN through it, so they never start a server of their own.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names an existing server (a postgres:// URL of a database the tests may create
// schemas in). Main sets it for the processes a test starts.
const EnvDSN = "WORKLOG_TEST_PG_DSN"

// Server is a running throwaway server.
type Server struct {
	DSN     string // postgres://postgres@127.0.0.1:port/postgres?sslmode=disable
	bin     string // the directory of pg_ctl
	dir     string // the temporary directory holding data, socket and log
	data    string
	port    int
	asUser  []string // runuser -u postgres --, when running as root
	owned   bool     // started here (Stop removes it); false for EnvDSN's server
	stopped bool

	adminMu sync.Mutex
	admin   *pgx.Conn
}

var (
	mu      sync.Mutex
	current *Server
	reason  string // why there is no server
)

// ErrNoServer is returned by Start when no PostgreSQL server binaries are installed.
var ErrNoServer = errors.New("pgtest: PostgreSQL server binaries not found")

// Main runs a test binary's tests with one server: the one EnvDSN names, or a new one that
// it stops and removes when the tests are done. Without binaries it prints one line and the
// tests that call Need skip. Use it as TestMain's body: os.Exit(pgtest.Main(m, "postgres")).
func Main(m *testing.M, pkg string) int {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		set(&Server{DSN: dsn}, "")
		return m.Run()
	}
	s, err := Start()
	if err != nil {
		msg := fmt.Sprintf("SKIPPING the PostgreSQL tests of package %s: %v", pkg, err)
		if errors.Is(err, ErrNoServer) {
			msg = fmt.Sprintf("SKIPPING the PostgreSQL tests of package %s: no server binaries "+
				"in /usr/lib/postgresql/*/bin; install Debian's postgresql package (apt-get install postgresql)", pkg)
		}
		fmt.Fprintln(os.Stderr, msg)
		set(nil, msg)
		return m.Run()
	}
	set(s, "")
	os.Setenv(EnvDSN, s.DSN) // child processes of the tests use this server
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
	}
	return code
}

func set(s *Server, why string) {
	mu.Lock()
	defer mu.Unlock()
	current, reason = s, why
}

// Current is the binary's server, or nil (and the reason) when there is none.
func Current() (*Server, string) {
	mu.Lock()
	defer mu.Unlock()
	if current == nil && reason == "" {
		return nil, "pgtest: no server: the package's TestMain must call pgtest.Main"
	}
	return current, reason
}

// Need returns the binary's server, or skips t when there is none (Main said why, once).
func Need(t testing.TB) *Server {
	t.Helper()
	s, why := Current()
	if s == nil {
		t.Skip(why)
	}
	return s
}

// Schema creates a new, empty schema for t and returns a DSN whose search_path names it.
// The schema is dropped when t ends.
func Schema(t testing.TB) string {
	t.Helper()
	s := Need(t)
	name := "t_" + randomHex(6)
	if err := s.Exec("CREATE SCHEMA " + name); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		// A test that stopped the server leaves its schema to the server's removal.
		s.Exec("DROP SCHEMA " + name + " CASCADE")
	})
	return WithSearchPath(s.DSN, name)
}

// Exec runs sql on the server's admin connection (one, kept open: a new connection costs a
// server process), reconnecting when the server was restarted.
func (s *Server) Exec(sql string) error {
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for try := 0; ; try++ {
		if s.admin == nil || s.admin.IsClosed() {
			c, err := pgx.Connect(ctx, s.DSN)
			if err != nil {
				return err
			}
			s.admin = c
		}
		_, err := s.admin.Exec(ctx, sql)
		if err != nil && try == 0 && s.admin.IsClosed() {
			continue // the connection died with a restarted server: once more on a new one
		}
		return err
	}
}

// WithSearchPath returns dsn (a postgres:// URL) with its search_path set to schema.
func WithSearchPath(dsn, schema string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// binDir finds the newest /usr/lib/postgresql/N/bin with initdb and pg_ctl.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if isExec(filepath.Join(dirs[i], "initdb")) && isExec(filepath.Join(dirs[i], "pg_ctl")) {
			return dirs[i], nil
		}
	}
	return "", ErrNoServer
}

func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&0o111 != 0
}

// Start initdb's a cluster in a new temporary directory and starts it on a free loopback
// port. Settings are the defaults but for: loopback only, the socket in the temporary
// directory, room for many connections (each test opens a pool), and fsync off — the
// tests restart and kill the server, never the machine, and the page cache survives both.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, owned: true}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("pgtest: running as root needs the postgres user (Debian's package creates it): %v", err)
		}
		s.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	ReapOrphans() // servers of test binaries that were killed
	s.dir, err = os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	if err := writeOwner(s.dir); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	os.Chmod(s.dir, 0o755)
	if len(s.asUser) > 0 {
		if err := exec.Command("chown", "postgres", s.dir).Run(); err != nil {
			os.RemoveAll(s.dir)
			return nil, fmt.Errorf("pgtest: chown %s: %v", s.dir, err)
		}
	}
	s.data = filepath.Join(s.dir, "data")
	if out, err := s.run("initdb", "-D", s.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
		"--no-instructions", "--no-sync"); err != nil {
		os.RemoveAll(s.dir)
		return nil, fmt.Errorf("pgtest: initdb: %v: %s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	if err := s.start(); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) run(tool string, args ...string) ([]byte, error) {
	argv := append(append([]string{}, s.asUser...), filepath.Join(s.bin, tool))
	argv = append(argv, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

func (s *Server) start() error {
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=400 -c fsync=off "+
		"-c full_page_writes=off", s.port, s.dir)
	out, err := s.run("pg_ctl", "-D", s.data, "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "60", "-o", opts, "start")
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		return fmt.Errorf("pgtest: pg_ctl start: %v: %s\n%s", err, out, tail(log))
	}
	s.stopped = false
	return nil
}

func tail(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// Owned reports whether this process started the server (and so may restart it).
func (s *Server) Owned() bool { return s.owned }

// StopServer stops the server: mode "fast" (clients disconnected, a clean shutdown) or
// "immediate" (every server process killed; recovery from the WAL at the next start, as
// after a crash).
func (s *Server) StopServer(mode string) error {
	if !s.owned {
		return errors.New("pgtest: the server was not started by this process")
	}
	if out, err := s.run("pg_ctl", "-D", s.data, "-m", mode, "-w", "stop"); err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %v: %s", err, out)
	}
	s.stopped = true
	return nil
}

// StartServer starts a server StopServer stopped, on the same port.
func (s *Server) StartServer() error {
	if !s.owned {
		return errors.New("pgtest: the server was not started by this process")
	}
	return s.start()
}

// Stop stops the server and removes its directory.
func (s *Server) Stop() error {
	if !s.owned {
		return nil
	}
	var err error
	if !s.stopped {
		err = s.StopServer("fast")
	}
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	return err
}

// freePort asks the kernel for a free loopback port. Another process may take it before the
// server binds it; the server's start then fails and says so.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitReady waits until the server accepts connections, for at most d.
func (s *Server) WaitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.DSN)
		cancel()
		if err == nil {
			c.Close(context.Background())
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Throwaway reports whether the server was started by this package for the tests (and is
// removed after them), not an existing one EnvDSN named: a test may change its settings.
func (s *Server) Throwaway() bool { return s.owned }
