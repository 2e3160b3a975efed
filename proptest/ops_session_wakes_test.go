package proptest

import (
	"fmt"
	"time"

	"github.com/worklog/worklog/work"
)

// --- claim wakes of chosen sessions (part 3) -----------------------------------------------------

// ClaimSessionWakesOp claims available wakes of the sessions in Mask (bit s: sessionNames[s]);
// Dup names the first of them twice.
type ClaimSessionWakesOp struct {
	Mask  int
	Dup   bool
	Lease time.Duration
	Limit int
}

func (o ClaimSessionWakesOp) sessions() []string {
	var ss []string
	for s, n := range sessionNames {
		if o.Mask&(1<<s) != 0 {
			ss = append(ss, n)
		}
	}
	if o.Dup && len(ss) > 0 {
		ss = append(ss, ss[0])
	}
	return ss
}

func (o ClaimSessionWakesOp) String() string {
	return fmt.Sprintf("claimSessionWakes %v lease=%v limit=%d", o.sessions(), o.Lease, o.Limit)
}

func (o ClaimSessionWakesOp) valid(*model) bool {
	return o.Mask > 0 && o.Mask < 1<<len(sessionNames) && o.Lease > 0 && o.Limit > 0
}
func (o ClaimSessionWakesOp) apply(m *model) { m.claimSessionWakes(o.Mask, int64(o.Lease), o.Limit) }

func (o ClaimSessionWakesOp) exec(s *system, r *result) {
	r.wds, r.err = s.q().ClaimSessionWakesAt(s.ctx, o.sessions(), s.at(), o.Lease, o.Limit)
	if r.err == nil && r.wds == nil {
		r.wds = []work.WakeDelivery{}
	}
}

// check is ClaimWakes' (the model's expected claims are already restricted to the sessions),
// and every delivery is of one of the sessions.
func (o ClaimSessionWakesOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] claim of session wakes failed: %v", r.err)}
	}
	var fails []string
	for _, d := range r.wds {
		ok := false
		for _, s := range o.sessions() {
			ok = ok || d.Wake.SessionID == s
		}
		if !ok {
			fails = append(fails, fmt.Sprintf("[claim-sessions] a claim of sessions %v delivered %s of session %s",
				o.sessions(), r.sys.showWake(d.Wake), d.Wake.SessionID))
		}
	}
	return append(fails, ClaimWakesOp{Lease: o.Lease, Limit: o.Limit}.check(m, r)...)
}

// claimSessionWakes is claimWakes over the wakes of the sessions in mask: the same order,
// restricted.
func (m *model) claimSessionWakes(mask int, lease int64, limit int) {
	var el []claimed
	for _, c := range m.availableWakes() {
		if mask&(1<<m.wakes[c.h].sess) != 0 {
			el = append(el, c)
		}
	}
	if len(el) > limit {
		el = el[:limit]
	}
	for i := range el {
		w := &m.wakes[el[i].h]
		w.attempts++
		w.claimed, w.leaseExp = true, m.now+lease
		el[i].attempt = w.attempts
	}
	m.exp.claims, m.exp.events = el, len(el)
}
