package source_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/inspect"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// views is what a View answers to every method of projection.Reader over the given ids.
type views struct {
	Last       uint64
	Tasks      []projection.Task
	Wakes      []projection.Wake
	Keys       []string
	Index      map[string][]projection.IndexEntry
	FirstOnly  map[string][]projection.IndexEntry // a scan stopped after one entry
	SessTasks  map[string][]string
	Counts     []string
	Policies   []projection.KindPolicy
	Policy     []projection.KindPolicy
	Schedules  []projection.Schedule
	Schedule   []projection.Schedule
	SchedDue   []projection.ScheduleEntry
	AfterStops uint64 // LastSeq read after the stopped scans: the view goes on
}

func viewAll(t *testing.T, s source.Source, r read, kinds, sessions []string) views {
	t.Helper()
	var v views
	err := s.View(context.Background(), func(rd projection.Reader) error {
		var err error
		if v.Last, err = rd.LastSeq(); err != nil {
			return err
		}
		for _, x := range r.Tasks {
			got, err := rd.Task(x.ID)
			if err != nil || got == nil {
				return fmt.Errorf("task %s: %v", x.ID, err)
			}
			v.Tasks = append(v.Tasks, *got)
			if x.IdempotencyKey != "" {
				id, err := rd.TaskKey(x.SessionID, x.IdempotencyKey)
				if err != nil {
					return err
				}
				v.Keys = append(v.Keys, id)
			}
		}
		if got, err := rd.Task("task_none"); err != nil || got != nil {
			return fmt.Errorf("a missing task: %v %v", got, err)
		}
		for _, x := range r.Wakes {
			got, err := rd.Wake(x.ID)
			if err != nil || got == nil {
				return fmt.Errorf("wake %s: %v", x.ID, err)
			}
			v.Wakes = append(v.Wakes, *got)
			if x.IdempotencyKey != "" {
				id, err := rd.WakeKey(x.SessionID, x.IdempotencyKey)
				if err != nil {
					return err
				}
				v.Keys = append(v.Keys, id)
			}
		}
		v.Index, v.FirstOnly = map[string][]projection.IndexEntry{}, map[string][]projection.IndexEntry{}
		for ix := range projection.NumIndexes {
			parts := []string{""}
			switch projection.Indexes[ix].Part {
			case "kind":
				parts = kinds
			case "session":
				parts = sessions
			}
			for _, p := range parts {
				key := fmt.Sprintf("%d/%s", ix, p)
				if err := rd.ScanIndex(ix, p, math.MinInt64, math.MaxInt64, func(e projection.IndexEntry) bool {
					v.Index[key] = append(v.Index[key], e)
					return true
				}); err != nil {
					return err
				}
				if err := rd.ScanIndex(ix, p, math.MinInt64, math.MaxInt64, func(e projection.IndexEntry) bool {
					v.FirstOnly[key] = append(v.FirstOnly[key], e)
					return false
				}); err != nil {
					return err
				}
			}
		}
		v.SessTasks = map[string][]string{}
		for _, sess := range sessions {
			if err := rd.ScanSessionTasks(sess, 0, func(seq uint64, id string) bool {
				v.SessTasks[sess] = append(v.SessTasks[sess], fmt.Sprint(seq, id))
				return true
			}); err != nil {
				return err
			}
			if err := rd.ScanSessionSchedules(sess, func(x *projection.Schedule) bool {
				v.Schedules = append(v.Schedules, *x)
				got, err := rd.Schedule(sess, x.Name)
				if err != nil || got == nil {
					t.Errorf("Schedule(%s, %s): %v %v", sess, x.Name, got, err)
				} else {
					v.Schedule = append(v.Schedule, *got)
				}
				return true
			}); err != nil {
				return err
			}
		}
		if err := rd.Counts(func(kind string, st events.TaskState, n int64) bool {
			v.Counts = append(v.Counts, fmt.Sprint(kind, st, n))
			return true
		}); err != nil {
			return err
		}
		if err := rd.KindPolicies(func(p *projection.KindPolicy) bool {
			v.Policies = append(v.Policies, *p)
			got, err := rd.KindPolicy(p.Kind)
			if err != nil || got == nil {
				t.Errorf("KindPolicy(%s): %v %v", p.Kind, got, err)
			} else {
				v.Policy = append(v.Policy, *got)
			}
			return true
		}); err != nil {
			return err
		}
		if err := rd.ScanScheduleDue(math.MaxInt64, func(e projection.ScheduleEntry) bool {
			v.SchedDue = append(v.SchedDue, e)
			return true
		}); err != nil {
			return err
		}
		v.AfterStops, err = rd.LastSeq()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRemoteSourceReadsTheSameLog: a store held by a queue, read through its inspection
// endpoint (inspect.Client), answers every read of Source and every method of a View's
// projection.Reader as the same store opened read-only answers once the queue closed it.
func TestRemoteSourceReadsTheSameLog(t *testing.T) {
	ctx := context.Background()
	dir := buildLog(t)
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	at := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	// Beside buildLog's: many due tasks (scans come in batches), a kind policy, a schedule, keys.
	for i := range 1500 {
		r := work.TaskRequest{Kind: "bulk", Priority: i % 3}
		if i%10 == 0 {
			r.IdempotencyKey = fmt.Sprint("key-", i)
		}
		if _, err := q.Session("bulk").SubmitAt(ctx, r, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.SetKindPolicyAt(ctx, "bulk", work.KindPolicy{MaxRunning: 3, Rate: 2, Burst: 4}, at); err != nil {
		t.Fatal(err)
	}
	if err := q.Session("a").SetScheduleAt(ctx, work.Schedule{Name: "hourly", Cron: "@hourly", Task: work.TaskRequest{Kind: "tick"}}, at); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ClaimDueAt(ctx, at.Add(time.Second), time.Minute, 2); err != nil {
		t.Fatal(err)
	}
	c, err := inspect.Dial(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	kinds := []string{"bulk", "ka", "kb", "kp", "ks", "tick"}
	sess := append([]string{"bulk", "p"}, sessions...)
	remote := readAll(t, c)
	remoteView := viewAll(t, c, remote, kinds, sess)

	// Refused with the context's error, as the other sources refuse.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.LastSeq(done); !errors.Is(err, context.Canceled) {
		t.Errorf("LastSeq with a canceled context: %v", err)
	}
	if err := c.View(done, func(projection.Reader) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("View with a canceled context: %v", err)
	}

	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	ps, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	local := readAll(t, ps)
	localView := viewAll(t, ps, local, kinds, sess)
	if len(local.Tasks) < 1500 || len(localView.Index["0/"]) < 1400 || len(localView.Policies) != 1 || len(localView.Schedules) != 1 {
		t.Fatalf("the store lacks what the test wrote: %d tasks, %d due, %d policies, %d schedules",
			len(local.Tasks), len(localView.Index["0/"]), len(localView.Policies), len(localView.Schedules))
	}
	for _, pair := range [][2]any{{remote, local}, {remoteView, localView}} {
		va, vb := reflect.ValueOf(pair[0]), reflect.ValueOf(pair[1])
		for i := range va.NumField() {
			if f := va.Type().Field(i).Name; !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
				t.Errorf("%s differs:\n remote: %.600v\n local:  %.600v", f, va.Field(i).Interface(), vb.Field(i).Interface())
			}
		}
	}
}
