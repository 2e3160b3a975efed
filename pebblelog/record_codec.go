package pebblelog

import (
	"fmt"

	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/projection"
)

// The task and wake records' codec is internal/recordcodec, shared with the PostgreSQL
// backend and replay's snapshot cache; here a record that does not decode is
// ErrCorruptRecord naming its key.

func appendTask(b []byte, t *projection.Task) []byte { return recordcodec.AppendTask(b, t) }
func appendWake(b []byte, x *projection.Wake) []byte { return recordcodec.AppendWake(b, x) }

func decodeTask(key, v []byte) (*projection.Task, error) {
	t, err := recordcodec.DecodeTask(key, v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
	}
	return t, nil
}

func decodeWake(key, v []byte) (*projection.Wake, error) {
	x, err := recordcodec.DecodeWake(key, v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
	}
	return x, nil
}
