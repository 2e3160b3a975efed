package main

import (
	"testing"

	"github.com/worklog/worklog/internal/apicheck/api"
)

// TestAPI fails when the exported API of a public package of this module differs from its
// api/<package>.txt, or names a type of an internal/ package. contrib/otelworklog, a module of
// its own, has the same test.
func TestAPI(t *testing.T) {
	pkgs, err := api.Public("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) == 0 {
		t.Fatal("no public package found")
	}
	for _, l := range api.Leaks(pkgs) {
		t.Errorf("an exported declaration names an internal type (a user cannot name it; move it behind internal/): %s", l)
	}
	d, err := api.Diff("../../api", pkgs)
	if err != nil {
		t.Fatal(err)
	}
	if d != "" {
		t.Errorf("the exported API differs from api/ (+ in the code only, - in api/ only):\n%s\n"+
			"If the change is deliberate, run `go run ./internal/apicheck -write` from the repository's root, "+
			"review the diff of api/ and list the change in CHANGELOG.md.", d)
	}
}
