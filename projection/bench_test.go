package projection

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
)

// foldStream is a realistic log, encoded: tasks arrive in batches of 100; each is submitted
// (with a completion wake), claimed, settled; its completion wake is recorded, claimed and
// acknowledged. Six events a task, with the ids, tokens and small JSON documents of real use.
func foldStream(tb testing.TB, tasks int) [][]byte {
	const batch = 100
	var out [][]byte
	var buf []byte
	at := int64(1_767_225_600_000_000_000)
	add := func(ev events.Event) {
		ev.Head().Seq = uint64(len(out) + 1)
		var err error
		if buf, err = events.Append(buf[:0], ev); err != nil {
			tb.Fatal(err)
		}
		out = append(out, append([]byte(nil), buf...))
	}
	h := func(i int) events.Header {
		at += 1000
		return events.Header{SessionID: fmt.Sprintf("sess_0192f3a4-0000-7000-8000-%012d", i%50), At: at}
	}
	taskID := func(i int) string { return fmt.Sprintf("task_0192f3a4-7b1c-7d2e-8f90-%012d", i) }
	wakeID := func(i int) string { return fmt.Sprintf("wake_0192f3a4-8c2d-7e3f-9a01-%012d", i) }
	token := func(i int) string { return fmt.Sprintf("%032x", uint64(i)*0x9e3779b97f4a7c15) }
	for b := 0; b < tasks; b += batch {
		n := min(batch, tasks-b)
		for i := b; i < b+n; i++ {
			add(&events.TaskSubmitted{Header: h(i), TaskID: taskID(i), Kind: "email.send",
				Input:            []byte(fmt.Sprintf(`{"to":"user%d@example.com","template":"welcome"}`, i)),
				IdempotencyKey:   fmt.Sprintf("signup-%d", i),
				WakeOnCompletion: true})
		}
		for i := b; i < b+n; i++ {
			e := h(i)
			add(&events.TaskClaimed{Header: e, TaskID: taskID(i), Attempt: 1, LeaseToken: token(i), LeaseExpiresAt: e.At + 30e9})
		}
		for i := b; i < b+n; i++ {
			o := events.Outcome{State: events.StateSucceeded, Summary: "sent", Output: []byte(`{"message_id":"<42@example.com>"}`)}
			add(&events.TaskSettled{Header: h(i), TaskID: taskID(i), Attempt: 1, LeaseToken: token(i), Outcome: o})
			add(&events.WakeRecorded{Header: h(i), WakeID: wakeID(i), Reason: events.WakeTaskFinished, TaskID: taskID(i), Outcome: o})
		}
		for i := b; i < b+n; i++ {
			e := h(i)
			add(&events.WakeClaimed{Header: e, WakeID: wakeID(i), Attempt: 1, LeaseToken: token(-i), LeaseExpiresAt: e.At + 30e9})
		}
		for i := b; i < b+n; i++ {
			add(&events.WakeAcked{Header: h(i), WakeID: wakeID(i), Attempt: 1, LeaseToken: token(-i)})
		}
	}
	return out
}

func decodeStream(tb testing.TB, stream [][]byte) []events.Event {
	evs := make([]events.Event, len(stream))
	for i, b := range stream {
		var err error
		if evs[i], err = events.Decode(b, uint64(i+1)); err != nil {
			tb.Fatal(err)
		}
	}
	return evs
}

func TestFoldStream(t *testing.T) {
	stream := foldStream(t, 1000)
	m := fold(t, decodeStream(t, stream))
	checkInvariants(t, m)
	if tasks, wakes := m.Len(); tasks != 1000 || wakes != 1000 {
		t.Errorf("Len = %d, %d", tasks, wakes)
	}
	if d := dueOf(t, m); len(d) != 0 {
		t.Errorf("%d tasks still due", len(d))
	}
}

// BenchmarkFold rebuilds a Mem from an encoded log of 120,000 events (20,000 tasks): the work
// of recovery. decode+apply is the rebuild; decode and apply alone show where the time goes.
func BenchmarkFold(b *testing.B) {
	stream := foldStream(b, 20_000)
	evs := decodeStream(b, stream)
	var size int
	for _, x := range stream {
		size += len(x)
	}
	// events/s and ns/event are wall time; events/cpu-s is per second of this process's CPU
	// time (GC included), the better figure on a busy machine. Run with -cpu 1 for one core.
	type mark struct {
		mallocs uint64
		cpu     time.Duration
	}
	start := func() mark { return mark{mallocs(), cpuTime()} }
	report := func(b *testing.B, m mark) {
		n := float64(b.N) * float64(len(stream))
		b.ReportMetric(n/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/event")
		if cpu := cpuTime() - m.cpu; cpu > 0 {
			b.ReportMetric(n/cpu.Seconds(), "events/cpu-s")
		}
		b.ReportMetric(float64(mallocs()-m.mallocs)/n, "allocs/event")
		b.ReportMetric(0, "ns/op")
	}
	// decode+apply/sized folds into a state sized in advance (NewMemSized), as a rebuild that
	// knows how many tasks and wakes to expect can: no map growth.
	for _, sized := range []bool{false, true} {
		name := "decode+apply"
		if sized {
			name += "/sized"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(size))
			m0 := start()
			for b.Loop() {
				m := NewMem()
				if sized {
					m = NewMemSized(20_000, 20_000)
				}
				for i, x := range stream {
					ev, err := events.Decode(x, uint64(i+1))
					if err != nil {
						b.Fatal(err)
					}
					if err := Apply(m, ev); err != nil {
						b.Fatal(err)
					}
				}
			}
			report(b, m0)
		})
	}
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(size))
		m0 := start()
		for b.Loop() {
			for i, x := range stream {
				if _, err := events.Decode(x, uint64(i+1)); err != nil {
					b.Fatal(err)
				}
			}
		}
		report(b, m0)
	})
	b.Run("apply", func(b *testing.B) {
		m0 := start()
		for b.Loop() {
			m := NewMem()
			for _, ev := range evs {
				if err := Apply(m, ev); err != nil {
					b.Fatal(err)
				}
			}
		}
		report(b, m0)
	})
}

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}
