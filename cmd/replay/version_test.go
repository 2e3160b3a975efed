package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/postgres"
)

// replay version (and --version) names the module and its version from the build
// information, the Go version, and each store format with the versions it reads and writes,
// taken from the packages' constants; --json prints the same as one object.
func TestVersion(t *testing.T) {
	text := mustReplay(t, "version")
	if other := mustReplay(t, "--version"); other != text {
		t.Errorf("replay --version printed\n%s\nreplay version printed\n%s", other, text)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(mustReplay(t, "version", "--json")), &v); err != nil {
		t.Fatal(err)
	}
	// Built by TestMain from this checkout: "(devel)", or the go command's version from the
	// checkout's commit (v0.0.0-...), never empty or "unknown".
	if v.Module != "github.com/worklog/worklog" || (v.Version != "(devel)" && !strings.HasPrefix(v.Version, "v")) {
		t.Errorf("module %q version %q, want github.com/worklog/worklog at (devel) or a version", v.Module, v.Version)
	}
	if v.Go != runtime.Version() || v.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("go %q platform %q, want %s %s/%s", v.Go, v.Platform, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	want := map[string][3]int{ // reads_min, reads_max, writes
		"pebble":   {pebblelog.MinFormatVersion, pebblelog.FormatVersion, pebblelog.FormatVersion},
		"postgres": {postgres.FormatVersion, postgres.FormatVersion, postgres.FormatVersion},
		"events":   {events.EnvelopeV1, events.EnvelopeV1, events.EnvelopeV1},
		"archive":  {archive.Version, archive.Version, archive.Version},
		"wirelog":  {1, 2, 2},
	}
	for _, f := range v.Formats {
		w, ok := want[f.Name]
		if !ok {
			t.Errorf("unexpected format %+v", f)
			continue
		}
		delete(want, f.Name)
		if got := [3]int{f.ReadsMin, f.ReadsMax, f.Writes}; got != w {
			t.Errorf("format %s: reads %d to %d, writes %d; want %v", f.Name, f.ReadsMin, f.ReadsMax, f.Writes, w)
		}
		if !strings.Contains(text, f.What) {
			t.Errorf("the text lacks format %s (%q):\n%s", f.Name, f.What, text)
		}
	}
	if len(want) > 0 {
		t.Errorf("formats missing from --json: %v", want)
	}
	for _, s := range []string{"replay github.com/worklog/worklog " + v.Version, "built with " + v.Go,
		"Pebble store (keys, records, marker)    reads 7 to 8, writes 8"} {
		if !strings.Contains(text, s) {
			t.Errorf("replay version lacks %q:\n%s", s, text)
		}
	}
	if r := replay(t, "version", "extra"); r.code != exitError || !strings.Contains(r.stderr, "version takes no argument") {
		t.Errorf("replay version extra: exit %d, stderr %q; want 2 and a usage error", r.code, r.stderr)
	}
}

// A build that recorded its commit (go build -buildvcs, outside a git worktree) prints it,
// with its time and whether the checkout was modified. TestMain's binary is built without it
// (GOFLAGS may say -buildvcs=false, and the go command finds no VCS in a git worktree), so
// the text is checked here from a versionInfo.
func TestVersionTextRevision(t *testing.T) {
	v := versionInfo{Module: "github.com/worklog/worklog", Version: "(devel)", Revision: "c989dba",
		Time: "2026-12-07T16:00:00Z", Modified: true, Go: "go1.26.8", Platform: "linux/amd64"}
	if got, want := strings.SplitN(v.text(), "\n", 2)[0],
		"replay github.com/worklog/worklog (devel) commit c989dba (2026-12-07T16:00:00Z) modified"; got != want {
		t.Errorf("first line %q, want %q", got, want)
	}
}
