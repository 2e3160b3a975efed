package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestChaosChild is the body of the processes a run starts (the test binary re-executes
// itself, as the command does).
func TestChaosChild(t *testing.T) {
	switch os.Getenv(envRole) {
	case "client":
		os.Exit(clientMain())
	case "owner":
		os.Exit(ownerMain())
	}
	t.Skip("a child process of TestChaos only")
}

// TestChaos runs a short chaos run on each backend, every nemesis on: no anomaly.
func TestChaos(t *testing.T) {
	for _, backend := range []string{"pebble", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			if backend == "postgres" {
				if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) == 0 {
					t.Skip("SKIPPING the PostgreSQL chaos run: no server binaries in /usr/lib/postgresql/*/bin; install Debian's postgresql package")
				}
			}
			cfg := config{duration: 40 * time.Second, nemeses: allNemeses, backend: backend, seed: 1,
				clients: 4, maxOps: 1_000_000, out: t.TempDir(), skew: 200 * time.Millisecond,
				margin: 250 * time.Millisecond}
			res := runBackend(context.Background(), cfg, backend, cfg.out)
			t.Log(res.summary())
			if res.err != nil {
				t.Fatal(res.err)
			}
			if res.ops == 0 {
				t.Fatal("no operations ran")
			}
			if res.anomalies > 0 {
				b, _ := os.ReadFile(cfg.out + "/anomalies.txt")
				t.Fatalf("%s\n%s", res.summary(), b)
			}
		})
	}
}
