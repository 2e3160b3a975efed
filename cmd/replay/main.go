// Command replay reads a worklog store, read-only: the event log in order, the state of every
// task and wake at any past point (time travel), one session's story, why a task is in its
// state, a consistency check, statistics and a JSON export. `replay demo` builds a sample
// store to try it on. See docs/replay.md.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
