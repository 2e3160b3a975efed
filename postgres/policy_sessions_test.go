package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// A queue whose kind_policies table predates the per-session fields (an older build: no
// fair_sessions, no max_running_per_session) reads read-only as policies without them, and
// gets the columns at the next Open, after which a policy with them round trips.
func TestOpenAddsPolicySessionsToAnOlderQueue(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	s := schemaName(dsn)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := work.KindPolicy{MaxRunning: 3}
	if err := q.SetKindPolicyAt(ctx, "k", old, t0); err != nil {
		t.Fatal(err)
	}
	q.Close()
	execSQL(t, "ALTER TABLE "+s+".kind_policies DROP COLUMN fair_sessions, DROP COLUMN max_running_per_session")

	ro, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var got []projection.KindPolicy
	err = ro.View(ctx, func(r projection.Reader) error {
		return r.KindPolicies(func(p *projection.KindPolicy) bool { got = append(got, *p); return true })
	})
	if err != nil || len(got) != 1 || got[0].MaxRunning != 3 || got[0].FairSessions || got[0].MaxRunningPerSession != 0 {
		t.Fatalf("read-only policies of the older queue = %+v, %v; want k with MaxRunning 3", got, err)
	}
	if p, err := ro.Verify(ctx, VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("read-only Verify of the older queue: %v %v", p, err)
	}
	ro.Close()

	q, err = Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := q.KindPolicies(ctx); err != nil || got["k"] != old {
		t.Fatalf("KindPolicies after the upgrading Open = %+v, %v", got, err)
	}
	p := work.KindPolicy{FairSessions: true, MaxRunningPerSession: 2}
	if err := q.SetKindPolicyAt(ctx, "k", p, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	q.Close()
	q, err = Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if got, err := q.KindPolicies(ctx); err != nil || got["k"] != p {
		t.Fatalf("KindPolicies after a reopen = %+v, %v; want k %+v", got, err, p)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}
