package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/worklog/worklog/work"
)

// Typed is a Handler whose input is decoded into A and whose result R is encoded as the
// task's output (a nil or zero R with no error: an empty output). An input that does not
// decode fails the task at once (Permanent), naming the kind and the decoder's error.
//
// A result that does not encode as JSON fails the attempt like any error (it is retried):
// the handler's work may have been done, and a result that cannot be stored is a bug to fix,
// not a task to give up on without a trace.
//
//	Handlers: map[string]runner.Handler{
//		ThumbnailArgs{}.Kind(): runner.Typed(func(ctx context.Context, t work.Task, a ThumbnailArgs) (Thumb, error) {
//			return makeThumbnail(ctx, a.Image)
//		}),
//	}
func Typed[A any, R any](fn func(ctx context.Context, t work.Task, args A) (R, error)) Handler {
	return func(ctx context.Context, t work.Task) (json.RawMessage, error) {
		args, err := work.DecodeInput[A](t)
		if err != nil {
			return nil, Permanent(err)
		}
		r, err := fn(ctx, t, args)
		if err != nil {
			return nil, err
		}
		if isZero(r) {
			return nil, nil
		}
		out, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("kind %q: the result %T does not encode as JSON: %w", t.Kind, r, err)
		}
		return out, nil
	}
}

// isZero reports whether r is its type's zero value (a nil pointer, map or slice included),
// which Typed stores as an empty output.
func isZero[R any](r R) bool {
	v := reflect.ValueOf(&r).Elem()
	return v.IsZero()
}
