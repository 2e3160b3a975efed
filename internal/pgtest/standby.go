package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a primary and a streaming standby of it, each a throwaway server of its own (not
// the binary's shared one): for failover tests. Both listen on 127.0.0.1.
type Pair struct {
	Primary, Standby *Server
	Sync             bool // the standby is synchronous: a commit returns once the standby has it
}

// StartPair starts a primary with replication on, takes a base backup of it into a standby
// (pg_basebackup -R) and starts the standby streaming from it; with sync, the primary names
// the standby in synchronous_standby_names, so that no commit returns before the standby
// has flushed it. It waits until the standby streams (and, with sync, is the sync standby).
// fsync stays off on both as in Start: the tests kill servers, never the machine.
func StartPair(sync bool) (*Pair, error) {
	primary, err := Start()
	if err != nil {
		return nil, err
	}
	p := &Pair{Primary: primary, Sync: sync}
	fail := func(err error) (*Pair, error) {
		p.Stop()
		return nil, err
	}
	names := "''"
	if sync {
		names = "'standby1'"
	}
	if err := primary.Exec("ALTER SYSTEM SET synchronous_standby_names = " + names); err != nil {
		return fail(fmt.Errorf("pgtest: %v", err))
	}
	if err := primary.Exec("SELECT pg_reload_conf()"); err != nil {
		return fail(fmt.Errorf("pgtest: %v", err))
	}

	st := &Server{bin: primary.bin, owned: true, asUser: primary.asUser}
	st.dir, err = os.MkdirTemp("", dirPrefix+"standby-")
	if err != nil {
		return fail(err)
	}
	if err := writeOwner(st.dir); err != nil {
		os.RemoveAll(st.dir)
		return fail(err)
	}
	p.Standby = st
	os.Chmod(st.dir, 0o755)
	if len(st.asUser) > 0 {
		if err := chown(st.dir); err != nil {
			return fail(err)
		}
	}
	st.data = filepath.Join(st.dir, "data")
	if out, err := st.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", st.data, "-R", "-X", "stream", "--no-sync", "-d",
		fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby1", primary.port)); err != nil {
		return fail(fmt.Errorf("pgtest: pg_basebackup: %v: %s", err, out))
	}
	if st.port, err = freePort(); err != nil {
		return fail(err)
	}
	st.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", st.port)
	if err := st.start(); err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		state, err := primary.replicationState()
		if err == nil && state == "streaming" {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("pgtest: the standby does not stream after 60 s (state %q, %v)", state, err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p, nil
}

func chown(dir string) error {
	if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: chown %s: %v: %s", dir, err, out)
	}
	return nil
}

// replicationState is the state of standby1's walsender on the primary ("" when none).
func (s *Server) replicationState() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	var state string
	err = c.QueryRow(ctx, "SELECT coalesce(max(state), '') FROM pg_stat_replication WHERE application_name = 'standby1'").Scan(&state)
	return state, err
}

// DSN is the multi-host DSN of the pair (primary first) that picks whichever accepts writes
// (target_session_attrs=read-write), with search_path set to schema when not "".
func (p *Pair) DSN(schema string) string {
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		p.Primary.port, p.Standby.port)
	if schema != "" {
		dsn = WithSearchPath(dsn, schema)
	}
	return dsn
}

// KillPrimary kills every process of the primary with SIGKILL: a machine that died. It
// returns once the postmaster and every child of it are gone (killServer: the postmaster is
// stopped before its children are listed, so that none forked meanwhile is missed). The
// primary's data stays (Stop removes it).
func (p *Pair) KillPrimary() error {
	s := p.Primary
	b, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pgtest: reading postmaster.pid: %v", err)
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("pgtest: postmaster.pid: %v", err)
	}
	if !killServer(pm) {
		return fmt.Errorf("pgtest: a process of the primary (postmaster %d) still alive 30 s after SIGKILL", pm)
	}
	s.stopped = true
	return nil
}

// Promote promotes the standby to a primary and waits until it accepts writes. The standby
// inherited the primary's synchronous_standby_names (pg_basebackup copies
// postgresql.auto.conf), which names a standby the new primary does not have: every commit
// would wait forever. Promote clears it, as failover tooling (Patroni, pg_auto_failover)
// does when it promotes a server that has no standby of its own yet.
func (p *Pair) Promote() error {
	if out, err := p.Standby.run("pg_ctl", "-D", p.Standby.data, "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("pgtest: pg_ctl promote: %v: %s", err, out)
	}
	if err := p.Standby.Exec("ALTER SYSTEM RESET synchronous_standby_names"); err != nil {
		return fmt.Errorf("pgtest: %v", err)
	}
	if err := p.Standby.Exec("SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: %v", err)
	}
	return nil
}

// Stop stops both servers and removes their directories.
func (p *Pair) Stop() {
	if p.Standby != nil {
		p.Standby.Stop()
	}
	if p.Primary != nil {
		if p.Primary.stopped {
			os.RemoveAll(p.Primary.dir)
		} else {
			p.Primary.Stop()
		}
	}
}
