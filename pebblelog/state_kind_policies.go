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
// (projection.State's PutKindPolicy and DeleteKindPolicy; the lease index is a row of
// pebbleIndexes, projection.IndexKindLeases: index.go); the decide code reads them at each
// claim (work's gatedScan): the policies, then for a kind with MaxRunning its leases that
// expire after the claim's now, at most MaxRunning entries.
//
// A store of an older format never held a kind_policy_set event (this build's format is the
// first that knows it), so it has no policy, and an older read-only store reads both
// keyspaces as the empty ones they are: no policy, so no claim or stats reads its leases.

// policyRecordLen is the length of an encoded policy: flags, max running, rate, burst, tokens,
// tokens at, set seq. A policy with per-session fields (FairSessions, MaxRunningPerSession)
// is policySessionRecordLen long: the flags' bit 1 is FairSessions and MaxRunningPerSession
// follows the set seq. A policy without them is written as before, so a store that never
// held one is byte for byte what format 8 wrote; both lengths decode.
const (
	policyRecordLen        = 1 + 8*6
	policySessionRecordLen = policyRecordLen + 8
)

const (
	policyPaused = 1 << iota
	policyFairSessions
)

// encodePolicy encodes p's fields (the kind is the key).
func encodePolicy(p *projection.KindPolicy) []byte {
	b := make([]byte, 1, policySessionRecordLen)
	if p.Paused {
		b[0] |= policyPaused
	}
	if p.FairSessions {
		b[0] |= policyFairSessions
	}
	b = binary.BigEndian.AppendUint64(b, uint64(p.MaxRunning))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(p.Rate))
	b = binary.BigEndian.AppendUint64(b, uint64(p.Burst))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(p.Tokens))
	b = binary.BigEndian.AppendUint64(b, uint64(p.TokensAt))
	b = binary.BigEndian.AppendUint64(b, p.SetSeq)
	if p.FairSessions || p.MaxRunningPerSession != 0 {
		b = binary.BigEndian.AppendUint64(b, uint64(p.MaxRunningPerSession))
	}
	return b
}

func decodePolicy(kind string, v []byte) (*projection.KindPolicy, error) {
	long := len(v) == policySessionRecordLen
	if len(v) != policyRecordLen && !long || v[0]&^(policyPaused|policyFairSessions) != 0 || !long && v[0]&policyFairSessions != 0 {
		return nil, fmt.Errorf("%w: kind policy %q: %d bytes", ErrCorruptRecord, kind, len(v))
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(v[1+8*i:]) }
	p := &projection.KindPolicy{Kind: kind, Paused: v[0]&policyPaused != 0, MaxRunning: int64(u(0)),
		Rate: math.Float64frombits(u(1)), Burst: int64(u(2)), Tokens: math.Float64frombits(u(3)),
		TokensAt: int64(u(4)), SetSeq: u(5), FairSessions: v[0]&policyFairSessions != 0}
	if long {
		p.MaxRunningPerSession = int64(u(6))
	}
	return p, nil
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

// The writer keeps the committed policies in memory (decide_cache.go): its PutKindPolicy,
// DeleteKindPolicy, KindPolicy and KindPolicies are there.
