package postgres

import (
	"bytes"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/recordcodec"
)

// The writer's cache across other processes' writes (issue 24 §2). The log is the truth: a
// writer whose cache is exact at head H learns what every other writer changed since from
// the events after H. The begin batch reads them (changesSince), after the head's lock in
// the same round trip: the statement's snapshot (READ COMMITTED) is taken once the lock is
// granted, so it sees every event up to the locked head, and no writer can add one until
// this group ends. catchUp then drops from the cache exactly the entries those events may
// have changed, and adds the idempotency keys they wrote: the group re-reads only what
// others touched, instead of every record it touches.
//
// What changes a cache entry, by event type (projection.Apply):
//
//   - task_submitted: its task (absent before: a negative entry); its key, when it has one.
//     The key is folded (the cache learns it names the task) rather than dropped, so the
//     cache keeps holding every key committed after cache.from, which the key hints rely on
//     (readfirst.go). The event body holds the input; the key is read from the task's
//     record instead (tasks.rec, without the input), joined in the same statement.
//   - wake_recorded: its wake; its key (a requested wake's); a completion wake's task (its
//     CompletionWakeID). Read from the wake's record likewise.
//   - wake_acked: its wake; for a completion wake that is no longer its task's (detached by
//     a retry before it was acknowledged), the task too: the acknowledgment counts it off
//     the task's UnackedEarlierWakes. The task is read from the wake's record likewise; a
//     task in the cache that names the wake as its completion wake is not changed by it.
//   - every other task or wake event: its subject only (task_retried reads the completion
//     wake and writes no wake record; the audit events change nothing).
//   - schedule and kind events: schedules, kind policies and counts are never cached (read
//     in each group), nor are the greatest ids (read by every begin).
//
// A prune deletes records and keys without events to say which: it moves log_head.prunes,
// and the cache is dropped whole, as before. Side rows (SubmitTx's inbox, its rejects) are
// not cached. An event type this list does not know, a record missing where one must be,
// or more than catchUpMax events since the cache's head: the cache is dropped whole.
// TestCatchUpKnowsEveryEventType fails on an event type added without a rule here.

// catchUpMax bounds the events read to catch the cache up; past it the cache starts over.
const catchUpMax = 4096

// lastLen is how much of an event's body identifies it (cache.last): the envelope and the
// header (type, session, the command's time in nanoseconds) and the start of the subject's
// id. Two different events at one sequence number do not share it.
const lastLen = 128

func lastOf(body []byte) []byte { return append([]byte{}, body[:min(len(body), lastLen)]...) }

// change is one event from the cache's head on: rec is its subject's record where the rule
// needs it (task_submitted, wake_recorded), nil otherwise; last the first bytes of the
// event at the cache's head (the first row; NULL on the others).
type change struct {
	seq     int64
	typ     int16
	subject []byte
	rec     []byte
	last    []byte
}

func scanChange(rows pgx.Rows) (change, error) {
	var c change
	return c, rows.Scan(&c.seq, &c.typ, &c.subject, &c.rec, &c.last)
}

// changesSinceStatement reads the events from $1 on (the cache's head, whose event must be
// the one the cache knows), at most $2, with the record of each submitted task and recorded
// wake (a subquery in CASE runs only for those: a claim's or a settle's event costs its
// index entry alone).
func changesSinceStatement(q func(string) string) string {
	return q(fmt.Sprintf(`SELECT e.seq, e.type, e.subject, CASE e.type
			WHEN %d THEN (SELECT t.rec FROM {s}.tasks t WHERE t.id = e.subject)
			WHEN %d THEN (SELECT w.rec FROM {s}.wakes w WHERE w.id = e.subject)
			WHEN %d THEN (SELECT w.rec FROM {s}.wakes w WHERE w.id = e.subject) END,
			CASE WHEN e.seq = $1 THEN substring(e.body for %d) END
		FROM {s}.events e WHERE e.seq >= $1 ORDER BY e.seq LIMIT $2`, events.TypeTaskSubmitted, events.TypeWakeRecorded, events.TypeWakeAcked, lastLen))
}

// headLastStatement reads the first bytes of the event at the log head (NULL: none).
func headLastStatement(q func(string) string) string {
	return q(fmt.Sprintf(`SELECT substring(e.body for %d) FROM {s}.log_head h
		LEFT JOIN {s}.events e ON e.seq = h.seq WHERE h.id = 1`, lastLen))
}

// catchUpRule says what an event of typ changes in the cache: its subject's entry (task or
// wake), and for the two types that create records and for wake_acked, the keys and tasks
// read from the record.
// known is false for a type without a rule.
func catchUpRule(typ events.Type) (task, wake, record, known bool) {
	switch typ {
	case events.TypeTaskSubmitted:
		return true, false, true, true
	case events.TypeWakeRecorded:
		return false, true, true, true
	case events.TypeTaskClaimed, events.TypeTaskSettled, events.TypeTaskCancelRequested,
		events.TypeTaskSettleRejected, events.TypeTaskExtended, events.TypeTaskReleased,
		events.TypeTaskRetried, events.TypeTaskSubmitRejected:
		return true, false, false, true
	case events.TypeWakeAcked:
		return false, true, true, true
	case events.TypeWakeClaimed, events.TypeWakeAckRejected:
		return false, true, false, true
	case events.TypeScheduleSet, events.TypeScheduleRemoved, events.TypeKindPolicySet:
		return false, false, false, true
	}
	return false, false, false, false
}

// catchUp drops the entries chs (the event at c.seq, then those after it up to the locked
// head, in order) may have changed and adds the keys they wrote. It reports false when it
// cannot account for them: the first is not the event the cache's head was (another
// history: a failover lost commits), or there are too many. The caller then drops the whole
// cache. It returns the number of entries dropped.
func (c *cache) catchUp(chs []change) (dropped int, ok bool) {
	if len(chs) == 0 || len(chs) > catchUpMax+1 || uint64(chs[0].seq) != c.seq || c.last == nil || !bytes.Equal(chs[0].last, c.last) {
		return 0, false
	}
	for _, ch := range chs[1:] {
		task, wake, record, known := catchUpRule(events.Type(ch.typ))
		if !known {
			return dropped, false
		}
		id := string(ch.subject)
		if task {
			if _, in := c.tasks[id]; in {
				delete(c.tasks, id)
				dropped++
			}
		}
		if wake {
			if _, in := c.wakes[id]; in {
				delete(c.wakes, id)
				dropped++
			}
		}
		if !record {
			continue
		}
		if ch.rec == nil { // only a prune removes a record, and a prune drops the cache
			return dropped, false
		}
		if task {
			r, err := recordcodec.DecodeTask([]byte("tasks "+id), ch.rec)
			if err != nil || r.ID != id {
				return dropped, false
			}
			if r.IdempotencyKey != "" {
				c.taskKeys[skey{r.SessionID, r.IdempotencyKey}] = id
			}
			continue
		}
		r, err := recordcodec.DecodeWake([]byte("wakes "+id), ch.rec)
		if err != nil || r.ID != id {
			return dropped, false
		}
		if r.Reason == events.WakeRequested && r.IdempotencyKey != "" {
			c.wakeKeys[skey{r.SessionID, r.IdempotencyKey}] = id
		}
		if r.TaskID != "" { // a completion wake: its task's record changed too
			// (an acknowledgment changes it only when the wake is no longer its
			// completion wake: it counts off UnackedEarlierWakes)
			if t, in := c.tasks[r.TaskID]; in && (events.Type(ch.typ) != events.TypeWakeAcked || t == nil || t.CompletionWakeID != id) {
				delete(c.tasks, r.TaskID)
				dropped++
			}
		}
	}
	return dropped, true
}
