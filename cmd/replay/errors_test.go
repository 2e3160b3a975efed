package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestFlagErrorsGolden runs every numeric, time and boolean flag with a bad value, and the
// unknown-session cases, and keeps what replay says in testdata/errors.txt: each message names
// the flag and the text given and says what was expected, in words, never strconv's.
func TestFlagErrorsGolden(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	cases := [][]string{
		{"log", dir, "--session", "nope"},
		{"timeline", dir, "--session", "nope"},
		{"state", dir, "--session", "nope"},
		{"log", dir, "--from", "x"},
		{"log", dir, "--to", "-1"},
		{"log", dir, "--from", "99999999999999999999"},
		{"log", dir, "--from", "9", "--to", "3"},
		{"log", dir, "--limit", "ten"},
		{"log", dir, "--limit", "-1"},
		{"log", dir, "--since", "yesterday"},
		{"log", dir, "--until", "2026-03-02T09:00:00"},
		{"log", dir, "--since", "1500-01-01T00:00:00Z"},
		{"log", dir, "--json=maybe"},
		{"log", dir, "--type", "claimed"},
		{"export", dir, "--from", "1e3"},
		{"export", dir, "--to", " "},
		{"state", dir, "--at-seq", "x"},
		{"state", dir, "--at-seq", "-1"},
		{"state", dir, "--at-seq", "1000"},
		{"state", dir, "--at", "3000-01-01T00:00:00Z"},
		{"state", dir, "--snapshot-every", "many"},
		{"state", dir, "--snapshot-every", "3"},
		{"state", dir, "--no-cache=perhaps"},
		{"stats", dir, "--progress", "sometimes"},
		{"demo", "--seed", "0x1f"},
	}
	var b strings.Builder
	for _, args := range cases {
		r := replay(t, args...)
		if r.code != exitError {
			t.Errorf("replay %q: exit %d, want %d", args, r.code, exitError)
		}
		for _, jargon := range []string{"strconv", "Parse", "parsing", "invalid argument", "invalid syntax"} {
			if strings.Contains(r.stderr, jargon) {
				t.Errorf("replay %q: the message has %q in it:\n%s", args, jargon, r.stderr)
			}
		}
		fmt.Fprintf(&b, "$ replay %s\nexit %d\n%s\n", strings.Join(quoteArgs(args), " "), r.code, r.stderr)
	}
	golden(t, "errors.txt", normalize(b.String(), dir))
}

// quoteArgs quotes the arguments a shell would split or drop.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			out[i] = fmt.Sprintf("%q", a)
		}
	}
	return out
}
