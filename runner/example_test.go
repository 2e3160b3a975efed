package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// doneHooks counts tasks as the runner records them.
type doneHooks struct {
	runner.NoHooks
	done chan runner.Result
}

func (h doneHooks) TaskEnd(_ context.Context, _ work.TaskDelivery, r runner.TaskResult) {
	h.done <- r.Result
}

func Example() {
	ctx := context.Background()
	q := work.NewInMemory() // or work.Open(dir, nil) for a durable store
	defer q.Close()

	// A producer session submits work.
	s := q.Session("session-1")
	for _, name := range []string{"ada", "grace"} {
		in, _ := json.Marshal(map[string]string{"name": name})
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "greet", Input: in}); err != nil {
			panic(err)
		}
	}
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "charge", Input: json.RawMessage(`{"cents":-5}`)}); err != nil {
		panic(err)
	}

	hooks := doneHooks{done: make(chan runner.Result, 10)}
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{
			"greet": func(ctx context.Context, t work.Task) (json.RawMessage, error) {
				var in struct{ Name string }
				if err := json.Unmarshal(t.Input, &in); err != nil {
					return nil, runner.Permanent(err) // retrying cannot help
				}
				return json.Marshal("hello, " + in.Name)
			},
			"charge": func(ctx context.Context, t work.Task) (json.RawMessage, error) {
				return nil, runner.Permanent(errors.New("negative amount"))
			},
		},
		Concurrency: 4,
		LeaseFor:    30 * time.Second, // extended every 10 s while a handler runs
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:       hooks,
	})
	if err != nil {
		panic(err)
	}
	if err := r.Start(); err != nil {
		panic(err)
	}
	for range 3 {
		<-hooks.done
	}
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		panic(err)
	}

	// The session reads its tasks' outcomes.
	tasks, err := s.Tasks(ctx, work.TaskFilter{Limit: 10})
	if err != nil {
		panic(err)
	}
	for _, t := range tasks {
		if t.State == work.TaskSucceeded {
			fmt.Println(t.Kind, t.State, string(t.Outcome.Output))
		} else {
			fmt.Println(t.Kind, t.State, t.Outcome.Error)
		}
	}
	// Output:
	// greet succeeded "hello, ada"
	// greet succeeded "hello, grace"
	// charge failed negative amount
}
