package projection

import "sort"

// Mem's kind policies: records, a policy is a fact of its own, not derived. (The per-kind
// lease index is one of the indexes, IndexKindLeases: index.go.)

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

// diffKindPolicies is Diff for the policies (the lease index is one of the indexes:
// diffIndexes).
//
// The buckets (Tokens, TokensAt) are not compared: a bucket is folded from the claims, and a
// prune removes the claims of the tasks it removes, so the fold of a retained log (Verify,
// replay) may hold more tokens than the live state, which alone enforces the rate and keeps
// its bucket across restarts. The datadriven cases print the buckets; the differential
// proptests compare the claims the buckets allow.
func (m *Mem) diffKindPolicies(o *Mem) []string {
	return diffMaps("kind policy", withoutBuckets(m.policies), withoutBuckets(o.policies))
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
