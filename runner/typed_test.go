package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

type greetArgs struct {
	Name string `json:"name"`
}

func (greetArgs) Kind() string { return "greet" }

type greeting struct {
	Text string `json:"text"`
}

func ExampleTyped() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()

	req, err := work.RequestFor(greetArgs{Name: "ada"})
	if err != nil {
		panic(err)
	}
	t, err := q.Session("s1").Submit(ctx, req)
	if err != nil {
		panic(err)
	}

	hooks := doneHooks{done: make(chan runner.Result, 1)}
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{
			greetArgs{}.Kind(): runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (greeting, error) {
				return greeting{Text: "hello, " + a.Name}, nil
			}),
		},
		Concurrency: 4,
		LeaseFor:    time.Minute,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:       hooks,
	})
	if err != nil {
		panic(err)
	}
	if err := r.Start(); err != nil {
		panic(err)
	}
	<-hooks.done
	if err := r.Stop(ctx); err != nil {
		panic(err)
	}
	done, _, err := q.Session("s1").Task(ctx, t.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(done.State, string(done.Outcome.Output))
	// Output: succeeded {"text":"hello, ada"}
}

// typedTask is a task as a runner's handler would get it.
func typedTask(kind, input string) work.Task {
	return work.Task{ID: "task-1", Kind: kind, Input: json.RawMessage(input)}
}

func TestTypedDecodeFailureIsPermanent(t *testing.T) {
	called := false
	h := runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (greeting, error) {
		called = true
		return greeting{}, nil
	})
	_, err := h(context.Background(), typedTask("greet", `{"name":7}`))
	if !runner.IsPermanent(err) || !errors.Is(err, work.ErrInvalidRequest) {
		t.Fatalf("an input that does not decode: %v, want a Permanent ErrInvalidRequest", err)
	}
	if !strings.Contains(err.Error(), `"greet"`) || !strings.Contains(err.Error(), "name") {
		t.Errorf("%q does not name the kind and the field", err)
	}
	if called {
		t.Error("the handler ran on an input that does not decode")
	}
}

func TestTypedResults(t *testing.T) {
	ctx := context.Background()
	in := typedTask("greet", `{"name":"ada"}`)

	out, err := runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (greeting, error) {
		return greeting{Text: a.Name}, nil
	})(ctx, in)
	if err != nil || string(out) != `{"text":"ada"}` {
		t.Fatalf("a result: %s, %v", out, err)
	}

	// A zero or nil result with no error is an empty output.
	out, err = runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (greeting, error) {
		return greeting{}, nil
	})(ctx, in)
	if err != nil || out != nil {
		t.Fatalf("a zero result: %q, %v, want no output", out, err)
	}
	out, err = runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (*greeting, error) {
		return nil, nil
	})(ctx, in)
	if err != nil || out != nil {
		t.Fatalf("a nil result: %q, %v, want no output", out, err)
	}

	// The handler's error is returned as it is: retried unless the handler says otherwise.
	boom := errors.New("boom")
	_, err = runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (greeting, error) {
		return greeting{}, boom
	})(ctx, in)
	if !errors.Is(err, boom) || runner.IsPermanent(err) {
		t.Fatalf("a handler's error: %v, want boom, not permanent", err)
	}

	// A result that does not encode is a failure (retried), naming the kind.
	_, err = runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (float64, error) {
		return math.NaN(), nil
	})(ctx, in)
	if err == nil || runner.IsPermanent(err) || !strings.Contains(err.Error(), `"greet"`) {
		t.Fatalf("a result that does not encode: %v, want a retried failure naming the kind", err)
	}
}

// TestTypedThroughRunner runs typed handlers on a queue: a good input succeeds with the
// encoded result, a bad one fails at its first attempt although MaxAttempts allows more.
func TestTypedThroughRunner(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	s := q.Session("s1")
	good, err := work.RequestFor(greetArgs{Name: "grace"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.Submit(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Submit(ctx, work.TaskRequest{Kind: "greet", Input: json.RawMessage(`["not","an","object"]`)})
	if err != nil {
		t.Fatal(err)
	}
	hooks := doneHooks{done: make(chan runner.Result, 2)}
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{
			"greet": runner.Typed(func(ctx context.Context, t work.Task, a greetArgs) (greeting, error) {
				return greeting{Text: "hi " + a.Name}, nil
			}),
		},
		Concurrency: 4,
		LeaseFor:    time.Minute,
		MaxAttempts: 5,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:       hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-hooks.done:
		case <-time.After(30 * time.Second):
			t.Fatal("the runner did not finish two tasks")
		}
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	gt, _, _ := s.Task(ctx, g.ID)
	if gt.State != work.TaskSucceeded || string(gt.Outcome.Output) != `{"text":"hi grace"}` {
		t.Errorf("good task: %s %+v", gt.State, gt.Outcome)
	}
	bt, _, _ := s.Task(ctx, b.ID)
	if bt.State != work.TaskFailed || bt.Attempts != 1 || !strings.Contains(bt.Outcome.Error, "greet") {
		t.Errorf("bad task: %s after %d attempts, %+v; want failed at once, naming the kind", bt.State, bt.Attempts, bt.Outcome)
	}
}
