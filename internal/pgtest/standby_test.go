package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// serverProcs lists the running processes whose working directory is data (a server's
// processes all work in its data directory; a zombie has none, and has exited).
func serverProcs(data string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && cwd == data && !gone(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// KillPrimary returns once every process of the primary is gone, the children of the
// postmaster too, also while clients connect (a backend being forked as the postmaster is
// killed). It used to wait for the postmaster alone, and list the children before and after
// its SIGKILL, not once it had stopped forking.
func TestKillPrimaryLeavesNoProcess(t *testing.T) {
	if s := Need(t); !s.Owned() {
		t.Skip("the server was not started by this test binary")
	}
	p, err := StartPair(false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	data, err := filepath.EvalSymlinks(p.Primary.data)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(serverProcs(data)); n < 3 {
		t.Fatalf("%d processes work in the primary's data directory, want its postmaster and children: the check proves nothing", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 { // clients connecting while the primary is killed
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, time.Second)
				if c, err := pgx.Connect(cctx, p.Primary.DSN); err == nil {
					c.Close(context.Background())
				}
				ccancel()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // let the connections start; not a bound of anything
	err = p.KillPrimary()
	left := serverProcs(data)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("processes of the primary still running when KillPrimary returned: %v", left)
	}
}
