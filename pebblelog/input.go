package pebblelog

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Store format 2: records do not copy the request's values.
//
// A task's input and a wake's payload or completion output are fixed when the task or wake is
// created, and the event that created it (TaskSubmitted at the task's SubmitSeq, WakeRecorded
// at the wake's RecordSeq) holds them already. Format 1 wrote them into the record as well, so
// every claim, finish and acknowledgement rewrote them: a 64 MiB input was written to the
// WAL, the memtable and the batch once per transition, and its copies drove a process to
// 3.1 GB. Format 2 writes records without them (records.go's layout, with the field empty)
// and reads them back from the event when a caller needs them: the snapshots handed out by
// the decide code and by View. The fold itself never needs them (no rule looks at an input),
// so the writer's own reads do not fill them.
//
// A format-1 record still carries its value; a format-2 reader uses it when present. The
// value of a live request is never empty (the work package stores JSON null as "null"), so an
// empty one means "in the event". A record that was empty in format 1 too (a value-less event
// written through pebblelog directly) reads its empty value from the event: the same answer.
//
// A task's output stays in its record (it is written when the task settles, which happens
// once), unless it is of BlobMin bytes or more (format 4): then the settle event refers to
// its blob file (blob.go) and the record leaves it empty, like an input.

// errValueEvent marks a record whose creating event is missing or is not the one that
// created it: the log and the projection disagree.
var errValueEvent = errors.New("the event that created the record is missing or another one")

// recordTask is what a task record holds: t without its input (format 2) and without an
// output of BlobMin bytes or more (format 4: the settle event refers to its blob).
func recordTask(t *projection.Task) *projection.Task {
	if len(t.Input) == 0 && len(t.Outcome.Output) < BlobMin {
		return t
	}
	c := *t
	c.Input = nil
	if len(c.Outcome.Output) >= BlobMin {
		c.Outcome.Output = nil
	}
	return &c
}

// recordWake is what a format-2 wake record holds: x without its payload and without the
// output of the task whose completion it reports.
func recordWake(x *projection.Wake) *projection.Wake {
	if len(x.Payload) == 0 && len(x.Outcome.Output) == 0 {
		return x
	}
	c := *x
	c.Payload = nil
	c.Outcome.Output = nil
	return &c
}

// taskNeedsInput reports whether t's input is in its creating event rather than in t.
func taskNeedsInput(t *projection.Task) bool { return len(t.Input) == 0 && t.SubmitSeq != 0 }

// taskNeedsOutput reports whether t's output is in its settle event rather than in t
// (format 4: an output of BlobMin bytes or more). A live succeeded task's output is never
// empty (JSON null is "null"), so an empty one is in the event.
func taskNeedsOutput(t *projection.Task) bool {
	return len(t.Outcome.Output) == 0 && t.State == events.StateSucceeded && t.SubmitSeq != 0
}

// taskNeedsValues reports whether t lacks a value its events hold.
func taskNeedsValues(t *projection.Task) bool { return taskNeedsInput(t) || taskNeedsOutput(t) }

// wakeNeedsValues reports whether x's payload or completion output is in its creating event.
func wakeNeedsValues(x *projection.Wake) bool {
	if x.RecordSeq == 0 {
		return false
	}
	switch x.Reason {
	case events.WakeRequested:
		return len(x.Payload) == 0
	case events.WakeTaskFinished:
		return len(x.Outcome.Output) == 0 && x.Outcome.State == events.StateSucceeded
	}
	return false
}

// withEvent decodes the event at seq as r sees it and passes it to fn. The event is decoded
// straight from Pebble's value, which is valid only until the closer runs: Decode copies the
// byte strings it returns, so the value is copied once, into the field the caller keeps.
func withEvent(r reader, seq uint64, fn func(events.Event) error) error {
	v, closer, err := r.r.Get(eventKey(seq))
	if errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("%w: event %d: %w", ErrCorruptRecord, seq, errValueEvent)
	}
	if err != nil {
		return fmt.Errorf("pebblelog: reading event %d: %w", seq, err)
	}
	ev, err := r.bl.decodeStored(v, seq, events.Decode) // a blob's value is read from its file
	closeErr := closer.Close()
	if err != nil {
		return err
	}
	if err := fn(ev); err != nil {
		return err
	}
	return closeErr
}

// taskInput reads the input of task t from its TaskSubmitted event.
func taskInput(r reader, t *projection.Task) ([]byte, error) {
	var in []byte
	err := withEvent(r, t.SubmitSeq, func(ev events.Event) error {
		sub, ok := ev.(*events.TaskSubmitted)
		if !ok || sub.TaskID != t.ID {
			return fmt.Errorf("%w: task %s: event %d (%s): %w", ErrCorruptRecord, t.ID, t.SubmitSeq, ev.Type(), errValueEvent)
		}
		in = sub.Input
		return nil
	})
	return in, err
}

// wakeValues is what a wake record leaves in its WakeRecorded event.
type wakeValues struct {
	payload, output []byte
}

func (v wakeValues) fill(x *projection.Wake) {
	if len(x.Payload) == 0 {
		x.Payload = v.payload
	}
	if len(x.Outcome.Output) == 0 {
		x.Outcome.Output = v.output
	}
}

// wakeEventValues reads the payload and completion output of wake x from its WakeRecorded
// event.
func wakeEventValues(r reader, x *projection.Wake) (wakeValues, error) {
	var out wakeValues
	err := withEvent(r, x.RecordSeq, func(ev events.Event) error {
		rec, ok := ev.(*events.WakeRecorded)
		if !ok || rec.WakeID != x.ID {
			return fmt.Errorf("%w: wake %s: event %d (%s): %w", ErrCorruptRecord, x.ID, x.RecordSeq, ev.Type(), errValueEvent)
		}
		out = wakeValues{payload: rec.Payload, output: rec.Outcome.Output}
		return nil
	})
	return out, err
}

// fillTask gives t (a copy the caller owns) its input and output, read through r when t
// lacks them.
func fillTask(r reader, t *projection.Task) error {
	if taskNeedsInput(t) {
		in, err := taskInput(r, t)
		if err != nil {
			return err
		}
		t.Input = in
	}
	if taskNeedsOutput(t) {
		out, err := taskOutput(r, t)
		if err != nil {
			return err
		}
		t.Outcome.Output = out
	}
	return nil
}

// taskOutput reads the output of the settled task t from its TaskSettled event, found
// through the per-subject index from its newest event back (after the settle come at most
// rejected settlements).
func taskOutput(r reader, t *projection.Task) (_ []byte, err error) {
	p := subjectPrefix(t.ID)
	it, err := r.r.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.Last(); ok; ok = it.Prev() {
		k := it.Key()
		if len(k) != len(p)+8 {
			return nil, fmt.Errorf("%w: subject index key %q", ErrCorruptRecord, k)
		}
		var out []byte
		found := false
		err := withEvent(r, binary.BigEndian.Uint64(k[len(p):]), func(ev events.Event) error {
			if st, ok := ev.(*events.TaskSettled); ok && st.TaskID == t.ID {
				out, found = st.Outcome.Output, true
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if found {
			return out, nil
		}
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: task %s: no settle event holds its output: %w", ErrCorruptRecord, t.ID, errValueEvent)
}

// fillWake gives x (a copy the caller owns) its payload and completion output.
func fillWake(r reader, x *projection.Wake) error {
	if !wakeNeedsValues(x) {
		return nil
	}
	v, err := wakeEventValues(r, x)
	v.fill(x)
	return err
}

// inputs holds, for one writer (one batch), the values of the records it read or put, so that
// the decide code's repeated reads of one task in a command (before and after its append)
// read the event once.
type inputs struct {
	tasks   map[string][]byte
	outputs map[string][]byte // task outputs of BlobMin bytes or more (format 4)
	wakes   map[string]wakeValues
	// The ids whose values are longer than OwnedValueMin, which newCommand forgets: kept
	// apart so that starting a command costs what the commands before it put that is large,
	// not a walk of every value the batch read.
	largeTasks, largeWakes, largeOutputs []string
}

func (in *inputs) putOutput(id string, v []byte) {
	if in.outputs == nil {
		in.outputs = make(map[string][]byte)
	}
	in.outputs[id] = v
	in.largeOutputs = append(in.largeOutputs, id)
}

func (in *inputs) putTask(id string, v []byte) {
	if in.tasks == nil {
		in.tasks = make(map[string][]byte)
	}
	in.tasks[id] = v
	if len(v) > OwnedValueMin {
		in.largeTasks = append(in.largeTasks, id)
	}
}

func (in *inputs) putWake(id string, v wakeValues) {
	if in.wakes == nil {
		in.wakes = make(map[string]wakeValues)
	}
	in.wakes[id] = v
	if len(v.payload) > OwnedValueMin || len(v.output) > OwnedValueMin {
		in.largeWakes = append(in.largeWakes, id)
	}
}

// decideReader is the projection as the decide code reads it through a Txn: the writer's
// records with their values. The fold reads the writer directly, without them.
type decideReader struct {
	*writer
}

func (d decideReader) Task(id string) (*projection.Task, error) {
	t, err := d.writer.Task(id)
	if err != nil || t == nil || !taskNeedsValues(t) {
		return t, err
	}
	if taskNeedsOutput(t) {
		out, ok := d.writer.inputs.outputs[id]
		if !ok {
			// The settle event is in the DB or in this batch: read through the batch.
			if out, err = taskOutput(d.writer.reader, t); err != nil {
				return nil, err
			}
			d.writer.inputs.putOutput(id, out)
		}
		t.Outcome.Output = out
	}
	if !taskNeedsInput(t) {
		return t, nil
	}
	if in, ok := d.writer.inputs.tasks[id]; ok {
		t.Input = in
		return t, nil
	}
	if t.Input, err = d.writer.eventTaskInput(t); err != nil {
		return nil, err
	}
	d.writer.inputs.putTask(id, t.Input)
	return t, nil
}

func (d decideReader) Wake(id string) (*projection.Wake, error) {
	x, err := d.writer.Wake(id)
	if err != nil || x == nil || !wakeNeedsValues(x) {
		return x, err
	}
	v, ok := d.writer.inputs.wakes[id]
	if !ok {
		if v, err = d.writer.eventWakeValues(x); err != nil {
			return nil, err
		}
		d.writer.inputs.putWake(id, v)
	}
	v.fill(x)
	return x, nil
}

// eventTaskInput reads t's input from its event: from the DB, where a record that lacks it
// nearly always comes from, or else through the batch (the task was submitted in this batch
// and its record put without the input).
func (w *writer) eventTaskInput(t *projection.Task) ([]byte, error) {
	in, err := taskInput(w.committed, t)
	if errors.Is(err, errValueEvent) {
		in, err = taskInput(w.reader, t)
	}
	return in, err
}

func (w *writer) eventWakeValues(x *projection.Wake) (wakeValues, error) {
	v, err := wakeEventValues(w.committed, x)
	if errors.Is(err, errValueEvent) {
		v, err = wakeEventValues(w.reader, x)
	}
	return v, err
}

// keepTaskInput records the input of a task the fold put, when it came with one (a submit,
// or a record read with its input) too large for the writer's maps (cachedTask), so that the
// decide code's next read does not go to the event. A small one stays in the map's record.
func (w *writer) keepTaskInput(t *projection.Task) {
	if len(t.Outcome.Output) >= BlobMin {
		w.inputs.putOutput(t.ID, t.Outcome.Output) // format 4: not in the record either
	}
	if len(t.Input) <= cachedValueMax {
		return
	}
	w.inputs.putTask(t.ID, t.Input)
}

func (w *writer) keepWakeValues(x *projection.Wake) {
	if len(x.Payload) <= cachedValueMax && len(x.Outcome.Output) <= cachedValueMax {
		return
	}
	w.inputs.putWake(x.ID, wakeValues{payload: x.Payload, output: x.Outcome.Output})
}

// OwnedValueMin is the length above which a task's input, or a wake's payload or completion
// output, read through Txn.Reader, View or ViewSnapshot belongs to the reader: the store keeps
// no reference to it once the reading command ends (the record cache and the writer's maps
// keep no value this long: cachedTask), and no other command is handed the same bytes
// (newCommand). So a caller may pass it on without copying it, as the work package's
// snapshots do: with 64 MiB values every copy costs 64 MiB more of peak memory. A shorter
// value may be shared with the record cache and must be copied before it is handed out.
// (A task's output is covered from OwnedOutputMin only: a shorter one stays in the task's
// record, which the cache keeps.)
const OwnedValueMin = cachedValueMax

// newCommand starts the next command of the writer's batch: it forgets the large values the
// commands before it read or put, which one of them may have handed to its caller
// (OwnedValueMin); a later command of the batch that needs one reads its event again. The
// small ones stay: they are copied before they are handed out.
func (w *writer) newCommand() {
	in := &w.inputs
	for _, id := range in.largeTasks {
		delete(in.tasks, id)
	}
	for _, id := range in.largeWakes {
		delete(in.wakes, id)
	}
	for _, id := range in.largeOutputs {
		delete(in.outputs, id)
	}
	in.largeTasks, in.largeWakes, in.largeOutputs = in.largeTasks[:0], in.largeWakes[:0], in.largeOutputs[:0]
}

// cachedValueMax is the largest value a record keeps in the writer's maps and so in the record
// cache: small values save the next command's event read; a large one would fill the cache
// (or, past its bound, evict everything else) and keep the value alive after its command.
const cachedValueMax = 4 << 10

// cachedTask is t as the writer keeps it after its command: without a large input, and
// without an output its record does not hold (format 4).
func cachedTask(t *projection.Task) *projection.Task {
	if len(t.Input) <= cachedValueMax && len(t.Outcome.Output) < BlobMin {
		return t
	}
	c := *t
	if len(c.Input) > cachedValueMax {
		c.Input = nil
	}
	if len(c.Outcome.Output) >= BlobMin {
		c.Outcome.Output = nil
	}
	return &c
}

func cachedWake(x *projection.Wake) *projection.Wake {
	if len(x.Payload) <= cachedValueMax && len(x.Outcome.Output) <= cachedValueMax {
		return x
	}
	return recordWake(x)
}

// writeRecords writes the batch's latest version of every record it put, once each, in the
// order they were first put. The records live in the writer's maps until then (every read
// of the batch looks there first), so a record changed twice in one batch is written once: a
// finish that records a completion wake puts its task twice (settled, then CompletionWakeID),
// which with a 64 MiB output put 128 MiB of task records into the batch; a submit and a
// claim of the same task in one group likewise.
func (w *writer) writeRecords() error {
	// Batch.Set copies key and value, so both are built in scratch buffers the writer reuses.
	var key []byte
	for _, id := range w.taskOrder {
		t, ok := w.tasks[id]
		if !ok {
			continue // pruned after it was put (prune.go)
		}
		w.buf = appendTask(w.buf[:0], recordTask(&t))
		key = append(append(key[:0], prefixTask), id...)
		if err := w.b.Set(key, w.buf, nil); err != nil {
			return err
		}
	}
	for _, id := range w.wakeOrder {
		x, ok := w.wakes[id]
		if !ok {
			continue // pruned after it was put
		}
		w.buf = appendWake(w.buf[:0], recordWake(&x))
		key = append(append(key[:0], prefixWake), id...)
		if err := w.b.Set(key, w.buf, nil); err != nil {
			return err
		}
	}
	w.taskOrder, w.wakeOrder = w.taskOrder[:0], w.wakeOrder[:0]
	return nil
}
