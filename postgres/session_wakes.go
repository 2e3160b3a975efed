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
// those sessions' rows, through the primary key (session, at, seq): projection.IndexSessionWakes,
// whose statements are index.go's.
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

// errNoSessionWakes: a read-only View of a schema without session_wakes.
var errNoSessionWakes = errors.New("postgres: the schema predates the per-session wake index")

// impliedSessionWakes puts into m the entries of the per-session wake index that its wake
// index implies (loadEntries, for a schema without session_wakes), each wake's session from
// wake (Verify's fold: the stored records are compared as they are read, not held in m).
func impliedSessionWakes(m projection.State, wake func(id string) (*projection.Wake, error)) error {
	var werr error
	err := m.ScanIndex(projection.IndexWakes, "", math.MinInt64, math.MaxInt64, func(e projection.IndexEntry) bool {
		var w *projection.Wake
		if w, werr = wake(e.ID); werr == nil && w != nil {
			werr = m.PutIndex(projection.IndexSessionWakes, w.SessionID, e)
		}
		return werr == nil
	})
	return errors.Join(err, werr)
}
