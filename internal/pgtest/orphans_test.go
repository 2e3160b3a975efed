package pgtest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// orphanChildEnv makes TestOrphanedServerReaped, run in a child process, start a server
// and wait to be killed.
const orphanChildEnv = "WORKLOG_PGTEST_ORPHAN_CHILD"

// A test binary killed with SIGKILL (as its -timeout or an impatient user does) leaves its
// server running: Main's Stop never runs. The next Start (ReapOrphans) stops it and removes
// its directory, since its owner is gone; a server whose owner lives is left alone (this
// binary's own, here). The child is this test binary, run with its own server.
func TestOrphanedServerReaped(t *testing.T) {
	if os.Getenv(orphanChildEnv) != "" {
		s, _ := Current()
		if s == nil || !s.Owned() {
			os.Stdout.WriteString("NOSERVER\n")
			os.Exit(3)
		}
		os.Stdout.WriteString("DIR " + s.dir + "\n")
		time.Sleep(time.Minute) // killed before
		os.Exit(4)
	}
	own := Need(t)
	if !own.Owned() {
		t.Skip("the server was not started by this test binary")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestOrphanedServerReaped$", "-test.timeout", "2m")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvDSN+"=") { // a server of its own, not this binary's
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, orphanChildEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "DIR ") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the child said %q (%v), want its server's directory", line, err)
	}
	dir := strings.TrimSpace(strings.TrimPrefix(line, "DIR "))
	cmd.Process.Kill()
	cmd.Wait()
	pm := postmasterOf(dir, dir)
	if pm == 0 {
		t.Fatalf("no postmaster runs on %s after its owner was killed: the test proves nothing", dir)
	}
	t.Cleanup(func() { killServer(pm); os.RemoveAll(dir) }) // if the reaper failed

	reaped := ReapOrphans()
	found := false
	for _, d := range reaped {
		found = found || d == dir
		if d == own.dir {
			t.Errorf("ReapOrphans removed this binary's own server %s", d)
		}
	}
	if !found {
		t.Fatalf("ReapOrphans removed %v, not the killed child's server %s", reaped, dir)
	}
	if !gone(pm) {
		t.Errorf("the orphaned postmaster %d still runs", pm)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the orphaned server's directory %s is still there (%v)", dir, err)
	}
	claimed := filepath.Join(filepath.Dir(dir), "worklog-orphan-"+strings.TrimPrefix(filepath.Base(dir), dirPrefix))
	if _, err := os.Stat(claimed); !os.IsNotExist(err) {
		t.Errorf("the claimed directory %s is still there (%v)", claimed, err)
	}
	if err := own.Exec("SELECT 1"); err != nil {
		t.Errorf("this binary's own server after ReapOrphans: %v", err)
	}
}
