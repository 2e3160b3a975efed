package work_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

type resizeArgs struct {
	Image string `json:"image"`
	Width int    `json:"width"`
}

func (resizeArgs) Kind() string { return "resize" }

// ptrArgs implements Args with a pointer receiver.
type ptrArgs struct{ N int }

func (*ptrArgs) Kind() string { return "ptr" }

type blankKind struct{}

func (blankKind) Kind() string { return " " }

type unencodable struct{ C chan int }

func (unencodable) Kind() string { return "chan" }

func ExampleRequestFor() {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()

	req, err := work.RequestFor(resizeArgs{Image: "cover.png", Width: 64})
	if err != nil {
		panic(err)
	}
	req.IdempotencyKey = "resize:cover.png:64" // the other fields are the caller's to set
	t, err := q.Session("s1").Submit(ctx, req)
	if err != nil {
		panic(err)
	}

	ds, err := q.ClaimDue(ctx, time.Minute, 1)
	if err != nil {
		panic(err)
	}
	args, err := work.DecodeInput[resizeArgs](ds[0].Task)
	if err != nil {
		panic(err)
	}
	fmt.Println(t.Kind, string(t.Input))
	fmt.Println(args.Image, args.Width)
	// Output:
	// resize {"image":"cover.png","width":64}
	// cover.png 64
}

func TestRequestFor(t *testing.T) {
	r, err := work.RequestFor(&ptrArgs{N: 3})
	if err != nil || r.Kind != "ptr" || string(r.Input) != `{"N":3}` {
		t.Fatalf("RequestFor(&ptrArgs) = %+v, %v", r, err)
	}
	for _, c := range []struct {
		name  string
		args  work.Args
		field string
	}{
		{"nil", nil, "input"},
		{"nil pointer", (*ptrArgs)(nil), "input"},
		{"blank kind", blankKind{}, "kind"},
		{"does not encode", unencodable{C: make(chan int)}, "input"},
	} {
		_, err := work.RequestFor(c.args)
		var we *work.Error
		if !errors.Is(err, work.ErrInvalidRequest) || !errors.As(err, &we) || we.Field != c.field {
			t.Errorf("%s: RequestFor = %v, want ErrInvalidRequest naming %q", c.name, err, c.field)
		}
	}
}

func TestDecodeInput(t *testing.T) {
	task := work.Task{ID: "t1", Kind: "resize", Input: json.RawMessage(`{"image":"a.png","width":8,"extra":true}`)}
	a, err := work.DecodeInput[resizeArgs](task)
	if err != nil || a != (resizeArgs{Image: "a.png", Width: 8}) {
		t.Fatalf("DecodeInput = %+v, %v", a, err)
	}
	// A type that is not Args decodes any kind's input.
	m, err := work.DecodeInput[map[string]any](task)
	if err != nil || m["image"] != "a.png" {
		t.Fatalf("DecodeInput[map] = %v, %v", m, err)
	}
	// No input: the zero value.
	if z, err := work.DecodeInput[resizeArgs](work.Task{Kind: "resize"}); err != nil || z != (resizeArgs{}) {
		t.Fatalf("DecodeInput(no input) = %+v, %v", z, err)
	}
	// A pointer type whose Kind has a pointer receiver is checked too.
	if p, err := work.DecodeInput[*ptrArgs](work.Task{Kind: "ptr", Input: json.RawMessage(`{"N":2}`)}); err != nil || p.N != 2 {
		t.Fatalf("DecodeInput[*ptrArgs] = %+v, %v", p, err)
	}

	for _, c := range []struct {
		name string
		task work.Task
		want []string
	}{
		{"wrong type", work.Task{ID: "t2", Kind: "resize", Input: json.RawMessage(`{"width":"wide"}`)}, []string{`"resize"`, "t2", "width"}},
		{"another kind", work.Task{ID: "t3", Kind: "crop", Input: json.RawMessage(`{}`)}, []string{`"crop"`, `"resize"`}},
	} {
		_, err := work.DecodeInput[resizeArgs](c.task)
		var we *work.Error
		if !errors.Is(err, work.ErrInvalidRequest) || !errors.As(err, &we) || we.Field != "input" {
			t.Fatalf("%s: DecodeInput = %v, want ErrInvalidRequest naming input", c.name, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %s", c.name, err, w)
			}
		}
	}
	if _, err := work.DecodeInput[*ptrArgs](work.Task{Kind: "other"}); !errors.Is(err, work.ErrInvalidRequest) {
		t.Errorf("DecodeInput[*ptrArgs] of another kind = %v, want ErrInvalidRequest", err)
	}
}
