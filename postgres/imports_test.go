package postgres

import (
	"os/exec"
	"strings"
	"testing"
)

// The record codec has one home both backends use (internal/recordcodec): no package this
// one builds on imports pebblelog for it. The only importers allowed are the Pebble engine
// (internal/pebbleengine), package work, whose Open builds it (and takes pebblelog's
// option limits), and internal/optionerr, which builds the one options error type, declared
// in pebblelog (pebblelog.OptionError, aliased by work, runner and console: the lowest public
// package with options); the engine itself is not this package's business.
func TestPostgresDoesNotImportPebblelog(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/worklog/worklog/postgres").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if imp == "github.com/worklog/worklog/pebblelog" && f[0] != "github.com/worklog/worklog/work" &&
				f[0] != "github.com/worklog/worklog/internal/pebbleengine" && f[0] != "github.com/worklog/worklog/internal/optionerr" {
				t.Errorf("%s imports pebblelog", f[0])
			}
		}
	}
}
