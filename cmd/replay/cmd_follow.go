package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
)

// log --follow (issue 21 §1): after the log, the events committed from then on, in the same
// format, until Ctrl-C (or SIGTERM) ends replay cleanly (status 0).

const followHelp = `
--follow keeps printing: after the log, each event once it is committed, until Ctrl-C. On a
PostgreSQL URL it sees the commits of every process (it waits on the queue's LISTEN channel,
not a timer). On a store directory that a running process holds it sees that process's
events once they are durable, through the process's inspection endpoint (no timer either).
On a store directory no process has open, replay's own lock keeps any writer out while it
follows: nothing more will come, and replay says so.`

// follower is a store whose log replay can follow: a PostgreSQL queue (postgres.Store.Follow)
// or a held store's endpoint (inspect.Client.Follow).
type follower interface {
	Follow(ctx context.Context, from uint64, fn func(events.Event) error) error
}

// frameFollower is a follower that says when a batch of events ends (inspect.Client):
// replay flushes its output then, not after every event.
type frameFollower interface {
	FollowFlushing(ctx context.Context, from uint64, fn func(events.Event) error, flush func() error) error
}

// followLog prints, through emit, every event from from on as it commits (of session only,
// when not ""; emit applies log's other filters), until the command's context ends (Ctrl-C)
// or SIGTERM: both are a clean end. What it prints is flushed after each event, or after
// each batch of them from a held store's endpoint.
func (a *app) followLog(c *cobra.Command, st store, dir string, from uint64, session string, emit func(events.Event) error) error {
	if err := a.out.Flush(); err != nil {
		return fmt.Errorf("writing output: %w", err)
	}
	ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if f, ok := st.(frameFollower); ok {
		// Each frame of a held store's endpoint is written at once: many events, one write.
		err = f.FollowFlushing(ctx, from, func(ev events.Event) error {
			if session != "" && ev.Head().SessionID != session {
				return nil
			}
			return emit(ev)
		}, a.out.Flush)
	} else if f, ok := st.(follower); ok {
		err = f.Follow(ctx, from, func(ev events.Event) error {
			if session != "" && ev.Head().SessionID != session {
				return nil
			}
			if err := emit(ev); err != nil {
				return err
			}
			return a.out.Flush()
		})
	} else {
		fmt.Fprintf(a.stderr, "replay: following %s: no process can write it while replay holds its lock, so no event will come; Ctrl-C ends\n", dir)
		<-ctx.Done()
		err = ctx.Err()
	}
	switch {
	case errors.Is(err, errStop): // --limit reached
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil // Ctrl-C or SIGTERM: the way to end a follow
	}
	return err
}
