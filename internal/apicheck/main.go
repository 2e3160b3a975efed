// Command apicheck records and checks the exported API of worklog's public packages: the
// files api/<package>.txt (one line per exported name and signature, as the Go project's own
// api/ files), for the core module and for contrib/otelworklog's.
//
// From the repository's root:
//
//	go run ./internal/apicheck          # report the differences and internal types in the API; exit 1 if any
//	go run ./internal/apicheck -write   # rewrite api/*.txt from the code
//
// The tests TestAPI (this package) and contrib/otelworklog's TestAPI fail on the same
// differences.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/worklog/worklog/internal/apicheck/api"
)

// modules are the modules whose public packages are recorded, relative to the root.
var modules = []string{".", "contrib/otelworklog"}

func main() {
	write := flag.Bool("write", false, "rewrite api/*.txt from the code")
	flag.Parse()
	root, err := rootDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(2)
	}
	apiDir := filepath.Join(root, "api")
	failed := false
	for _, m := range modules {
		pkgs, err := api.Public(filepath.Join(root, m))
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicheck:", err)
			os.Exit(2)
		}
		for _, l := range api.Leaks(pkgs) {
			fmt.Fprintln(os.Stderr, "internal type in exported API:", l)
			failed = true
		}
		if *write {
			if err := api.Write(apiDir, pkgs); err != nil {
				fmt.Fprintln(os.Stderr, "apicheck:", err)
				os.Exit(2)
			}
			continue
		}
		d, err := api.Diff(apiDir, pkgs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicheck:", err)
			os.Exit(2)
		}
		if d != "" {
			fmt.Print(d)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// rootDir is the core module's root directory.
func rootDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && isCore(b) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no github.com/worklog/worklog module above %s", wd)
		}
	}
}

func isCore(gomod []byte) bool {
	const line = "module github.com/worklog/worklog\n"
	return len(gomod) >= len(line) && string(gomod[:len(line)]) == line
}
