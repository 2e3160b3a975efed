package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/worklog/worklog/work"
)

// taskRequests makes n requests of kind, the i-th with the input {"n":i} and, when keyed, the
// idempotency key "key-i" (inputOf and keyOfRequest name them).
func taskRequests(n int, kind string, keyed bool) []work.TaskRequest {
	rs := make([]work.TaskRequest, n)
	for i := range rs {
		rs[i] = work.TaskRequest{Kind: kind, Input: []byte(inputOf(i))}
		if keyed {
			rs[i].IdempotencyKey = keyOfRequest(i)
		}
	}
	return rs
}

func inputOf(i int) string      { return fmt.Sprintf(`{"n":%d}`, i) }
func keyOfRequest(i int) string { return fmt.Sprint("key-", i) }

// checkSubmitted reads back what a SubmitMany of rs answered (res): each result has no error
// and its task is stored, with the request's kind and input, under its id and, when the
// request had a key, under its key.
func checkSubmitted(t *testing.T, s *work.Session, rs []work.TaskRequest, res []work.SubmitResult) {
	t.Helper()
	ctx := context.Background()
	if len(res) != len(rs) {
		t.Fatalf("%d results for %d requests", len(res), len(rs))
	}
	for i, r := range res {
		got, found, err := s.Task(ctx, r.Task.ID)
		if r.Err != nil || err != nil || !found || got.Kind != rs[i].Kind || string(got.Input) != string(rs[i].Input) {
			t.Fatalf("item %d: %+v / %+v, %v, %v", i, r, got, found, err)
		}
		if rs[i].IdempotencyKey == "" {
			continue
		}
		if byKey, err := s.TaskByKey(ctx, rs[i].IdempotencyKey); err != nil || byKey.ID != r.Task.ID {
			t.Fatalf("item %d by its key %s: %+v, %v; want task %s", i, rs[i].IdempotencyKey, byKey, err, r.Task.ID)
		}
	}
}
