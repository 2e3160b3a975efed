package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/worklog/worklog/internal/pgtest"
)

// The tests run the real binary, built once per test run, against real stores: the demo
// store (`replay demo DIR --seed 1`, built once and copied per test) and stores the tests
// build with work.Open. Golden files live in testdata/; regenerate them with
//
//	go test ./cmd/replay -update
//
// and review the diff.

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var (
	replayBin string // the replay binary
	demoDir   string // a demo store built with --seed 1; tests copy it, never use it directly
	cacheHome string // XDG_CACHE_HOME of every child: the default cache dir stays in the test's temp dir
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testMain(m))
}

func testMain(m *testing.M) (code int) {
	if dir := os.Getenv(holderEnv); dir != "" { // this binary re-executed as a holder (inspect_test.go)
		return holderMain(dir)
	}
	tmp, err := os.MkdirTemp("", "replay-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	replayBin = filepath.Join(tmp, "replay")
	build := exec.Command("go", "build", "-o", replayBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building replay:", err)
		return 1
	}
	cacheHome = filepath.Join(tmp, "cache")
	// The in-process runs (run, runContext) read the cache dir from this process's
	// environment: they get the temp one too. The user's own cache dir must come out of the
	// run as it went in (cacheState).
	userCache := userCacheRoot()
	before := cacheState(userCache)
	if err := os.Setenv("XDG_CACHE_HOME", cacheHome); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if after := cacheState(userCache); after != before {
			fmt.Fprintf(os.Stderr, "FAIL: the tests changed the user's cache dir %s (every test writes under its temp dir):\nbefore: %s\nafter:  %s\n",
				userCache, before, after)
			code = 1
		}
	}()
	demoDir = filepath.Join(tmp, "demo")
	if out, err := exec.Command(replayBin, "demo", demoDir, "--seed", "1").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the demo store: %v\n%s", err, out)
		return 1
	}
	// One throwaway PostgreSQL server for the tests that read a queue there
	// (postgres_test.go); without one they skip, and this says why once.
	return pgtest.Main(m, "cmd/replay")
}

// userCacheRoot is where replay keeps its snapshot cache by default: os.UserCacheDir()/
// worklog-replay, as the environment says before testMain changes it.
func userCacheRoot() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "worklog-replay")
}

// cacheState describes what is under root: every file and directory with its size and
// modification time, or "absent".
func cacheState(root string) string {
	if root == "" {
		return "no user cache dir"
	}
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %d; ", path, fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return "absent"
	}
	if err != nil {
		return err.Error()
	}
	return b.String()
}

type result struct {
	stdout, stderr string
	code           int
}

// replay runs the binary with args and returns what it printed and its exit status.
func replay(t testing.TB, args ...string) result {
	t.Helper()
	return replayEnv(t, nil, args...)
}

// replayEnv is replay with more environment variables ("NAME=value").
func replayEnv(t testing.TB, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(replayBin, args...)
	cmd.Env = append(append(os.Environ(), "XDG_CACHE_HOME="+cacheHome, "HOME="+cacheHome), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("running replay %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	r := result{stdout: out.String(), stderr: errb.String(), code: code}
	for _, bad := range []string{"panic", "goroutine ", ".go:"} {
		if strings.Contains(r.stderr, bad) {
			t.Errorf("replay %v: stderr looks like a crash (%q):\n%s", args, bad, r.stderr)
		}
	}
	return r
}

// mustReplay runs replay and fails the test unless it exits 0.
func mustReplay(t testing.TB, args ...string) string {
	t.Helper()
	r := replay(t, args...)
	if r.code != 0 {
		t.Fatalf("replay %v: exit %d\nstderr: %s\nstdout: %s", args, r.code, r.stderr, r.stdout)
	}
	return r.stdout
}

// demoStore returns a private copy of the demo store.
func demoStore(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	if err := copyDir(demoDir, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if d.Name() == "WORKLOG.lock" {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// golden compares got with testdata/<name>, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (run go test -update and review the diff):\n%s", path, diffLines(string(want), got))
	}
}

// diffLines shows the first lines that differ.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 10; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want: %s\n  got:  %s\n", i+1, wl, gl)
			shown++
		}
	}
	return b.String()
}

var sizeLine = regexp.MustCompile(`(?m)^(Size on disk\s+).*$`)

// normalize makes output independent of where the store is and of its size on disk.
func normalize(s, dir string) string {
	s = strings.ReplaceAll(s, dir, "$STORE")
	s = sizeLine.ReplaceAllString(s, "${1}(masked)")
	return s
}
