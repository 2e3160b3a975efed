package pebblelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// Format 7's keyspaces (keys.go): the kind policies (P<kind>: the policy and its token
// bucket, policyRecord) and the per-kind lease index (L<uvarint len><kind><at 8B ordered>
// <submit seq 8B BE>: task id), a kind's running tasks by lease expiry. The fold keeps both
// (projection.State's PutKindPolicy, DeleteKindPolicy, PutKindLease, DeleteKindLease); the
// decide code reads them at each claim (work's gatedScan): the policies, then for a kind with
// MaxRunning its leases that expire after the claim's now, at most MaxRunning entries.
//
// A store of an older format never held a kind_policy_set event (this build's format is the
// first that knows it), so it has no policy, and an older read-only store reads both
// keyspaces as the empty ones they are: no policy, so no claim or stats reads its leases.

// policyRecordLen is the length of an encoded policy: flags, max running, rate, burst, tokens,
// tokens at, set seq.
const policyRecordLen = 1 + 8*6

// encodePolicy encodes p's fields (the kind is the key).
func encodePolicy(p *projection.KindPolicy) []byte {
	b := make([]byte, 1, policyRecordLen)
	if p.Paused {
		b[0] = 1
	}
	b = binary.BigEndian.AppendUint64(b, uint64(p.MaxRunning))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(p.Rate))
	b = binary.BigEndian.AppendUint64(b, uint64(p.Burst))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(p.Tokens))
	b = binary.BigEndian.AppendUint64(b, uint64(p.TokensAt))
	return binary.BigEndian.AppendUint64(b, p.SetSeq)
}

func decodePolicy(kind string, v []byte) (*projection.KindPolicy, error) {
	if len(v) != policyRecordLen || v[0] > 1 {
		return nil, fmt.Errorf("%w: kind policy %q: %d bytes", ErrCorruptRecord, kind, len(v))
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(v[1+8*i:]) }
	return &projection.KindPolicy{Kind: kind, Paused: v[0] == 1, MaxRunning: int64(u(0)),
		Rate: math.Float64frombits(u(1)), Burst: int64(u(2)), Tokens: math.Float64frombits(u(3)),
		TokensAt: int64(u(4)), SetSeq: u(5)}, nil
}

// kindLeasePrefix is the start of one kind's part of the lease index (length-prefixed, so
// that no kind's range holds another kind's keys).
func kindLeasePrefix(kind string) []byte {
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(kind)+16)
	k = append(k, prefixKindLease)
	k = binary.AppendUvarint(k, uint64(len(kind)))
	return append(k, kind...)
}

func kindLeaseKey(kind string, at int64, seq uint64) []byte {
	return appendKindLeaseKey(make([]byte, 0, 1+binary.MaxVarintLen64+len(kind)+16), kind, at, seq)
}

func appendKindLeaseKey(k []byte, kind string, at int64, seq uint64) []byte {
	k = append(k, prefixKindLease)
	k = binary.AppendUvarint(k, uint64(len(kind)))
	k = append(k, kind...)
	k = binary.BigEndian.AppendUint64(k, orderedTime(at))
	return binary.BigEndian.AppendUint64(k, seq)
}

func (s reader) KindPolicy(kind string) (*projection.KindPolicy, error) {
	v, ok, err := s.get(idKey(prefixKindPolicy, kind))
	if err != nil || !ok {
		return nil, err
	}
	return decodePolicy(kind, v)
}

func (s reader) KindPolicies(fn func(*projection.KindPolicy) bool) (err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixKindPolicy}, UpperBound: []byte{prefixKindPolicy + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		p, err := decodePolicy(string(it.Key()[1:]), v)
		if err != nil {
			return err
		}
		if !fn(p) {
			return nil
		}
	}
	return it.Error()
}

// ScanKindLeases walks kind's leases that expire after after, in expiry order.
func (s reader) ScanKindLeases(kind string, after int64, fn func(projection.IndexEntry) bool) error {
	if after == math.MaxInt64 {
		return nil
	}
	start := kindLeasePrefix(kind)
	end := append(kindLeasePrefix(kind), 0xff)
	return s.scanRange(kindLeaseKey(kind, after+1, 0), end, len(start), func(_ []byte, e projection.IndexEntry) bool {
		return fn(e)
	})
}

// The writer reads leases through the batch (its reader), and policies from memory with the
// batch's changes (decide_cache.go), so a command sees its own changes: a claim's bucket
// after the claims before it in the same command.

// The writer keeps the committed policies in memory (decide_cache.go): its PutKindPolicy,
// DeleteKindPolicy, KindPolicy and KindPolicies are there.

// PutKindLease and DeleteKindLease build the key in the writer's scratch (every claim and
// settlement moves one entry; the batch copies what it is given).
func (w *writer) PutKindLease(kind string, e projection.IndexEntry) error {
	w.leaseBuf = appendKindLeaseKey(w.leaseBuf[:0], kind, e.At, e.Seq)
	n := len(w.leaseBuf)
	w.leaseBuf = append(w.leaseBuf, e.ID...)
	return w.b.Set(w.leaseBuf[:n], w.leaseBuf[n:], nil)
}

// DeleteKindLease is a sized delete, as DeleteWakeIndex.
func (w *writer) DeleteKindLease(kind string, e projection.IndexEntry) error {
	w.leaseBuf = appendKindLeaseKey(w.leaseBuf[:0], kind, e.At, e.Seq)
	return w.b.DeleteSized(w.leaseBuf, uint32(len(e.ID)), nil)
}

// The upgrade to format 7 (upgrade.go calls it for a store of format < 7 opened read-write).
//
// The lease index follows from the task records alone (a running task's entry is its lease
// expiry at its SubmitSeq, under its kind), so it is built from them in one pass, as format
// 5's index is, in the same crash order: clear, build in batches committed without sync,
// then the synced format key. No older store holds a policy; the policy keyspace is cleared
// all the same, so that a partial earlier attempt leaves nothing.
func (s *Store) buildFormat7() error {
	if err := s.clearKeyspaces(prefixKindPolicy, prefixKindLease); err != nil {
		return fmt.Errorf("clearing the kind policies and lease index: %w", err)
	}
	return s.buildFromRecords(prefixTask, func(b *pebble.Batch, key, v []byte) error {
		t, err := decodeTask(key, v)
		if err != nil {
			return err
		}
		e, in := t.LeaseEntry()
		if !in {
			return nil
		}
		return b.Set(kindLeaseKey(t.Kind, e.At, e.Seq), []byte(e.ID), nil)
	}, nil)
}
