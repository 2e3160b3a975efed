package projection

import (
	"fmt"
	"sort"

	"github.com/google/btree"
)

// Mem's kind policies (records: a policy is a fact of its own, not derived) and the per-kind
// lease index (derived from the task records: BuildIndexes rebuilds it, Diff compares it).

func (m *Mem) KindPolicy(kind string) (*KindPolicy, error) {
	p, ok := m.policies[kind]
	if !ok {
		return nil, nil
	}
	c := *p
	return &c, nil
}

func (m *Mem) KindPolicies(fn func(*KindPolicy) bool) error {
	ks := make([]string, 0, len(m.policies))
	for k := range m.policies {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		c := *m.policies[k]
		if !fn(&c) {
			break
		}
	}
	return nil
}

func (m *Mem) PutKindPolicy(p *KindPolicy) error {
	c := *p
	m.policies[p.Kind] = &c
	return nil
}

func (m *Mem) DeleteKindPolicy(kind string) error {
	delete(m.policies, kind)
	return nil
}

func (m *Mem) ScanKindLeases(kind string, after int64, fn func(IndexEntry) bool) error {
	m.BuildIndexes()
	t := m.kindLeases[kind]
	if t == nil || after == 1<<63-1 {
		return nil
	}
	t.AscendGreaterOrEqual(IndexEntry{At: after + 1}, fn)
	return nil
}

func (m *Mem) PutKindLease(kind string, e IndexEntry) error {
	if m.deferred {
		return nil
	}
	t := m.kindLeases[kind]
	if t == nil {
		t = newIndex()
		m.kindLeases[kind] = t
	}
	t.ReplaceOrInsert(e)
	return nil
}

func (m *Mem) DeleteKindLease(kind string, e IndexEntry) error {
	if m.deferred {
		return nil
	}
	if t := m.kindLeases[kind]; t != nil {
		t.Delete(e)
		if t.Len() == 0 {
			delete(m.kindLeases, kind)
		}
	}
	return nil
}

// buildKindLeases rebuilds the lease index from the task records (BuildIndexes).
func (m *Mem) buildKindLeases() {
	by := map[string][]IndexEntry{}
	for _, t := range m.tasks {
		if e, ok := t.LeaseEntry(); ok {
			by[t.Kind] = append(by[t.Kind], e)
		}
	}
	m.kindLeases = make(map[string]*btree.BTreeG[IndexEntry], len(by))
	for k, es := range by {
		m.kindLeases[k] = sortedTree(es, btree.NewFreeListG[IndexEntry](btree.DefaultFreeListSize))
	}
}

// diffKindPolicies is Diff for the policies and the lease index.
//
// The buckets (Tokens, TokensAt) are not compared: a bucket is folded from the claims, and a
// prune removes the claims of the tasks it removes, so the fold of a retained log (Verify,
// replay) may hold more tokens than the live state, which alone enforces the rate and keeps
// its bucket across restarts. The datadriven cases print the buckets; the differential
// proptests compare the claims the buckets allow.
func (m *Mem) diffKindPolicies(o *Mem) []string {
	out := diffMaps("kind policy", withoutBuckets(m.policies), withoutBuckets(o.policies))
	empty := newIndex()
	for _, k := range unionKeys(m.kindLeases, o.kindLeases) {
		a, b := m.kindLeases[k], o.kindLeases[k]
		if a == nil {
			a = empty
		}
		if b == nil {
			b = empty
		}
		out = append(out, diffIndex(fmt.Sprintf("lease index of kind %q", k), a, b)...)
	}
	return out
}

func withoutBuckets(m map[string]*KindPolicy) map[string]*KindPolicy {
	out := make(map[string]*KindPolicy, len(m))
	for k, p := range m {
		c := *p
		c.Tokens, c.TokensAt = 0, 0
		out[k] = &c
	}
	return out
}
