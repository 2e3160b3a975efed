package pgtest

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m, "pgtest")) }

// Freeze returns with every process of the server stopped, also while clients connect: the
// backend of a connection the postmaster was forking as Freeze stopped it is stopped too, and
// no statement sent after Freeze returned is answered until Thaw. Freeze used to list the
// postmaster's children right after sending it SIGSTOP; a fork in progress then completes
// (a signal sent to one process does not restart a fork), and its backend, missing from the
// list, answered on the "frozen" server (postgres' TestFrozenServerClose: "a read on the
// frozen server succeeded", under load).
func TestFreezeWhileConnecting(t *testing.T) {
	dsn := Schema(t)
	fr := NewFreezer(t, dsn)
	const rounds, connectors = 20, 6
	for round := 0; round < rounds; round++ {
		ctx, cancel := context.WithCancel(context.Background())
		var frozen atomic.Bool
		var answered atomic.Int64
		started := make(chan struct{}, connectors)
		var wg sync.WaitGroup
		for i := 0; i < connectors; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				first := true
				for ctx.Err() == nil {
					c, err := pgx.Connect(ctx, dsn)
					if first {
						started <- struct{}{}
						first = false
					}
					if err != nil {
						continue
					}
					after := frozen.Load() // the statement below is sent after Freeze returned
					if _, err := c.Exec(ctx, "SELECT 1"); err == nil && after {
						answered.Add(1)
					}
					c.Close(context.Background())
				}
			}()
		}
		for i := 0; i < connectors; i++ {
			<-started // the postmaster is forking backends for them
		}
		fr.Freeze()
		frozen.Store(true)
		// Every process of the server is stopped now (a zombie has nothing left to stop).
		postmaster := fr.pids[0]
		for _, pid := range append([]int{postmaster}, childrenOf(postmaster)...) {
			if s := stateOf(pid); s != 0 && s != 'T' && s != 'Z' && s != 'X' {
				t.Errorf("round %d: process %d of the frozen server is in state %c, not stopped", round, pid, s)
			}
		}
		// Give a backend that was not stopped the time to answer a connector.
		time.Sleep(200 * time.Millisecond)
		cancel()
		wg.Wait() // before Thaw: no statement is answered by the server resumed
		fr.Thaw()
		if n := answered.Load(); n > 0 {
			t.Errorf("round %d: %d statements sent after Freeze returned were answered before Thaw", round, n)
		}
		if t.Failed() {
			return
		}
	}
}
