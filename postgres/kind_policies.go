package postgres

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/projection"
)

// The kind policies and the per-kind lease index (projection/kind_policies.go).
//
// kind_policies holds each kind's policy and its token bucket, one row a kind; kind_leases
// holds the running tasks by (kind, lease expiry, submit seq), so a claim counts a kind's
// tasks under unexpired leases with one index range read of at most MaxRunning rows
// (WHERE kind = $1 AND (at, seq) > (now, max), served by the primary key). Both are kept by
// the fold through the group's txn: the lease index is a row of pgIndexes
// (projection.IndexKindLeases: index.go), its writes netted and sent before the next scan or
// with the commit as every index's; the policies read once per group (one query,
// every row: they are few) into the txn, which is then their truth for the group, and their
// changed rows written with the commit. The decide code that reads them runs under the log
// head's lock (writer.go), so a claim in any process sees every claim committed before it:
// that is what makes MaxRunning and the rate exact across processes.
//
// Both tables came after format 1 without changing it, as session_wakes: a read-write Open
// creates them when missing (kindPoliciesDDL, IF NOT EXISTS) and fills kind_leases from the
// running tasks (the due index holds them at their lease expiry); no older queue has a policy.
const kindPoliciesDDL = `
CREATE TABLE IF NOT EXISTS {s}.kind_policies (kind bytea PRIMARY KEY, paused bool NOT NULL, max_running bigint NOT NULL,
	rate float8 NOT NULL, burst bigint NOT NULL, tokens float8 NOT NULL, tokens_at bigint NOT NULL, set_seq bigint NOT NULL,
	fair_sessions bool NOT NULL DEFAULT false, max_running_per_session bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS {s}.kind_leases (kind bytea, at bigint, seq bigint, task_id bytea NOT NULL, PRIMARY KEY (kind, at, seq));
`

// policySessionsDDL adds the per-session fields (KindPolicy.FairSessions,
// MaxRunningPerSession) to a kind_policies table made before them, as priorityDDL adds the
// priority: Open (not OpenReadOnly) adds them when missing; every row written before has
// neither (no earlier build could set them).
const policySessionsDDL = `
ALTER TABLE {s}.kind_policies ADD COLUMN IF NOT EXISTS fair_sessions bool NOT NULL DEFAULT false,
	ADD COLUMN IF NOT EXISTS max_running_per_session bigint NOT NULL DEFAULT 0;
`

type kindPolicyStatements struct {
	policies, putPolicy, delPolicy, policyTable string
}

func newKindPolicyStatements(q func(string) string) kindPolicyStatements {
	return kindPolicyStatements{
		policies: q(`SELECT kind, paused, max_running, rate, burst, tokens, tokens_at, set_seq, fair_sessions, max_running_per_session
			FROM {s}.kind_policies ORDER BY kind`),
		putPolicy: q(`INSERT INTO {s}.kind_policies SELECT * FROM unnest($1::bytea[], $2::bool[], $3::bigint[], $4::float8[],
			$5::bigint[], $6::float8[], $7::bigint[], $8::bigint[], $9::bool[], $10::bigint[])
			ON CONFLICT (kind) DO UPDATE SET paused = excluded.paused, max_running = excluded.max_running, rate = excluded.rate,
			burst = excluded.burst, tokens = excluded.tokens, tokens_at = excluded.tokens_at, set_seq = excluded.set_seq,
			fair_sessions = excluded.fair_sessions, max_running_per_session = excluded.max_running_per_session`),
		delPolicy:   q(`DELETE FROM {s}.kind_policies WHERE kind = ANY($1::bytea[])`),
		policyTable: q(`{s}.kind_policies`),
	}
}

// ensurePolicySessions runs policySessionsDDL when kind_policies lacks the columns: the
// check comes first, so an Open of a queue that has them takes no table lock.
func ensurePolicySessions(ctx context.Context, tx pgx.Tx, schema string) error {
	has, err := hasPolicySessions(ctx, tx, schema)
	if err != nil || has {
		return err
	}
	if _, err := tx.Exec(ctx, strings.ReplaceAll(policySessionsDDL, "{s}", pgx.Identifier{schema}.Sanitize())); err != nil {
		return fmt.Errorf("adding the per-session fields to kind_policies in schema %q: %w", schema, err)
	}
	return nil
}

func hasPolicySessions(ctx context.Context, q querier, schema string) (has bool, err error) {
	err = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = 'kind_policies' AND a.attname = 'max_running_per_session' AND NOT a.attisdropped)`,
		schema).Scan(&has)
	return has, err
}

// withoutPolicySessions makes a read-only store's statements read a kind_policies table that
// no Open of this build has given the per-session fields (OpenReadOnly adds nothing): its
// policies have neither. (A schema without the table reads as no policy: readPolicies.)
func (st *statements) withoutPolicySessions(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var table bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, st.kp.policyTable).Scan(&table); err != nil || !table {
		return err
	}
	has, err := hasPolicySessions(ctx, pool, schema)
	if err != nil || has {
		return err
	}
	st.kp.policies = strings.Replace(st.kp.policies, "fair_sessions, max_running_per_session", "false, 0::bigint", 1)
	return nil
}

// ensureKindPolicies creates the two tables when the schema lacks them and fills kind_leases.
func ensureKindPolicies(ctx context.Context, tx pgx.Tx, schema string, exists bool) error {
	if exists {
		return ensurePolicySessions(ctx, tx, schema)
	}
	sid := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, strings.ReplaceAll(kindPoliciesDDL, "{s}", sid)); err != nil {
		return fmt.Errorf("creating tables kind_policies and kind_leases in schema %q: %w", schema, err)
	}
	rows, err := tx.Query(ctx, `SELECT d.task_id, t.rec FROM `+sid+`.due d JOIN `+sid+`.tasks t ON t.id = d.task_id`)
	if err != nil {
		return err
	}
	var ks, ids [][]byte
	var ats, seqs []int64
	for rows.Next() {
		var id, rec []byte
		if err := rows.Scan(&id, &rec); err != nil {
			rows.Close()
			return err
		}
		t, err := recordcodec.DecodeTask(id, rec)
		if err != nil {
			rows.Close()
			return fmt.Errorf("%w: task %s: %v", ErrCorruptRow, id, err)
		}
		if e, ok := t.LeaseEntry(); ok {
			ks, ats, seqs, ids = append(ks, []byte(t.Kind)), append(ats, e.At), append(seqs, int64(e.Seq)), append(ids, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+sid+`.kind_leases SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bytea[])`,
		ks, ats, seqs, ids)
	return err
}

func scanPolicy(rows pgx.Rows) (*projection.KindPolicy, error) {
	var kind []byte
	p := &projection.KindPolicy{}
	var setSeq int64
	err := rows.Scan(&kind, &p.Paused, &p.MaxRunning, &p.Rate, &p.Burst, &p.Tokens, &p.TokensAt, &setSeq, &p.FairSessions, &p.MaxRunningPerSession)
	p.Kind, p.SetSeq = string(kind), uint64(setSeq)
	return p, err
}

// readPolicies reads every policy (nil when the schema has no table: a queue no Open of this
// build has seen, opened read-only, which has no policy).
func readPolicies(ctx context.Context, q querier, st *statements) (map[string]*projection.KindPolicy, error) {
	ps, err := queryPage(ctx, q, scanPolicy, st.kp.policies)
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m := make(map[string]*projection.KindPolicy, len(ps))
	for _, p := range ps {
		m[p.Kind] = p
	}
	return m, nil
}

func callPolicies(m map[string]*projection.KindPolicy, fn func(*projection.KindPolicy) bool) error {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		c := *m[k]
		if !fn(&c) {
			break
		}
	}
	return nil
}

// --- the group's txn ---

// policies returns the group's policies, read on first use.
func (t *txn) policies() (map[string]*projection.KindPolicy, error) {
	if t.pols != nil {
		return t.pols, nil
	}
	m, err := readPolicies(t.ctx, t.conn, t.st)
	if err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]*projection.KindPolicy{}
	}
	t.pols = m
	return m, nil
}

func (t *txn) KindPolicy(kind string) (*projection.KindPolicy, error) {
	m, err := t.policies()
	if err != nil || m[kind] == nil {
		return nil, err
	}
	c := *m[kind]
	return &c, nil
}

func (t *txn) KindPolicies(fn func(*projection.KindPolicy) bool) error {
	m, err := t.policies()
	if err != nil {
		return err
	}
	return callPolicies(m, fn)
}

func (t *txn) PutKindPolicy(p *projection.KindPolicy) error {
	m, err := t.policies()
	if err != nil {
		return err
	}
	c := *p
	m[p.Kind] = &c
	t.markPolicy(p.Kind)
	return nil
}

func (t *txn) DeleteKindPolicy(kind string) error {
	m, err := t.policies()
	if err != nil {
		return err
	}
	delete(m, kind)
	t.markPolicy(kind)
	return nil
}

func (t *txn) markPolicy(kind string) {
	if t.polDirty == nil {
		t.polDirty = map[string]bool{}
	}
	t.polDirty[kind] = true
}

// flushKindPolicies queues the group's pending writes of the changed policies into b
// (flushIndexes). The txn keeps its policies: they stay the group's truth.
func (t *txn) flushKindPolicies(b *pgx.Batch) {
	if len(t.polDirty) > 0 {
		var del, ks [][]byte
		var paused, fair []bool
		var maxr, burst, tat, seq, perSession []int64
		var rate, tokens []float64
		for k := range t.polDirty {
			p := t.pols[k]
			if p == nil {
				del = append(del, []byte(k))
				continue
			}
			ks, paused, maxr, rate = append(ks, []byte(k)), append(paused, p.Paused), append(maxr, p.MaxRunning), append(rate, p.Rate)
			burst, tokens, tat, seq = append(burst, p.Burst), append(tokens, p.Tokens), append(tat, p.TokensAt), append(seq, int64(p.SetSeq))
			fair, perSession = append(fair, p.FairSessions), append(perSession, p.MaxRunningPerSession)
		}
		if len(del) > 0 {
			b.Queue(t.st.kp.delPolicy, del)
		}
		if len(ks) > 0 {
			b.Queue(t.st.kp.putPolicy, ks, paused, maxr, rate, burst, tokens, tat, seq, fair, perSession)
		}
		clear(t.polDirty)
	}
}

// --- a View ---

func (v viewReader) KindPolicy(kind string) (*projection.KindPolicy, error) {
	m, err := readPolicies(v.ctx, v.tx, v.st)
	if err != nil || m[kind] == nil {
		return nil, err
	}
	return m[kind], nil
}

func (v viewReader) KindPolicies(fn func(*projection.KindPolicy) bool) error {
	m, err := readPolicies(v.ctx, v.tx, v.st)
	if err != nil {
		return err
	}
	return callPolicies(m, fn)
}

// loadKindPolicies reads the policies into m (Verify), before the diff (the lease index is
// read with the other indexes: loadEntries). A schema without the table (read-only, before
// this build) has no policy.
func loadKindPolicies(ctx context.Context, q querier, st *statements, m projection.State) error {
	var exists bool // checked first: a failed statement would end Verify's transaction
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, st.kp.policyTable).Scan(&exists); err != nil || !exists {
		return err
	}
	pols, err := readPolicies(ctx, q, st)
	if err != nil {
		return err
	}
	for _, p := range pols {
		if err := m.PutKindPolicy(p); err != nil {
			return err
		}
	}
	return nil
}
