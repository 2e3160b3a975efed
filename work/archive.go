package work

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/worklog/worklog/internal/optionerr"
)

// The archive of pruned events (Options.ArchiveDir; docs/design.md, "Retention") is the Pebble
// engine's (internal/pebbleengine/archive.go); work checks the option.

// checkArchiveDir refuses an archive directory the store would take for its own files.
func checkArchiveDir(dir, archiveDir string) error {
	if archiveDir == "" {
		return nil
	}
	bad := func(msg string) error { return optionerr.New("work.Options", "ArchiveDir", msg) }
	if strings.TrimSpace(archiveDir) == "" {
		return bad("must not be blank (\"\" means no archive)")
	}
	d, err1 := filepath.Abs(dir)
	a, err2 := filepath.Abs(archiveDir)
	if err := errors.Join(err1, err2); err != nil {
		return bad(err.Error())
	}
	if rel, err := filepath.Rel(d, a); err == nil && (rel == "." || !strings.HasPrefix(rel, "..")) {
		return bad(fmt.Sprintf("%s is inside the store directory %s: put the archive beside the store", archiveDir, dir))
	}
	return nil
}
