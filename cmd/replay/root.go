package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/spf13/cobra"
)

// Exit statuses. Documented in docs/replay.md and in `replay --help`.
const (
	exitOK       = 0
	exitFindings = 1 // verify found differences
	exitError    = 2 // anything else: usage, a missing or foreign or locked or newer store, a corrupt event
)

// app holds what every command shares: the output streams and the global flags.
type app struct {
	out        *bufio.Writer // stdout, buffered; flushed when the command ends
	stdout     io.Writer     // stdout itself, to tell whether it is a terminal
	stderr     io.Writer
	showTokens bool
	progress   string // auto, always or never
	archive    string // --archive: the store's archive of pruned events (archive.go)
}

// exitCode ends a command with a status and no further message: the command has printed
// what it had to say.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// usageError is a mistake in the command line; the message is followed by a hint to --help.
type usageError struct {
	cmd string
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd *cobra.Command, format string, args ...any) error {
	return &usageError{cmd: cmd.CommandPath(), msg: fmt.Sprintf(format, args...)}
}

// run is main without the process: tests call it directly too.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	a := &app{out: bufio.NewWriterSize(stdout, 64<<10), stdout: stdout, stderr: stderr, progress: "auto"}
	defer func() {
		// Never a stack trace: a bug shows as one line and the failing status.
		if r := recover(); r != nil {
			a.out.Flush()
			fmt.Fprintf(stderr, "replay: internal error: %v\n", r)
			code = exitError
		}
	}()
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(a.out)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if ferr := a.out.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("writing output: %w", ferr)
	}
	return a.report(err)
}

// report prints err, if any, and returns the exit status.
func (a *app) report(err error) int {
	if err == nil {
		return exitOK
	}
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(a.stderr, "replay: interrupted")
		return exitError
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(a.stderr, "replay: %s\nRun '%s --help' for usage.\n", ue.msg, ue.cmd)
		return exitError
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown flag") ||
		strings.HasPrefix(msg, "unknown shorthand flag") {
		fmt.Fprintf(a.stderr, "replay: %s\nRun 'replay --help' for usage.\n", msg)
		return exitError
	}
	fmt.Fprintf(a.stderr, "replay: %s\n", msg)
	return exitError
}

const rootLong = `replay reads a worklog store and explains it: the event log in order, the state of every
task and wake at any past point (time travel), one session's story, why a task is in its
state, a consistency check, statistics and a JSON export.

Wherever a command takes a store directory (DIR) it also takes a PostgreSQL queue, as a
postgres:// or postgresql:// URL (the queue in schema worklog, or the one its search_path
names), read through read-only transactions: the same output for the same log.

Every command except demo and import is read-only: it opens the store with pebblelog's
ReadOnly option and never writes into the store directory. import loads a log written by
export --wire into an empty store of either backend. A store held open by a running process
(Pebble locks it, even for reading) is read live through that process's inspection endpoint,
a Unix socket that work.Open serves for its own user (unless work.Options.NoInspect): log
[--follow], state, timeline, task, stats, verify and serve read it while it runs.

Lease tokens are shown as [redacted] unless --show-tokens is given.

Exit status: 0 when the command succeeded, 1 when verify found differences, 2 for any other
failure (a usage mistake, a missing directory, a directory that is not a store, a store of a
newer format, a locked store whose endpoint does not answer, a corrupt event).

See docs/replay.md for the cost of each command and docs/replay-json.md for the JSON output.`

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "replay",
		Short: "Audit, debug and time-travel over a worklog store",
		Long:  rootLong,
		Example: `  replay demo                               # build a sample store and show what replay does
  replay log ./store --session checkout-4821
  replay state ./store --at 2026-03-02T09:01:00Z
  replay verify ./store
  replay stats 'postgres://worklog@db.internal/jobs?search_path=queue1'`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &usageError{cmd: c.CommandPath(), msg: flagErrorText(err)}
	})
	pf := root.PersistentFlags()
	pf.BoolVar(&a.showTokens, "show-tokens", false, "print lease tokens instead of [redacted] (they fence workers: keep them private)")
	pf.StringVar(&a.archive, "archive", "", "read the store with its archive of pruned events (work.Options.ArchiveDir): history across the pruned horizon")
	pf.StringVar(&a.progress, "progress", "auto", "progress on stderr: auto (only when stderr is a terminal), always or never")
	root.PersistentPreRunE = func(c *cobra.Command, _ []string) error {
		if a.archive != "" && (c.Name() == "demo" || c.Name() == "import") {
			return usagef(c, "--archive is read by the commands that read a store; %s does not", c.Name())
		}
		switch a.progress {
		case "auto", "always", "never":
			return nil
		}
		return usagef(c, "--progress: %q is not auto, always or never", a.progress)
	}
	root.AddCommand(
		a.logCommand(),
		a.stateCommand(),
		a.timelineCommand(),
		a.taskCommand(),
		a.verifyCommand(),
		a.statsCommand(),
		a.exportCommand(),
		a.importCommand(),
		a.demoCommand(),
		a.serveCommand(),
		a.versionCommand(),
	)
	// --version prints what the version command prints.
	root.Flags().Bool("version", false, "print the version and the store formats (as replay version)")
	root.Version = buildVersion().text()
	root.SetVersionTemplate("{{.Version}}")
	return root
}

// storeArg is the Args check of every command that takes the store directory and
// extra fixed arguments.
func storeArgs(names ...string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		want := append([]string{"DIR"}, names...)
		if len(args) == len(want) {
			return nil
		}
		if len(args) < len(want) {
			return usagef(c, "%s needs %s: replay %s %s", c.Name(), strings.Join(want[len(args):], " and "),
				c.Name(), strings.Join(want, " "))
		}
		return usagef(c, "%s takes %d argument(s) (%s), got %d: %q", c.Name(), len(want),
			strings.Join(want, " "), len(args), args)
	}
}
