package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestCacheDropsLargeRecords: a record whose values exceed cacheValueMax is not kept from one
// group to the next, whether the group wrote it (a submit with a large input, a settle with
// a large output) or read it from the server, and the bound of stored ids (cache.maxTask)
// covers it, so the fast path still reads it instead of taking it for absent. adopt finds
// them by the group's notes (noteBig), not by a walk of the whole cache.
func TestCacheDropsLargeRecords(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	large := []byte(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", cacheValueMax)))
	cached := func(id string) bool { _, ok := e.cache.tasks[id]; return ok }

	small, err := s.Submit(ctx, work.TaskRequest{Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if !cached(small.ID) {
		t.Fatal("a small task is not in the cache after its submit: the case proves nothing")
	}
	big, err := s.Submit(ctx, work.TaskRequest{Kind: "big", Input: large})
	if err != nil {
		t.Fatal(err)
	}
	if cached(big.ID) {
		t.Error("a task with a large input stayed in the cache after its submit")
	}
	if e.cache.maxTask < big.ID {
		t.Errorf("the cache's bound %q is below the dropped task %q", e.cache.maxTask, big.ID)
	}
	ds, err := q.ClaimDue(ctx, time.Minute, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claimed %d, %v", len(ds), err)
	}
	for _, d := range ds {
		if d.Task.ID == big.ID && cached(big.ID) {
			t.Error("a task with a large input read by a claim stayed in the cache")
		}
		if _, err := q.Finish(ctx, d, work.Success(large)); err != nil {
			t.Fatal(err)
		}
	}
	if cached(small.ID) {
		t.Error("a task settled with a large output stayed in the cache")
	}
	for _, id := range []string{small.ID, big.ID} {
		got, found, err := s.Task(ctx, id)
		if err != nil || !found || got.State != work.TaskSucceeded || got.Outcome == nil || string(got.Outcome.Output) != string(large) {
			t.Fatalf("task %s after its settle: %v %v %+v", id, found, err, got.State)
		}
	}
	mustVerify(t, q)
}
