package projection

import "github.com/worklog/worklog/events"

// Reader is the read side of projected state.
type Reader interface {
	// Task returns a copy of the task record, or nil when there is none: callers may change
	// it freely.
	Task(id string) (*Task, error)
	// Wake returns a copy of the wake record, or nil when there is none.
	Wake(id string) (*Wake, error)
	// TaskKey returns the id of the task submitted under (session, key), or "".
	TaskKey(sessionID, key string) (string, error)
	// WakeKey returns the id of the wake requested under (session, key), or "".
	WakeKey(sessionID, key string) (string, error)
	// ScanIndex calls fn with the entries of index ix's partition part ("" for an index of
	// one partition: Indexes) with from <= At <= to, in claim order (Pri descending, then
	// At, then Seq: IndexEntry.Less), until fn returns false. Its cost is O(p · log n) plus
	// the entries fn sees, p the distinct priorities in the partition (1 in an index without
	// priorities): each priority's entries are a run in At order, and the scan seeks to a
	// run's first entry at or after from and from its first entry past to to the next run.
	// It does not depend on the entries of other partitions.
	ScanIndex(ix Index, part string, from, to int64, fn func(IndexEntry) bool) error
	// LastSeq is the sequence of the last applied event; 0 for an empty state.
	LastSeq() (uint64, error)

	// ScanSessionTasks calls fn with sessionID's tasks in submission order (the seq of each
	// task's TaskSubmitted event, and its id), starting after afterSeq (0: from the first),
	// until fn returns false. Its cost is bounded by that session's tasks.
	ScanSessionTasks(sessionID string, afterSeq uint64, fn func(submitSeq uint64, taskID string) bool) error
	// Counts calls fn for each (kind, state) that has tasks, with their number, until fn
	// returns false. The fold keeps the counts (AddCount); reading them scans no records.
	Counts(fn func(kind string, state events.TaskState, n int64) bool) error

	// The periodic schedules (schedules.go).
	ScheduleReader

	// KindPolicy and KindPolicies: kind_policies.go (the lease index: IndexKindLeases).
	KindPolicy(kind string) (*KindPolicy, error)
	KindPolicies(fn func(*KindPolicy) bool) error
}

// DueSummarizer is a Reader that counts the due index's entries up to a time without
// handing each out (PostgreSQL: one statement, where a walk reads the entries a page a round
// trip). Queue.Stats uses it when the Reader has it. It answers what a walk of
// ScanIndex(IndexDue, "", math.MinInt64, maxAt) would count: the entries, and the least At
// among them (0 when there are none).
type DueSummarizer interface {
	DueSummary(maxAt int64) (n int64, oldestAt int64, err error)
}

// State is projected state that Apply can change. A store makes the writes of one command
// atomic with the append of its events.
//
// Apply reaches records only through the record-access methods (EditTask, NewTask, PutTask,
// TaskEdited and their wake twins), so a state chooses how a change lands: Mem hands out its
// own records and Apply changes them in place, with no copy and no write back; a store
// (pebblelog's writer) hands out copies and writes each back when told it changed. Apply
// changes a record only after every check of the event has passed, so a rejected event
// leaves even a state's own records untouched. A wrapper that embeds a State (or a *Mem)
// and overrides none of these methods keeps its inner state's way.
type State interface {
	Reader

	// EditTask returns the task record for Apply to check and change, or nil when there is
	// none: the state's own record or a copy. After changing it Apply calls TaskEdited.
	EditTask(id string) (*Task, error)
	// EditWake is EditTask for wakes; after a change Apply calls WakeEdited.
	EditWake(id string) (*Wake, error)
	// TaskEdited tells the state that Apply changed t, a record EditTask returned during the
	// same Apply. A state that handed out a copy writes it back; Mem has nothing to do.
	// Index entries are moved separately (PutIndex, DeleteIndex).
	TaskEdited(t *Task) error
	// WakeEdited is TaskEdited for wakes.
	WakeEdited(w *Wake) error
	// NewTask returns a zero record for a new task, which Apply fills and hands to PutTask.
	NewTask() *Task
	// NewWake is NewTask for wakes.
	NewWake() *Wake
	// PutTask stores a new record; the state takes ownership: the caller must not change it
	// afterwards.
	PutTask(*Task) error
	// PutWake is PutTask for wakes.
	PutWake(*Wake) error

	PutTaskKey(sessionID, key, taskID string) error
	PutWakeKey(sessionID, key, wakeID string) error
	SetLastSeq(uint64) error

	// PutIndex puts e into partition part of index ix (Reader.ScanIndex); DeleteIndex removes
	// the entry at e's key. Apply moves an entry in all the indexes of its record at once
	// (TaskIndexes, WakeIndexes).
	PutIndex(ix Index, part string, e IndexEntry) error
	DeleteIndex(ix Index, part string, e IndexEntry) error
	// PutSessionTask adds a new task to its session's list (ScanSessionTasks).
	PutSessionTask(sessionID string, submitSeq uint64, taskID string) error
	// AddCount adds delta to the number of tasks of kind in state (Counts).
	AddCount(kind string, state events.TaskState, delta int64) error

	// The periodic schedules (schedules.go).
	ScheduleWriter
	// The kind policies (kind_policies.go).
	PutKindPolicy(*KindPolicy) error
	DeleteKindPolicy(kind string) error
}
