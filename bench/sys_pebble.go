package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// pebbleQueue is no queue: one synced Pebble write per task, the ceiling of the engine worklog
// stores into, and for W3 one Get of the task's key, the ceiling of a duplicate answered from
// state. Each task is one key, "k" and its idempotency key, whose value is its 8-byte
// sequence (its id) and its input. It is opened with the options worklog's store uses
// (pebblelog.open): 64 MiB block cache, 32 MiB memtables, the same pinned format.
type pebbleQueue struct {
	dir string
	db  *pebble.DB
	seq atomic.Uint64
}

func openPebbleDB(dir string) (*pebble.DB, error) {
	cache := pebble.NewCache(64 << 20)
	defer cache.Unref()
	o := &pebble.Options{
		Cache:                       cache,
		MemTableSize:                32 << 20,
		MemTableStopWritesThreshold: 2,
		FormatMajorVersion:          pebble.FormatValueSeparation,
		Logger:                      quietLogger{},
	}
	o.Experimental.TombstoneDenseCompactionThreshold = 0.05
	return pebble.Open(dir, o)
}

func openPebble(_ context.Context, dir string, _ childConfig) (queue, error) {
	db, err := openPebbleDB(dir)
	if err != nil {
		return nil, err
	}
	return &pebbleQueue{dir: dir, db: db}, nil
}

func pebbleKey(key string) []byte { return append([]byte{'k'}, key...) }

func (p *pebbleQueue) Enqueue(_ context.Context, key string, input []byte) (string, error) {
	seq := p.seq.Add(1)
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(input)), seq)
	return strconv.FormatUint(seq, 10), p.db.Set(pebbleKey(key), append(v, input...), pebble.Sync)
}

func (p *pebbleQueue) Work(context.Context, int, int) error { return errNotApplicable }
func (p *pebbleQueue) Keys() bool                           { return true }

// Duplicate is one Get of the key; the id is read from the value.
func (p *pebbleQueue) Duplicate(_ context.Context, key string, _ []byte) (string, error) {
	v, closer, err := p.db.Get(pebbleKey(key))
	if err != nil {
		return "", err
	}
	if len(v) < 8 {
		closer.Close()
		return "", fmt.Errorf("pebble: key %q holds %d bytes, not a sequence and an input", key, len(v))
	}
	id := strconv.FormatUint(binary.BigEndian.Uint64(v), 10)
	return id, closer.Close()
}
func (p *pebbleQueue) Close() error { return p.db.Close() }

// Completed counts the records written: there is nothing to complete.
func (p *pebbleQueue) Completed(context.Context) (int, error) {
	db, err := openPebbleDB(p.dir)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte("k"), UpperBound: []byte("l")})
	if err != nil {
		return 0, err
	}
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	return n, it.Close()
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic("pebble: fatal: " + format)
}
