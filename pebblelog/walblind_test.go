package pebblelog

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
)

// The WAL's blind spots after a crash (docs/design.md §7.2, §7.5): the tests here kill a
// real process with SIGKILL, or take a crash clone of a crashable in-memory store, damage
// the newest WAL, and require that Open either refuses naming the file or opens with every
// acknowledged command.

const firstSessionEnv = "WORKLOG_TEST_FIRST_SESSION_DIR"

// firstSessionSubmits is what the helper acknowledges before it is killed. The issue's
// reproduction made 400 submits through work; these pebblelog submits write more bytes each,
// and 300 of them stay within Pebble's first memtable (256 KiB, which grows after), so that
// every one of them is in the WAL the store's first write went to.
const firstSessionSubmits = 300

// TestHelperFirstSession is not a test: TestFirstSessionWALFlipRefused runs it in a child
// process. It creates a store, acknowledges firstSessionSubmits submits one command each,
// says so and waits to be killed.
func TestHelperFirstSession(t *testing.T) {
	dir := helperDir(t, firstSessionEnv)
	s, err := Open(dir, nil)
	if err != nil {
		say("error " + err.Error())
		os.Exit(3)
	}
	for i := range firstSessionSubmits {
		if err := update(s, submitted("s1", fmt.Sprintf("t%03d", i), sec(i), false)); err != nil {
			say("error " + err.Error())
			os.Exit(3)
		}
	}
	say(fmt.Sprintf("acked %d", firstSessionSubmits))
	time.Sleep(time.Hour) // until the test kills the process
	os.Exit(4)
}

// killedAfterAcks runs the helper test name with env=dir, waits for its "acked" line and
// kills it with SIGKILL: what is on disk then is what a process crash leaves.
func killedAfterAcks(t *testing.T, name, env, dir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "acked ") {
			acked = true
			break
		}
		if strings.HasPrefix(sc.Text(), "error ") {
			break
		}
	}
	cmd.Process.Kill() // SIGKILL
	cmd.Wait()
	if !acked {
		t.Fatalf("%s did not acknowledge its commands:\n%s", name, tail(stderr.String(), 3000))
	}
}

// countEvents opens dir, reads the log and returns how many events it holds.
func countEvents(t *testing.T, dir string) int {
	t.Helper()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return eventsIn(t, s)
}

func eventsIn(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	if err := s.ReadLog(context.Background(), 0, func(events.Event) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// Issue 25's first blind spot, as a new user met it: acknowledged submits into a new store
// (400 in the issue), the process killed, one byte flipped at 90% of the WAL. Pebble created the store's
// first WAL before it ratcheted the format to synced-offset chunks, so nothing in that WAL
// proved the damaged chunk had been synced: the store opened without an error and 23 of the
// acknowledged tasks were gone. Now the store's first write goes into a WAL with synced
// offsets (rotateFirstWAL), and the intact chunks after the flipped byte prove it.
func TestFirstSessionWALFlipRefused(t *testing.T) {
	dir := t.TempDir()
	killedAfterAcks(t, "TestHelperFirstSession", firstSessionEnv, dir)
	fs := vfs.Default
	w := wals(t, fs, dir)
	if len(w) == 0 {
		t.Fatal("the killed store has no WAL")
	}
	name := w[len(w)-1]
	path := fs.PathJoin(dir, name)
	b := readFileT(t, fs, path)
	if n := len(walRecords(t, fs, dir, name)); n < firstSessionSubmits {
		t.Fatalf("%s holds %d records, want every one of the %d submits", name, n, firstSessionSubmits)
	}
	intact := append([]byte(nil), b...)
	off := len(b) * 9 / 10
	b[off] ^= 0x20
	writeAll(t, fs, path, b)
	s, err := Open(dir, nil)
	if err == nil {
		n := eventsIn(t, s)
		s.Close()
		t.Fatalf("the store opened with %d of %d acknowledged submits (byte %d of %s, %d bytes, flipped)",
			n, firstSessionSubmits, off, name, len(b))
	}
	wantCorrupt(t, err, name)
	if !strings.Contains(err.Error(), "synced up to") {
		t.Errorf("the error does not name the WAL's own proof that the damage was synced: %v", err)
	}
	// Undamaged, the killed store opens with every acknowledged submit.
	writeAll(t, fs, path, intact)
	if n := countEvents(t, dir); n < firstSessionSubmits {
		t.Fatalf("the undamaged store holds %d events, want at least %d", n, firstSessionSubmits)
	}
}
