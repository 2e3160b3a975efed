package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/projection"
)

// The per-session available-wake index: wake_index's rows again under each wake's session,
// so that a claim of the wakes of chosen sessions (work's ClaimSessionWakes) reads only
// those sessions' rows, through the primary key (session, at, seq). The fold keeps it
// (projection.State's PutSessionWake and DeleteSessionWake, beside wake_index's writes).
//
// The plan of the claim's scan, as EXPLAIN showed it (TestSessionWakesPlan, which fails on a
// sequential scan of session_wakes; 20,000 entries of 1,000 sessions, the wakes table empty):
//
//	Limit -> Sort (d.at, d.seq) -> Hash Right Join (w.id = d.wake_id)
//	  -> Bitmap Heap Scan on session_wakes d
//	       -> Bitmap Index Scan on session_wakes_pkey
//	            Index Cond: ((session = $3) AND (at <= $1) [AND (ROW(at, seq) > ROW($4, $5))])
//
// so the rows read are the chosen session's available entries only.
//
// The table came after format 1 without changing it, like commit_marks: a read-write Open
// creates it when it is missing (sessionWakesDDL, IF NOT EXISTS) and fills it from
// wake_index and the wake records, in ensureSchema's transaction under its advisory lock. It
// is not in tableNames, so a schema without it is still a whole queue. A build that does not
// know the table does not keep it: processes of an older build must not write to a queue
// that a newer one has opened (the schema's Verify names every entry such a process left out).
const sessionWakesDDL = `CREATE TABLE IF NOT EXISTS {s}.session_wakes (session bytea, at bigint, seq bigint,
	wake_id bytea NOT NULL, PRIMARY KEY (session, at, seq))`

// sessionWakeStatements are the statements of the index, with the queue's schema in them.
type sessionWakeStatements struct {
	scan, scanFrom, ins, del, all string
	table                         string // the table's qualified name, for to_regclass
}

func newSessionWakeStatements(q func(string) string) sessionWakeStatements {
	return sessionWakeStatements{
		scan: q(`SELECT d.at, d.seq, d.wake_id, w.rec, w.payload, w.output FROM {s}.session_wakes d LEFT JOIN {s}.wakes w ON w.id = d.wake_id
			WHERE d.session = $3 AND d.at <= $1 ORDER BY d.at, d.seq LIMIT $2`),
		scanFrom: q(`SELECT d.at, d.seq, d.wake_id, w.rec, w.payload, w.output FROM {s}.session_wakes d LEFT JOIN {s}.wakes w ON w.id = d.wake_id
			WHERE d.session = $3 AND d.at <= $1 AND (d.at, d.seq) > ($4, $5) ORDER BY d.at, d.seq LIMIT $2`),
		ins: q(`INSERT INTO {s}.session_wakes SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bytea[])
			ON CONFLICT (session, at, seq) DO UPDATE SET wake_id = excluded.wake_id`),
		del:   q(`DELETE FROM {s}.session_wakes WHERE (session, at, seq) IN (SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bigint[]))`),
		all:   q(`SELECT session, at, seq, wake_id FROM {s}.session_wakes ORDER BY session, at, seq`),
		table: q(`{s}.session_wakes`),
	}
}

// ensureSessionWakes creates session_wakes when the schema has none (a queue created before
// it) and fills it from wake_index, reading each available wake's session from its record.
// Only the working set is read: wake_index holds the unacknowledged wakes.
func ensureSessionWakes(ctx context.Context, tx pgx.Tx, schema string, exists bool) error {
	if exists {
		return nil
	}
	sid := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, strings.ReplaceAll(sessionWakesDDL, "{s}", sid)); err != nil {
		return fmt.Errorf("creating table session_wakes in schema %q: %w", schema, err)
	}
	rows, err := tx.Query(ctx, `SELECT d.at, d.seq, d.wake_id, w.rec FROM `+sid+`.wake_index d JOIN `+sid+`.wakes w ON w.id = d.wake_id`)
	if err != nil {
		return err
	}
	var ss, ids [][]byte
	var ats, seqs []int64
	for rows.Next() {
		var at, seq int64
		var id, rec []byte
		if err := rows.Scan(&at, &seq, &id, &rec); err != nil {
			rows.Close()
			return err
		}
		w, err := recordcodec.DecodeWake(id, rec)
		if err != nil {
			rows.Close()
			return fmt.Errorf("%w: wake %s: %v", ErrCorruptRow, id, err)
		}
		ss, ats, seqs, ids = append(ss, []byte(w.SessionID)), append(ats, at), append(seqs, seq), append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+sid+`.session_wakes SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::bytea[])`,
		ss, ats, seqs, ids)
	return err
}

// sessWakeKey names one entry of the index.
type sessWakeKey struct {
	session string
	dueKey
}

func (t *txn) ScanSessionWakes(sessionID string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return scanJoined(t, wakeTable, t.st.sw.scan, t.st.sw.scanFrom, []any{[]byte(sessionID)}, maxAt, fn)
}

func (t *txn) PutSessionWake(sessionID string, e projection.IndexEntry) error {
	if t.sessWakes == nil {
		t.sessWakes = map[sessWakeKey]idxOp{}
	}
	netPut(t.sessWakes, sessWakeKey{sessionID, dueKey{e.At, e.Seq}}, e.ID)
	return nil
}

func (t *txn) DeleteSessionWake(sessionID string, e projection.IndexEntry) error {
	if t.sessWakes == nil {
		t.sessWakes = map[sessWakeKey]idxOp{}
	}
	netDelete(t.sessWakes, sessWakeKey{sessionID, dueKey{e.At, e.Seq}})
	return nil
}

// flushSessionWakes queues the group's pending writes of the index into b (flushIndexes).
func (t *txn) flushSessionWakes(b *pgx.Batch) {
	if len(t.sessWakes) == 0 {
		return
	}
	var ps, ds, pid [][]byte
	var pa, da, pq, dq []int64
	for k, op := range t.sessWakes {
		if op.put {
			ps, pa, pq, pid = append(ps, []byte(k.session)), append(pa, k.at), append(pq, int64(k.seq)), append(pid, []byte(op.id))
		} else {
			ds, da, dq = append(ds, []byte(k.session)), append(da, k.at), append(dq, int64(k.seq))
		}
	}
	if len(ds) > 0 {
		b.Queue(t.st.sw.del, ds, da, dq)
	}
	if len(ps) > 0 {
		b.Queue(t.st.sw.ins, ps, pa, pq, pid)
	}
	clear(t.sessWakes)
}

// ScanSessionWakes of a View. A schema made by a build before the index, opened read-only
// (which creates nothing), has no session_wakes table: the scan says so.
func (v viewReader) ScanSessionWakes(sessionID string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	err := scanIndex(v.ctx, v.tx, wakeTable, v.st.sw.scan, v.st.sw.scanFrom, []any{[]byte(sessionID)}, maxAt, fn)
	if isUndefinedTable(err) {
		return fmt.Errorf("%w: the queue has no per-session wake index (table session_wakes) yet: a read-write Open creates it", errNoSessionWakes)
	}
	return err
}

// errNoSessionWakes: a read-only View of a schema without session_wakes.
var errNoSessionWakes = errors.New("postgres: the schema predates the per-session wake index")

// loadSessionWakes reads the index into m (Verify), after its wake index. A schema made
// before the index, opened read-only, has no table to compare: m then gets the entries its
// wake index implies (each wake's session from wake: Verify's fold, as the stored records
// are not held), so that Verify reports what the schema holds and nothing about an index it
// does not have yet.
func loadSessionWakes(ctx context.Context, q querier, st *statements, m *projection.Mem, wake func(id string) (*projection.Wake, error)) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, st.sw.table).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		var werr error
		err := m.ScanWakes(math.MaxInt64, func(e projection.IndexEntry) bool {
			var w *projection.Wake
			if w, werr = wake(e.ID); werr == nil && w != nil {
				werr = m.PutSessionWake(w.SessionID, e)
			}
			return werr == nil
		})
		return errors.Join(err, werr)
	}
	return eachRow(ctx, q, st.sw.all, func(r pgx.Rows) error {
		var session, id []byte
		var at, seq int64
		if err := r.Scan(&session, &at, &seq, &id); err != nil {
			return err
		}
		return m.PutSessionWake(string(session), projection.IndexEntry{At: at, Seq: uint64(seq), ID: string(id)})
	})
}
