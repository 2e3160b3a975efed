package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// freshDatabase creates a database of its own for t (so that its public schema and its
// settings are t's alone) and returns the server's DSN pointing at it, without search_path.
func freshDatabase(t *testing.T) string {
	t.Helper()
	srv := pgtest.Need(t)
	b := make([]byte, 6)
	rand.Read(b)
	name := "wl_" + hex.EncodeToString(b)
	if err := srv.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	u, err := url.Parse(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	return u.String()
}

// queryStrings runs sql on a connection of its own to dsn and returns the first column.
func queryStrings(t *testing.T, dsn, sql string, args ...any) []string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// schemasWithQueues lists the schemas of dsn's database that hold worklog_meta.
func schemasWithQueues(t *testing.T, dsn string) []string {
	return queryStrings(t, dsn, `SELECT n.nspname::text FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = 'worklog_meta' ORDER BY 1`)
}

func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestSearchPathParsing(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{`"$user", public`, []string{"$user", "public"}},
		{`$user,public`, []string{"$user", "public"}},
		{`Queue1`, []string{"queue1"}},
		{` "My ""Q"", x" , b `, []string{`My "Q", x`, "b"}},
		{`"ÄB"`, []string{"ÄB"}},
		{`ÄB`, []string{"Äb"}}, // PostgreSQL folds ASCII letters only in UTF-8
	} {
		got, err := searchPath(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("searchPath(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{`"open`, `a,,b`, `a b`, `""`, `a,`} {
		var de *DSNError
		if _, err := searchPath(in); !errors.As(err, &de) || de.Field != "search_path" || !errors.Is(err, ErrInvalidDSN) {
			t.Errorf("searchPath(%q) = %v, want a DSNError naming search_path", in, err)
		}
	}
}

// search_path is resolved as PostgreSQL resolves it for an unqualified CREATE TABLE: the
// first existing schema of the path, $user (quoted or not) meaning the session user's. It
// used to create a schema literally named "$user".
func TestSearchPathUserResolved(t *testing.T) {
	ctx := context.Background()
	db := freshDatabase(t)
	for _, sp := range []string{`"$user",public`, `$user,public`} {
		dsn := withParam(t, db, "search_path", sp)
		e, q := openEngine(t, dsn, nil)
		if e.Schema() != "public" {
			t.Fatalf("search_path %s, no schema of the user's name: the queue is in %q, want public", sp, e.Schema())
		}
		q.Close()
	}
	if got := queryStrings(t, db, `SELECT nspname::text FROM pg_namespace WHERE nspname LIKE '%user%'`); len(got) != 0 {
		t.Fatalf("schemas %q were created", got)
	}
	// With a schema of the session user's name (postgres, pgtest's), $user is that one.
	user := queryStrings(t, db, "SELECT session_user::text")[0]
	execOn(t, db, "CREATE SCHEMA "+pgx.Identifier{user}.Sanitize())
	e, q := openEngine(t, withParam(t, db, "search_path", `"$user",public`), nil)
	if e.Schema() != user {
		t.Fatalf("the queue is in %q, want the session user's schema %q", e.Schema(), user)
	}
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	// No schema of the path exists: the first is created (unquoted: folded to lower case).
	e, _ = openEngine(t, withParam(t, db, "search_path", "NewQ,Other"), nil)
	if e.Schema() != "newq" {
		t.Fatalf("the queue is in %q, want newq", e.Schema())
	}
	if got, want := schemasWithQueues(t, db), []string{"newq", user, "public"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("queues in schemas %q, want %q", got, want)
	}
}

// execOn runs sql on a connection of its own to dsn.
func execOn(t *testing.T, dsn, sql string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

// A search_path resolving to a system schema (pg_catalog, pg_toast, information_schema...)
// is refused with a DSNError naming search_path, by Open and OpenReadOnly, and nothing is
// created there. information_schema used to receive the queue's 14 tables.
func TestSystemSchemasRefused(t *testing.T) {
	ctx := context.Background()
	db := freshDatabase(t)
	for _, sp := range []string{"information_schema", "pg_catalog", "pg_toast", "PG_Catalog,public", `"pg_temp"`, "pg_mine"} {
		dsn := withParam(t, db, "search_path", sp)
		_, err := Open(ctx, dsn, nil)
		var de *DSNError
		if !errors.As(err, &de) || de.Field != "search_path" || !errors.Is(err, ErrInvalidDSN) ||
			!errors.Is(err, work.ErrBackend) || !strings.Contains(err.Error(), "system schema") {
			t.Errorf("Open with search_path %s = %v, want ErrBackend wrapping a DSNError naming search_path", sp, err)
		}
		if _, err := OpenReadOnly(ctx, dsn); !errors.As(err, &de) {
			t.Errorf("OpenReadOnly with search_path %s = %v, want a DSNError", sp, err)
		}
	}
	if got := schemasWithQueues(t, db); len(got) != 0 {
		t.Fatalf("queues were created in %q", got)
	}
}

// Without search_path the queue lives in its own schema, worklog, created when missing; a
// search_path chooses another. Nothing lands in public.
func TestDefaultSchema(t *testing.T) {
	ctx := context.Background()
	db := freshDatabase(t)
	q, err := Open(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	task, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	if got := schemasWithQueues(t, db); !reflect.DeepEqual(got, []string{DefaultSchema}) {
		t.Fatalf("queues in schemas %q, want only %q", got, DefaultSchema)
	}
	if got := queryStrings(t, db, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'`); len(got) != 0 {
		t.Fatalf("tables created in public: %q", got)
	}
	ro, err := OpenReadOnly(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if ro.Schema() != DefaultSchema || mustLastSeq(t, ro) != 1 {
		t.Fatalf("OpenReadOnly without search_path: schema %q", ro.Schema())
	}
	ro.Close()
	e, q2 := openEngine(t, withParam(t, db, "search_path", "jobs"), nil)
	if e.Schema() != "jobs" {
		t.Fatalf("search_path=jobs: schema %q", e.Schema())
	}
	if _, found, err := q2.Session("s").Task(ctx, task.ID); err != nil || found {
		t.Fatalf("the queue in jobs sees worklog's task: %v %v", found, err)
	}
}

// A queue an older version created in public (Open without search_path used to fall back
// to current_schema()) is found when the DSN names it; without search_path, Open refuses to
// start an empty queue in worklog beside it, and says how to name either.
func TestQueueInPublicFoundOnlyByName(t *testing.T) {
	ctx := context.Background()
	db := freshDatabase(t)
	pub := withParam(t, db, "search_path", "public")
	q, err := Open(ctx, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	task, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "old"})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	for name, open := range map[string]func() error{
		"Open": func() error {
			q, err := Open(ctx, db, nil)
			if err == nil {
				q.Close()
			}
			return err
		},
		"OpenReadOnly": func() error {
			s, err := OpenReadOnly(ctx, db)
			if err == nil {
				s.Close()
			}
			return err
		},
	} {
		err := open()
		var de *DSNError
		if !errors.As(err, &de) || de.Field != "search_path" || !strings.Contains(err.Error(), `schema "public" holds one`) ||
			!strings.Contains(err.Error(), "search_path=public") {
			t.Errorf("%s without search_path beside a queue in public = %v, want a DSNError naming public and search_path=public", name, err)
		}
	}
	if got := schemasWithQueues(t, db); !reflect.DeepEqual(got, []string{"public"}) {
		t.Fatalf("queues in schemas %q, want only public", got)
	}
	q, err = Open(ctx, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if got, found, err := q.Session("s").Task(ctx, task.ID); err != nil || !found || got.Kind != "old" {
		t.Fatalf("the queue in public, named: %+v %v %v", got, found, err)
	}
	// Naming worklog starts a new queue beside it.
	q3, err := Open(ctx, withParam(t, db, "search_path", DefaultSchema), nil)
	if err != nil {
		t.Fatal(err)
	}
	q3.Close()
	if q4, err := Open(ctx, db, nil); err != nil {
		t.Fatalf("Open without search_path once worklog holds a queue: %v", err)
	} else {
		q4.Close()
	}
}

func mustLastSeq(t *testing.T, s *Store) uint64 {
	t.Helper()
	n, err := s.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// statement_timeout, lock_timeout and idle_in_transaction_session_timeout set on the
// database (or the role) are the application's: the queue's own connections set what they
// need, so Open, the writer and Verify work. They used to fail Open ("canceling statement due
// to statement timeout": creating the tables takes more than 1 ms).
func TestDatabaseTimeoutsDoNotReachTheQueue(t *testing.T) {
	ctx := context.Background()
	db := freshDatabase(t)
	name := strings.TrimPrefix(mustURL(t, db).Path, "/")
	// On the admin connection, whose session started before: the test's own statements run
	// without the 1 ms bound.
	srv := pgtest.Need(t)
	for _, set := range []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"} {
		if err := srv.Exec("ALTER DATABASE " + name + " SET " + set + " = '1ms'"); err != nil {
			t.Fatal(err)
		}
	}
	dsn := withParam(t, db, "search_path", "q")
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatalf("Open under the database's 1 ms timeouts: %v", err)
	}
	defer q.Close()
	s := q.Session("s")
	for i := 0; i < 20; i++ {
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: strings.Repeat("k", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	if ds, err := q.ClaimDue(ctx, time.Minute, 10); err != nil || len(ds) != 10 {
		t.Fatalf("ClaimDue = %d, %v", len(ds), err)
	}
	mustVerify(t, q)
	ro, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if p, err := ro.Verify(ctx, VerifyOptions{}); err != nil || len(p) != 0 {
		t.Fatalf("read-only Verify = %v, %v", p, err)
	}
	e, _ := openEngine(t, dsn, nil)
	for set, want := range map[string]string{"statement_timeout": "0", "lock_timeout": "0",
		"idle_in_transaction_session_timeout": "1min"} {
		var got string
		if err := e.pool.QueryRow(ctx, "SHOW "+set).Scan(&got); err != nil || got != want {
			t.Errorf("the queue's connections: %s = %q, %v; want %s", set, got, err, want)
		}
	}
}

func mustURL(t *testing.T, dsn string) *url.URL {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
