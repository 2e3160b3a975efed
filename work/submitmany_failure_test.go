package work_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// TestSubmitManyFailedWriteRecordsNothing (spec part 3, "Batch submit": the returned error
// is for the batch as a whole, and then nothing was recorded): the WAL write of a batch of
// 500 submits fails; SubmitMany returns ErrBackend wrapping pebblelog.ErrStoreFailed and no
// result, and after a restart (a crash clone of the disk) the store holds none of the batch (its keys are free, its log
// ends where it ended before), and a batch submitted then succeeds whole.
func TestSubmitManyFailedWriteRecordsNothing(t *testing.T) {
	var armed atomic.Bool // once armed, the next WAL write fails
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite && armed.CompareAndSwap(true, false) {
			return errorfs.ErrInjected
		}
		return nil
	})
	const dir = "/data/store"
	mem := vfs.NewCrashableMem()
	q, err := work.Open(dir, &work.Options{FS: errorfs.Wrap(mem, inj)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := q.Session("s1")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	rs := make([]work.TaskRequest, 500)
	for i := range rs {
		rs[i] = work.TaskRequest{Kind: "k", Input: []byte(fmt.Sprint(i)), IdempotencyKey: fmt.Sprintf("key-%d", i)}
	}
	armed.Store(true)
	res, err := s.SubmitMany(ctx, rs)
	if !errors.Is(err, work.ErrBackend) || !errors.Is(err, pebblelog.ErrStoreFailed) {
		t.Fatalf("SubmitMany on a failing WAL: %v, want ErrBackend wrapping pebblelog.ErrStoreFailed", err)
	}
	if res != nil {
		t.Errorf("a failed batch returned %d results", len(res))
	}
	// A failed WAL write leaves Pebble blocked and the store locked until the process ends
	// (design §7.4): what a restart finds is the disk as it is, which a crash clone of the
	// in-memory FS is (everything not synced is lost). The failed queue is closed in the
	// background: its Close waits for Pebble's stall timeout.
	t.Cleanup(func() { go q.Close() })
	q, err = work.Open(dir, &work.Options{FS: mem.CrashClone(vfs.CrashCloneCfg{})})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var types []events.Type
	if err := q.ReadLog(ctx, 0, func(ev events.Event) error { types = append(types, ev.Type()); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(types) != 1 {
		t.Fatalf("after the failed batch the log holds %d events, want the one before it", len(types))
	}
	for _, key := range []string{"key-0", "key-499"} {
		if _, err := q.Session("s1").TaskByKey(ctx, key); !errors.Is(err, work.ErrTaskNotFound) {
			t.Errorf("TaskByKey(%s) after the failed batch: %v, want ErrTaskNotFound", key, err)
		}
	}
	res, err = q.Session("s1").SubmitMany(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Task.State != work.TaskPending {
			t.Fatalf("item %d of the batch after the reopen: %v", i, r.Err)
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
