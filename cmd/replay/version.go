package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/archive"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/postgres"
)

const versionLong = `Print the version of worklog this replay was built from, the Go version, and the store
formats it reads and writes.

The version is the module's, from the build information: a tagged version when replay was
installed with go install ...@version, "(devel)" when built from a checkout, then with the
commit (and "modified" when the checkout had uncommitted changes) if the build recorded it.
replay --version prints the same.`

// versionInfo is what replay version prints; its JSON form is documented in
// docs/replay-json.md.
type versionInfo struct {
	Module   string          `json:"module"`
	Version  string          `json:"version"`
	Revision string          `json:"revision,omitempty"` // vcs.revision, when the build recorded it
	Time     string          `json:"time,omitempty"`     // vcs.time
	Modified bool            `json:"modified,omitempty"` // vcs.modified: the checkout had changes
	Go       string          `json:"go"`
	Platform string          `json:"platform"`
	Formats  []formatVersion `json:"formats"`
}

// formatVersion is one stored format: the versions this build reads (ReadsMin to ReadsMax)
// and the one it writes.
type formatVersion struct {
	Name     string `json:"name"`
	What     string `json:"what"`
	ReadsMin int    `json:"reads_min"`
	ReadsMax int    `json:"reads_max"`
	Writes   int    `json:"writes"`
}

// formats are the stored formats of this build, each from the constant of its package.
func formats() []formatVersion {
	return []formatVersion{
		{"pebble", "Pebble store (keys, records, marker)", pebblelog.MinFormatVersion, pebblelog.FormatVersion, pebblelog.FormatVersion},
		{"postgres", "PostgreSQL schema", postgres.FormatVersion, postgres.FormatVersion, postgres.FormatVersion},
		{"events", "event wire format (envelope)", events.EnvelopeV1, events.EnvelopeV1, events.EnvelopeV1},
		{"archive", "archive segments", archive.Version, archive.Version, archive.Version},
		// wirelog.go: version 1 without pruned ranges, 2 with them; export writes the lowest
		// that holds its log.
		{"wirelog", "export --wire / import log file", 1, 2, 2},
	}
}

// buildVersion reads this binary's build information.
func buildVersion() versionInfo {
	v := versionInfo{Module: "github.com/worklog/worklog", Version: "unknown", Go: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Formats: formats()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	v.Go = bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// text is the human form: one line for the version, one for Go, one per format.
func (v versionInfo) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replay %s %s", v.Module, v.Version)
	if v.Revision != "" {
		fmt.Fprintf(&b, " commit %s", v.Revision)
		if v.Time != "" {
			fmt.Fprintf(&b, " (%s)", v.Time)
		}
		if v.Modified {
			b.WriteString(" modified")
		}
	}
	fmt.Fprintf(&b, "\nbuilt with %s %s\nstore formats (reads, writes):\n", v.Go, v.Platform)
	for _, f := range v.Formats {
		reads := fmt.Sprint(f.ReadsMin)
		if f.ReadsMax != f.ReadsMin {
			reads = fmt.Sprintf("%d to %d", f.ReadsMin, f.ReadsMax)
		}
		fmt.Fprintf(&b, "  %-8s  %-38s  reads %s, writes %d\n", f.Name, f.What, reads, f.Writes)
	}
	return b.String()
}

func (a *app) versionCommand() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "version",
		Short: "The worklog version, the Go version and the store formats this replay reads and writes",
		Long:  versionLong,
		Example: `  replay version
  replay version --json | jq -r .version`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef(c, "version takes no argument, got %q", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, _ []string) error {
			v := buildVersion()
			if asJSON {
				return writeJSONLine(a.out, v)
			}
			_, err := a.out.WriteString(v.text())
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON (docs/replay-json.md)")
	return c
}
