package main

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// workFilter is the --state and --task-kind filters of state and timeline: which tasks (and
// wakes) are listed. The counts in the headings stay those of everything.
type workFilter struct {
	states []string // task states and wake states, e.g. running, failed, available
	kinds  []string // task kinds
}

var (
	taskStateNames = []string{"pending", "running", "succeeded", "failed", "canceled"}
	wakeStateNames = []string{"available", "claimed", "acked"}
)

func (f *workFilter) register(c *cobra.Command, wakes bool) {
	what := "only tasks in these states (pending, running, succeeded, failed, canceled"
	if wakes {
		what += ") and wakes in these (available, claimed, acked"
	}
	c.Flags().StringSliceVar(&f.states, "state", nil, what+"); repeat or comma-separate")
	c.Flags().StringSliceVar(&f.kinds, "task-kind", nil, "only tasks of these kinds; repeat or comma-separate")
}

// check refuses a state no task or wake can be in.
func (f *workFilter) check(c *cobra.Command, wakes bool) error {
	valid := taskStateNames
	if wakes {
		valid = append(slices.Clone(taskStateNames), wakeStateNames...)
	}
	for i, s := range f.states {
		s = strings.TrimSpace(s)
		f.states[i] = s
		if !slices.Contains(valid, s) {
			return usagef(c, "--state: %q is not a state; the states are %s", s, strings.Join(valid, ", "))
		}
	}
	for i, k := range f.kinds {
		f.kinds[i] = strings.TrimSpace(k)
	}
	return nil
}

func (f *workFilter) active() bool { return len(f.states) > 0 || len(f.kinds) > 0 }

// task reports whether a task of kind in state is listed.
func (f *workFilter) task(kind, state string) bool {
	return (len(f.states) == 0 || slices.Contains(f.states, state)) && (len(f.kinds) == 0 || slices.Contains(f.kinds, kind))
}

// wake reports whether a wake in state is listed: with --task-kind no wake is (wakes have no
// kind), with --state those in a listed state.
func (f *workFilter) wake(state string) bool {
	return len(f.kinds) == 0 && (len(f.states) == 0 || slices.Contains(f.states, state))
}

// describe is the filter as a clause: `--state running --task-kind email`.
func (f *workFilter) describe() string {
	var parts []string
	if len(f.states) > 0 {
		parts = append(parts, "--state "+word(strings.Join(f.states, ",")))
	}
	if len(f.kinds) > 0 {
		parts = append(parts, "--task-kind "+word(strings.Join(f.kinds, ",")))
	}
	return strings.Join(parts, " ")
}
