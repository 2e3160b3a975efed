package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/projection"
)

// FormatVersion is the layout of the tables below. It is stored in worklog_meta's format row;
// Open refuses a schema of a newer format (ErrFormatTooNew) and never changes one it refuses.
const FormatVersion = 1

// Every string column is bytea: ids, sessions, kinds and keys are any Go string (the API
// refuses only blank ones), which text would refuse when they hold NUL or invalid UTF-8, and
// bytea compares bytewise, as Go strings do, so max(id) and the key orders are Go's.
//
// Records are internal/recordcodec's (AppendTask) with the values that never change
// after creation (a task's input, a wake's payload and completion output) in columns of
// their own, written once: a claim or a finish updates only rec, and PostgreSQL keeps an
// unchanged TOASTed column as it is, so a large input is not rewritten at every transition.
const schemaDDL = `
CREATE TABLE {s}.worklog_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {s}.log_head (id int PRIMARY KEY CHECK (id = 1), seq bigint NOT NULL, prunes bigint NOT NULL);
INSERT INTO {s}.log_head VALUES (1, 0, 0);
CREATE TABLE {s}.events (seq bigint PRIMARY KEY, session bytea NOT NULL, type smallint NOT NULL, body bytea NOT NULL,
	subject bytea NOT NULL);
CREATE INDEX events_session ON {s}.events (session, seq);
CREATE INDEX events_subject ON {s}.events (subject);
CREATE TABLE {s}.tasks (id bytea PRIMARY KEY, rec bytea NOT NULL, input bytea NOT NULL);
CREATE TABLE {s}.wakes (id bytea PRIMARY KEY, rec bytea NOT NULL, payload bytea NOT NULL, output bytea NOT NULL);
CREATE TABLE {s}.task_keys (session bytea, key bytea, task_id bytea NOT NULL, PRIMARY KEY (session, key));
CREATE TABLE {s}.wake_keys (session bytea, key bytea, wake_id bytea NOT NULL, PRIMARY KEY (session, key));
CREATE TABLE {s}.due (at bigint, seq bigint, task_id bytea NOT NULL, PRIMARY KEY (at, seq));
CREATE TABLE {s}.kind_due (kind bytea, at bigint, seq bigint, task_id bytea NOT NULL, PRIMARY KEY (kind, at, seq));
CREATE TABLE {s}.wake_index (at bigint, seq bigint, wake_id bytea NOT NULL, PRIMARY KEY (at, seq));
CREATE TABLE {s}.session_tasks (session bytea, submit_seq bigint, task_id bytea NOT NULL, PRIMARY KEY (session, submit_seq));
CREATE TABLE {s}.counts (kind bytea, state smallint, n bigint NOT NULL, PRIMARY KEY (kind, state));
CREATE TABLE {s}.prunable (at bigint, seq bigint, id bytea NOT NULL, wake bool NOT NULL, PRIMARY KEY (at, seq));
CREATE TABLE {s}.pruned (from_seq bigint PRIMARY KEY, to_seq bigint NOT NULL UNIQUE, CHECK (from_seq BETWEEN 1 AND to_seq));
INSERT INTO {s}.worklog_meta VALUES ('format', '{format}');
`

// marksDDL creates commit_marks: each writer's row holding the number of its last group that
// wrote, the proof of a COMMIT whose answer was lost (writer.go, commitMark). It came after
// format 1 without changing it: Open (not OpenReadOnly) creates it when it is missing, and
// builds that do not know it ignore it. It is not in tableNames, so a schema without it is
// still a whole queue.
const marksDDL = `CREATE TABLE {s}.commit_marks (writer bytea PRIMARY KEY, n bigint NOT NULL, at timestamptz NOT NULL)`

// tableNames are the tables of the format, for the check that a schema holds no half of one.
var tableNames = []string{"worklog_meta", "log_head", "events", "tasks", "wakes", "task_keys", "wake_keys",
	"due", "kind_due", "wake_index", "session_tasks", "counts", "prunable", "pruned"}

// statements holds every statement, with the queue's schema in it.
type statements struct {
	lockHead, maxTask, maxWake                                              string
	task, wake, taskKey, wakeKey                                            string
	scanSession, counts, lastSeq                                            string
	insEvents, setHead, insTasks, updTasks, insWakes                        string
	updWakes, insTaskKeys, insWakeKeys, insSession, addCnt                  string
	readLog, sessionLog, sessions, scanTasks                                string
	scanWakeRecs, allSession                                                string
	allTaskKeys, allWakeKeys                                                string
	allLoggedTaskKeys, inboxDecided, inboxTable                             string // Verify's, beside the inbox (submittx.go)
	setPrunes, delTasks, delWakes, delTaskKeys, delWakeKeys                 string
	delSession, insPrunable, delPrunable, scanPrunable                      string
	scanPrunableFrom, delEvents, takeAdjacent, insPruned                    string
	tasksByID, wakesByID, taskKeysIn, wakeKeysIn, prunedRanges, allPrunable string
	setMark, getMark, delMark, waitHead                                     string
	taskKeyRec, wakeKeyRec, taskKeysRec, wakeKeysRec                        string // ViewDurable's (readfirst.go)
	dueSummary                                                              string // viewReader.DueSummary's (index.go)
	changesSince                                                            string // the writer's cache (catchup.go)
	insTaskKeysBounded                                                      string // insTaskKeys under keyWaitUnderHead (submittx.go)
	headNow, checkHead, headLast                                            string // the writer's fast path (fast.go), its begin (catchup.go)

	idx [projection.NumIndexes]indexStatements // the eligibility indexes (index.go)
	sc  scheduleStatements                     // the schedules (schedules.go)
	kp  kindPolicyStatements                   // the kind policies and lease index (kind_policies.go)
	cp  copyStatements                         // a large group's inserts (copy.go)
	pre preStatements                          // a claim's reads in the begin (claimpre.go)

	oneRow map[string]string // each commit insert's single-row form (onerow.go, queueRows)
}

func newStatements(schema string) *statements {
	s := pgx.Identifier{schema}.Sanitize()
	q := func(f string) string { return strings.ReplaceAll(f, "{s}", s) }
	// The scans read pages: (at, seq) > the last entry of the page before, in the primary
	// key's order; a task scan joins the record, so a claim reads its tasks in the same
	// round trip (LEFT: a task put in the same group is not written before the commit).
	st := &statements{
		lockHead: q(`SELECT seq, prunes FROM {s}.log_head WHERE id = 1 FOR UPDATE`),
		maxTask:  q(`SELECT coalesce((SELECT id FROM {s}.tasks ORDER BY id DESC LIMIT 1), ''::bytea)`),
		maxWake:  q(`SELECT coalesce((SELECT id FROM {s}.wakes ORDER BY id DESC LIMIT 1), ''::bytea)`),
		lastSeq:  q(`SELECT seq FROM {s}.log_head WHERE id = 1`),
		task:     q(`SELECT rec, input FROM {s}.tasks WHERE id = $1`),
		wake:     q(`SELECT rec, payload, output FROM {s}.wakes WHERE id = $1`),
		// A key whose task is not in the log is a SubmitTx's, not yet taken in (submittx.go):
		// absent to every read, and its row still refuses a second insert.
		taskKey: q(`SELECT k.task_id FROM {s}.task_keys k WHERE k.session = $1 AND k.key = $2
			AND EXISTS (SELECT 1 FROM {s}.tasks t WHERE t.id = k.task_id)`),
		wakeKey: q(`SELECT wake_id FROM {s}.wake_keys WHERE session = $1 AND key = $2`),
		scanSession: q(`SELECT submit_seq, task_id FROM {s}.session_tasks WHERE session = $1 AND submit_seq > $2
			ORDER BY submit_seq LIMIT $3`),
		counts: q(`SELECT kind, state, n FROM {s}.counts WHERE n <> 0 ORDER BY kind, state`),

		insEvents: q(`INSERT INTO {s}.events (seq, session, type, body, subject)
			SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::smallint[], $4::bytea[], $5::bytea[])`),
		setHead:  q(`UPDATE {s}.log_head SET seq = $1 WHERE id = 1`),
		insTasks: q(`INSERT INTO {s}.tasks (id, rec, input) SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[])`),
		updTasks: q(`UPDATE {s}.tasks t SET rec = u.rec FROM unnest($1::bytea[], $2::bytea[]) AS u(id, rec) WHERE t.id = u.id`),
		insWakes: q(`INSERT INTO {s}.wakes (id, rec, payload, output)
			SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bytea[])`),
		updWakes:    q(`UPDATE {s}.wakes w SET rec = u.rec FROM unnest($1::bytea[], $2::bytea[]) AS u(id, rec) WHERE w.id = u.id`),
		insTaskKeys: q(`INSERT INTO {s}.task_keys SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[])`),
		insWakeKeys: q(`INSERT INTO {s}.wake_keys SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[])`),
		insSession:  q(`INSERT INTO {s}.session_tasks SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bytea[])`),
		addCnt: q(`INSERT INTO {s}.counts AS c SELECT * FROM unnest($1::bytea[], $2::smallint[], $3::bigint[])
			ON CONFLICT (kind, state) DO UPDATE SET n = c.n + excluded.n`),

		readLog:      q(`SELECT seq, body FROM {s}.events WHERE seq >= $1 AND seq <= $2 ORDER BY seq LIMIT $3`),
		sessionLog:   q(`SELECT seq, body FROM {s}.events WHERE session = $1 AND seq >= $2 ORDER BY seq LIMIT $3`),
		sessions:     q(`SELECT DISTINCT session FROM {s}.events ORDER BY session`),
		scanTasks:    q(`SELECT id, rec, input FROM {s}.tasks WHERE id > $1 ORDER BY id LIMIT $2`),
		scanWakeRecs: q(`SELECT id, rec, payload, output FROM {s}.wakes WHERE id > $1 ORDER BY id LIMIT $2`),
		allSession:   q(`SELECT session, submit_seq, task_id FROM {s}.session_tasks ORDER BY session, submit_seq`),
		allTaskKeys:  q(`SELECT session, key, task_id FROM {s}.task_keys`),
		// Verify's, less the keys of decided SubmitTx rows not yet taken in (submittx.go).
		allLoggedTaskKeys: q(`SELECT session, key, task_id FROM {s}.task_keys k
			WHERE NOT EXISTS (SELECT 1 FROM {s}.submit_inbox i WHERE i.task_id = k.task_id)`),
		inboxDecided: q(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
			WHERE attrelid = to_regclass($1) AND attname = 'task_id' AND NOT attisdropped)`),
		allWakeKeys: q(`SELECT session, key, wake_id FROM {s}.wake_keys`),

		// Retention (prune.go).
		setPrunes:   q(`UPDATE {s}.log_head SET prunes = $1 WHERE id = 1`),
		delTasks:    q(`DELETE FROM {s}.tasks WHERE id = ANY($1::bytea[])`),
		delWakes:    q(`DELETE FROM {s}.wakes WHERE id = ANY($1::bytea[])`),
		delTaskKeys: q(`DELETE FROM {s}.task_keys WHERE (session, key) IN (SELECT * FROM unnest($1::bytea[], $2::bytea[]))`),
		delWakeKeys: q(`DELETE FROM {s}.wake_keys WHERE (session, key) IN (SELECT * FROM unnest($1::bytea[], $2::bytea[]))`),
		delSession:  q(`DELETE FROM {s}.session_tasks WHERE (session, submit_seq) IN (SELECT * FROM unnest($1::bytea[], $2::bigint[]))`),
		insPrunable: q(`INSERT INTO {s}.prunable SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bytea[], $4::bool[])
			ON CONFLICT (at, seq) DO UPDATE SET id = excluded.id, wake = excluded.wake`),
		delPrunable:      q(`DELETE FROM {s}.prunable WHERE (at, seq) IN (SELECT * FROM unnest($1::bigint[], $2::bigint[]))`),
		scanPrunable:     q(`SELECT at, seq, id, wake FROM {s}.prunable WHERE at < $1 ORDER BY at, seq LIMIT $2`),
		scanPrunableFrom: q(`SELECT at, seq, id, wake FROM {s}.prunable WHERE at < $1 AND (at, seq) > ($3, $4) ORDER BY at, seq LIMIT $2`),
		delEvents:        q(`DELETE FROM {s}.events WHERE subject = ANY($1::bytea[]) RETURNING seq`),
		// The ranges that touch a group's runs ($1: each run's From-1, $2: its To+1) are
		// taken out, coalesced with the runs in Go and put back (insPruned).
		takeAdjacent: q(`DELETE FROM {s}.pruned WHERE to_seq = ANY($1::bigint[]) OR from_seq = ANY($2::bigint[])
			RETURNING from_seq, to_seq`),
		insPruned: q(`INSERT INTO {s}.pruned SELECT * FROM unnest($1::bigint[], $2::bigint[])`),
		tasksByID: q(`SELECT id, rec, input FROM {s}.tasks WHERE id = ANY($1::bytea[])`),
		wakesByID: q(`SELECT id, rec, payload, output FROM {s}.wakes WHERE id = ANY($1::bytea[])`),
		taskKeysIn: q(`SELECT session, key, task_id FROM {s}.task_keys k WHERE (session, key) IN (SELECT * FROM unnest($1::bytea[], $2::bytea[]))
			AND EXISTS (SELECT 1 FROM {s}.tasks t WHERE t.id = k.task_id)`),
		wakeKeysIn:   q(`SELECT session, key, wake_id FROM {s}.wake_keys WHERE (session, key) IN (SELECT * FROM unnest($1::bytea[], $2::bytea[]))`),
		prunedRanges: q(`SELECT from_seq, to_seq FROM {s}.pruned ORDER BY from_seq`),
		allPrunable:  q(`SELECT at, seq, id, wake FROM {s}.prunable ORDER BY at, seq`),

		// The writers' commit marks (writer.go, commitMark).
		idx: indexStatementsOf(q, true),
		sc:  newScheduleStatements(q),
		kp:  newKindPolicyStatements(q),
		cp:  newCopyStatements(q),
		pre: newPreStatements(q),
		setMark: q(`INSERT INTO {s}.commit_marks AS m VALUES ($1, $2, now())
			ON CONFLICT (writer) DO UPDATE SET n = excluded.n, at = excluded.at`),
		getMark:  q(`SELECT n FROM {s}.commit_marks WHERE writer = $1`),
		delMark:  q(`DELETE FROM {s}.commit_marks WHERE writer = $1`),
		waitHead: q(`SELECT 1 FROM {s}.log_head WHERE id = 1 FOR SHARE`),
	}
	st.taskKeyRec, st.wakeKeyRec, st.taskKeysRec, st.wakeKeysRec = keyRecStatements(q)
	st.inboxTable = s + ".submit_inbox"
	st.dueSummary = q(`SELECT count(*), coalesce(min(at), 0) FROM {s}.due WHERE at <= $1`)
	st.changesSince = changesSinceStatement(q)
	st.headNow, st.checkHead = headStatements(q)
	st.headLast = headLastStatement(q)
	st.setOneRow()
	return st
}

// setOneRow derives oneRow from the commit's inserts: after newStatements, and again when
// withoutPriority replaces the index statements.
func (st *statements) setOneRow() {
	inserts := []string{st.insEvents, st.insTasks, st.insWakes, st.insTaskKeys, st.insWakeKeys,
		st.insSession, st.addCnt, st.insPrunable}
	for i := range st.idx {
		inserts = append(inserts, st.idx[i].ins)
	}
	st.oneRow = oneRowForms(inserts...)
	st.insTaskKeysBounded = boundKeyInsert(st.insTaskKeys)
	st.oneRow[st.insTaskKeysBounded] = boundKeyInsert(st.oneRow[st.insTaskKeys])
}

// channelName is the LISTEN/NOTIFY channel of the queue in schema: a hash, since a channel
// is an identifier of at most 63 bytes and a schema name may be as long.
func channelName(schema string) string {
	h := fnv.New64a()
	h.Write([]byte(schema))
	return fmt.Sprintf("worklog_%016x", h.Sum64())
}

// DefaultSchema is the schema a queue lives in when the DSN names no search_path. A queue
// that an older version created in another schema (public, the server's default) is found
// only when the DSN names it: search_path=public.
const DefaultSchema = "worklog"

// DSNError is an invalid DSN: Field names the setting (search_path) and Value its value.
// It is ErrInvalidDSN (errors.Is).
type DSNError struct {
	Field, Value, Reason string
}

func (e *DSNError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%v: %s (not set): %s", ErrInvalidDSN, e.Field, e.Reason)
	}
	return fmt.Sprintf("%v: %s %q: %s", ErrInvalidDSN, e.Field, e.Value, e.Reason)
}

func (e *DSNError) Unwrap() error { return ErrInvalidDSN }

// searchPath splits a search_path value as PostgreSQL does (SplitIdentifierString): entries
// separated by commas, each a double-quoted identifier ("" is a quote inside) or an unquoted
// one, which is folded to lower case. The entry $user (quoted or not) is reported as "$user":
// it means the session user's schema.
func searchPath(sp string) ([]string, error) {
	var out []string
	bad := func(why string) error { return &DSNError{Field: "search_path", Value: sp, Reason: why} }
	rest := strings.TrimLeft(sp, " \t\r\n")
	if rest == "" {
		return nil, nil
	}
	for {
		var name string
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(rest[i:], '"')
				if j < 0 {
					return nil, bad("an unterminated quoted name")
				}
				b.WriteString(rest[i : i+j])
				i += j + 1
				if i < len(rest) && rest[i] == '"' {
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			name, rest = b.String(), rest[i:]
			if name == "" {
				return nil, bad("an empty quoted name")
			}
		} else {
			j := strings.IndexAny(rest, ", \t\r\n")
			if j < 0 {
				j = len(rest)
			}
			name, rest = asciiLower(rest[:j]), rest[j:]
			if name == "" {
				return nil, bad("an empty name")
			}
		}
		out = append(out, name)
		rest = strings.TrimLeft(rest, " \t\r\n")
		if rest == "" {
			return out, nil
		}
		if rest[0] != ',' {
			return nil, bad("names must be separated by commas")
		}
		rest = strings.TrimLeft(rest[1:], " \t\r\n")
	}
}

// asciiLower folds A-Z only, as PostgreSQL folds an unquoted identifier in UTF-8.
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}, s)
}

// systemSchema reports the schemas a queue may never live in: PostgreSQL reserves the pg_
// prefix (pg_catalog, pg_toast, pg_temp...), and information_schema is the standard's views.
func systemSchema(name string) bool {
	return strings.HasPrefix(name, "pg_") || name == "information_schema"
}

// schemaOf is the schema the queue's tables live in. With a search_path in the DSN it is the
// schema PostgreSQL itself would create an unqualified table in (current_schema()): the first
// entry of the path that exists and that the user may use, $user meaning the session user's
// schema; when none exists, the first entry, which ensureSchema creates. Without one it is
// DefaultSchema. A system schema (pg_*, information_schema) is a DSNError naming search_path.
func schemaOf(ctx context.Context, pool *pgxpool.Pool) (schema string, defaulted bool, err error) {
	sp := pool.Config().ConnConfig.RuntimeParams["search_path"]
	if strings.TrimSpace(sp) == "" {
		return DefaultSchema, true, nil
	}
	path, err := searchPath(sp)
	if err != nil {
		return "", false, err
	}
	var user string
	if err := pool.QueryRow(ctx, "SELECT session_user::text").Scan(&user); err != nil {
		return "", false, err
	}
	for i, n := range path {
		if n == "$user" {
			path[i] = user
		}
	}
	var first *string
	err = pool.QueryRow(ctx, `SELECT p.n FROM unnest($1::text[]) WITH ORDINALITY AS p(n, i)
		JOIN pg_catalog.pg_namespace ns ON ns.nspname = p.n
		WHERE has_schema_privilege(ns.oid, 'USAGE') ORDER BY p.i LIMIT 1`, path).Scan(&first)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		first = &path[0] // none exists: ensureSchema creates the first
	case err != nil:
		return "", false, err
	}
	if systemSchema(*first) {
		return "", false, &DSNError{Field: "search_path", Value: sp, Reason: fmt.Sprintf(
			"resolves to the system schema %q: name the queue's own schema first (default %q)", *first, DefaultSchema)}
	}
	return *first, false, nil
}

// ensureSchema creates the schema's tables when there are none, or checks their format.
// Concurrent Opens of one schema take turns on an advisory lock, so exactly one creates.
// defaulted: the DSN named no schema; then a queue an older version made in a schema of the
// server's search_path (public) is refused by name rather than left behind for a new, empty
// one (legacyQueue).
func ensureSchema(ctx context.Context, pool *pgxpool.Pool, schema string, defaulted, readOnly bool) (err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback(context.Background())
		}
	}()
	if !readOnly {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('worklog schema ' || $1))`, schema); err != nil {
			return err
		}
	}
	var have []string
	// pg_catalog, not information_schema, whose views cost tens of milliseconds.
	rows, err := tx.Query(ctx, `SELECT c.relname::text FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')`, schema)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	ours := map[string]bool{}
	for _, n := range tableNames {
		ours[n] = true
	}
	hasMarks, hasSessionWakes, hasKindPolicies := false, false, false
	for _, n := range names {
		if ours[n] {
			have = append(have, n)
		}
		hasMarks = hasMarks || n == "commit_marks"
		hasSessionWakes = hasSessionWakes || n == "session_wakes"
		hasKindPolicies = hasKindPolicies || n == "kind_leases"
	}
	if len(have) == 0 {
		if defaulted {
			if err := legacyQueue(ctx, tx, schema); err != nil {
				return err
			}
		}
		if readOnly {
			return fmt.Errorf("%w: schema %q has no worklog tables", ErrNotAQueue, schema)
		}
		sid := pgx.Identifier{schema}.Sanitize()
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+sid); err != nil {
			return err
		}
		ddl := strings.ReplaceAll(schemaDDL, "{s}", sid)
		ddl = strings.ReplaceAll(ddl, "{format}", strconv.Itoa(FormatVersion))
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("creating the worklog tables in schema %q: %w", schema, err)
		}
		if err := ensureAdditions(ctx, tx, schema, false, false, false); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	var format string
	err = tx.QueryRow(ctx, `SELECT value FROM `+pgx.Identifier{schema, "worklog_meta"}.Sanitize()+` WHERE key = 'format'`).Scan(&format)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && len(have) != len(tableNames)) || isUndefinedTable(err) {
		return fmt.Errorf("%w: schema %q holds %d of worklog's %d tables (%s) but no complete format %d layout",
			ErrNotAQueue, schema, len(have), len(tableNames), strings.Join(have, ", "), FormatVersion)
	}
	if err != nil {
		return err
	}
	n, perr := strconv.Atoi(format)
	switch {
	case perr != nil:
		return fmt.Errorf("%w: schema %q: worklog_meta format %q is not a number", ErrNotAQueue, schema, format)
	case n > FormatVersion:
		return fmt.Errorf("%w: schema %q holds worklog format %d (table worklog_meta, key format); this build reads format %d",
			ErrFormatTooNew, schema, n, FormatVersion)
	case n < FormatVersion:
		return fmt.Errorf("%w: schema %q holds worklog format %d, older than any this build reads (%d)",
			ErrNotAQueue, schema, n, FormatVersion)
	}
	if !readOnly {
		if err := ensureAdditions(ctx, tx, schema, hasMarks, hasSessionWakes, hasKindPolicies); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// ensureAdditions makes what came after format 1 without changing it, in order, on a new
// schema (every has* false) as on an existing one: the commit marks, the per-session wake
// index, the kind policies, the priority columns, the schedules, the SubmitTx inbox, and last
// the storage parameters of every table (those just made included).
func ensureAdditions(ctx context.Context, tx pgx.Tx, schema string, hasMarks, hasSessionWakes, hasKindPolicies bool) error {
	for _, step := range []func() error{
		func() error { return ensureMarks(ctx, tx, schema, hasMarks) },
		func() error { return ensureSessionWakes(ctx, tx, schema, hasSessionWakes) },
		func() error { return ensureKindPolicies(ctx, tx, schema, hasKindPolicies) },
		func() error { return ensurePriority(ctx, tx, schema) },
		func() error { return ensureSchedules(ctx, tx, schema) },
		func() error { return ensureInbox(ctx, tx, schema) },
		func() error { return ensureStorage(ctx, tx, schema) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// priorityDDL gives the due indexes the task's priority (TaskRequest.Priority), and the
// indexes that serve the claims' order: each priority's run in (at, seq) order, and the next
// lower priority present. Added after format 1 without changing it, as commit_marks: Open
// (not OpenReadOnly) adds them when they are missing; rows written before have priority 0,
// which every task had (no earlier build could submit another).
const priorityDDL = `
ALTER TABLE {s}.due ADD COLUMN IF NOT EXISTS priority bigint NOT NULL DEFAULT 0;
ALTER TABLE {s}.kind_due ADD COLUMN IF NOT EXISTS priority bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS due_priority ON {s}.due (priority DESC, at, seq);
CREATE INDEX IF NOT EXISTS kind_due_priority ON {s}.kind_due (kind, priority DESC, at, seq);
`

// ensurePriority runs priorityDDL when the schema lacks it: the check comes first, so an Open
// of a queue that has it takes no table lock (ALTER TABLE would, even when it changes nothing).
func ensurePriority(ctx context.Context, tx pgx.Tx, schema string) error {
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
		WHERE ns.nspname = $1 AND c.relname IN ('due_priority', 'kind_due_priority')`, schema).Scan(&n)
	if err != nil || n == 2 {
		return err
	}
	if _, err := tx.Exec(ctx, strings.ReplaceAll(priorityDDL, "{s}", pgx.Identifier{schema}.Sanitize())); err != nil {
		return fmt.Errorf("adding the priority to the due indexes in schema %q: %w", schema, err)
	}
	return nil
}

// withoutPriority makes a read-only store's statements read a queue that no Open of this
// build has given the priority yet (OpenReadOnly adds nothing): its due rows have no priority
// column and are all of priority 0, so the walk finds that one priority and reads its rows as
// before, and Verify loads them at priority 0.
func (st *statements) withoutPriority(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var has bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = 'due' AND a.attname = 'priority' AND NOT a.attisdropped)`, schema).Scan(&has)
	if err != nil || has {
		return err
	}
	q := func(sql string) string { return strings.ReplaceAll(sql, "{s}", pgx.Identifier{schema}.Sanitize()) }
	st.idx = indexStatementsOf(q, false)
	st.setOneRow()
	return nil
}

// ensureMarks creates commit_marks when the schema has none (a queue created before it), and
// removes the rows of writers whose last group is older than markMaxAge: processes that
// stopped without removing theirs.
func ensureMarks(ctx context.Context, tx pgx.Tx, schema string, exists bool) error {
	sid := pgx.Identifier{schema}.Sanitize()
	if !exists {
		if _, err := tx.Exec(ctx, strings.ReplaceAll(marksDDL, "{s}", sid)); err != nil {
			return fmt.Errorf("creating table commit_marks in schema %q: %w", schema, err)
		}
		return nil
	}
	_, err := tx.Exec(ctx, `DELETE FROM `+sid+`.commit_marks WHERE at < now() - make_interval(secs => $1)`, markMaxAge.Seconds())
	return err
}

// legacyQueue refuses to start a new queue in the default schema while the server's own
// search_path (public, usually) holds one an older version created there when the DSN named no
// schema: its work would look lost. The error says how to keep using it.
func legacyQueue(ctx context.Context, tx pgx.Tx, schema string) error {
	var old *string
	err := tx.QueryRow(ctx, `SELECT n.nspname::text FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'worklog_meta' AND c.relkind IN ('r', 'p') AND n.nspname <> $1
		AND n.nspname = ANY(current_schemas(false)) ORDER BY array_position(current_schemas(false), n.nspname) LIMIT 1`,
		schema).Scan(&old)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	return &DSNError{Field: "search_path", Value: "", Reason: fmt.Sprintf(
		"the DSN names no schema, so the queue's is %q, which holds no queue yet; schema %q holds one "+
			"an older version created: name it to keep using it (search_path=%s), or name %q to start a new one "+
			"beside it (search_path=%s)", schema, *old, *old, schema, schema)}
}
