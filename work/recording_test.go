package work

import (
	"context"
	engineapi "github.com/worklog/worklog/internal/engine"
	"sync"

	"github.com/worklog/worklog/events"
)

// recordingEngine is the in-memory engine reporting the type of every event a command
// appends, for the test that the conformance suite exercises every event type.
type recordingEngine struct {
	*memEngine
	seen func(events.Type)

	// An inbox (engineapi.Inbox), so that the conformance suite's inbox scenarios run here
	// too: rows of encoded requests, as postgres's submit_inbox holds them.
	inboxMu sync.Mutex
	inbox   [][]byte
	next    int64
	ready   chan struct{}
	enc     engineapi.InboxEncoder
}

func (e *recordingEngine) SetInboxEncoder(enc engineapi.InboxEncoder) { e.enc = enc }
func (e *recordingEngine) InboxReady() <-chan struct{}                { return e.ready }

func (e *recordingEngine) InboxPending(context.Context) (bool, error) {
	e.inboxMu.Lock()
	defer e.inboxMu.Unlock()
	return len(e.inbox) > 0, nil
}

func (e *recordingEngine) TakeInbox(tx txn, n int) ([]engineapi.InboxEntry, error) {
	e.inboxMu.Lock()
	defer e.inboxMu.Unlock()
	var out []engineapi.InboxEntry
	for len(e.inbox) > 0 && len(out) < n {
		ev, err := events.Decode(e.inbox[0], 0)
		if err != nil {
			return nil, err
		}
		e.next++
		out = append(out, engineapi.InboxEntry{Row: e.next, Submitted: ev.(*events.TaskSubmitted)})
		e.inbox = e.inbox[1:]
	}
	return out, nil
}

func (e *recordingEngine) RejectInbox(tx txn, en engineapi.InboxEntry, reason error) error {
	return reason
}

// submitTxRecording adds an undecided inbox row, as an older build's SubmitTx committed them
// (decided when taken in, with Submit's rules then: a task_submit_rejected for another intent).
func submitTxRecording(q *Queue, session string, r TaskRequest, commit bool) error {
	e := q.b.(*logBackend).eng.(*recordingEngine)
	var runAt int64
	if !r.RunAt.IsZero() {
		runAt = r.RunAt.UnixNano()
	}
	body, err := events.Encode(inboxEvent(session, &r, runAt))
	if err != nil || !commit {
		return err
	}
	e.inboxMu.Lock()
	e.inbox = append(e.inbox, body)
	e.inboxMu.Unlock()
	select {
	case e.ready <- struct{}{}:
	default:
	}
	return nil
}

// newRecordingQueue is NewInMemory over a recordingEngine.
func newRecordingQueue(seen func(events.Type)) *Queue {
	return newEngineQueue(&recordingEngine{memEngine: newMemEngine(), seen: seen, ready: make(chan struct{}, 1)}, engineapi.Config{})
}

func (e *recordingEngine) Update(ctx context.Context, fn func(tx txn) error) error {
	e.mu.RLock()
	n := len(e.log)
	e.mu.RUnlock()
	e.inboxMu.Lock()
	keep := e.inbox
	e.inboxMu.Unlock()
	err := e.memEngine.Update(ctx, fn)
	if err != nil {
		e.inboxMu.Lock()
		e.inbox = keep // a failed command took nothing
		e.inboxMu.Unlock()
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	for _, ev := range e.log[min(n, len(e.log)):] { // commands may interleave: the set is what counts
		e.seen(ev.Type())
	}
	return err
}
