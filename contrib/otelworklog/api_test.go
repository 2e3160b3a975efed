package otelworklog

import (
	"testing"

	"github.com/worklog/worklog/internal/apicheck/api"
)

// TestAPI fails when this package's exported API differs from the repository's
// api/contrib-otelworklog.txt, or names a type of an internal/ package (the core module's
// internal/apicheck checks the other public packages the same way).
func TestAPI(t *testing.T) {
	pkgs, err := api.Public(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range api.Leaks(pkgs) {
		t.Errorf("an exported declaration names an internal type: %s", l)
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
