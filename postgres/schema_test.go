package postgres

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

func execSQL(t *testing.T, sql string) {
	t.Helper()
	if err := pgtest.Need(t).Exec(sql); err != nil {
		t.Fatal(err)
	}
}

func schemaName(dsn string) string {
	i := strings.Index(dsn, "search_path=")
	s := dsn[i+len("search_path="):]
	if j := strings.IndexByte(s, '&'); j >= 0 {
		s = s[:j]
	}
	return s
}

// A schema of a newer format is refused, naming the schema and the format, and nothing in
// it changes; one holding only part of worklog's tables is ErrNotAQueue.
func TestOpenRefusesNewerFormatAndPartialSchemas(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	s := schemaName(dsn)
	execSQL(t, "UPDATE "+s+".worklog_meta SET value = '99' WHERE key = 'format'")
	_, err = Open(ctx, dsn, nil)
	if !errors.Is(err, work.ErrBackend) || !errors.Is(err, ErrFormatTooNew) ||
		!strings.Contains(err.Error(), s) || !strings.Contains(err.Error(), "format 99") ||
		!strings.Contains(err.Error(), fmt.Sprintf("this build reads format %d", FormatVersion)) {
		t.Fatalf("Open of a format-99 schema = %v, want ErrFormatTooNew naming %s, its format and this build's", err, s)
	}
	if _, err := OpenReadOnly(ctx, dsn); !errors.Is(err, ErrFormatTooNew) || !strings.Contains(err.Error(), "format 99") ||
		!strings.Contains(err.Error(), fmt.Sprintf("this build reads format %d", FormatVersion)) {
		t.Fatalf("OpenReadOnly of a format-99 schema = %v, want ErrFormatTooNew naming its format and this build's", err)
	}

	partial := pgtest.Schema(t)
	execSQL(t, "CREATE TABLE "+schemaName(partial)+".events (seq bigint)")
	if _, err := Open(ctx, partial, nil); !errors.Is(err, ErrNotAQueue) || !strings.Contains(err.Error(), schemaName(partial)) {
		t.Fatalf("Open of a schema holding one of worklog's tables = %v, want ErrNotAQueue naming it", err)
	}
	if _, err := OpenReadOnly(ctx, pgtest.Schema(t)); !errors.Is(err, ErrNotAQueue) {
		t.Fatalf("OpenReadOnly of an empty schema = %v, want ErrNotAQueue", err)
	}
	if _, err := Open(ctx, dsn, &Options{MaxConns: 1}); !errors.Is(err, work.ErrInvalidOptions) {
		t.Fatalf("Open with MaxConns 1 = %v, want ErrInvalidOptions", err)
	}
}

// Two queues in two schemas of one database share nothing; a schema the search_path names
// that does not exist yet is created.
func TestSchemasAreSeparateQueues(t *testing.T) {
	ctx := context.Background()
	a := pgtest.Schema(t)
	b := pgtest.WithSearchPath(a, "w_new_"+strings.TrimPrefix(schemaName(a), "t_"))
	t.Cleanup(func() { pgtest.Need(t).Exec("DROP SCHEMA IF EXISTS " + schemaName(b) + " CASCADE") })
	qa, err := Open(ctx, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	qb, err := Open(ctx, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	task, err := qa.Session("s").Submit(ctx, work.TaskRequest{Kind: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := qb.Session("s").Task(ctx, task.ID); err != nil || found {
		t.Fatalf("queue b sees queue a's task: %v %v", found, err)
	}
	if ds, err := qb.ClaimDue(ctx, time.Minute, 10); err != nil || len(ds) != 0 {
		t.Fatalf("queue b claimed %d of queue a's tasks (%v)", len(ds), err)
	}
}

// OpenReadOnly reads what a queue wrote, verifies it, and its connections refuse writes.
func TestOpenReadOnly(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	s := q.Session("s")
	task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(`{"a":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Session("other").Wake(ctx, work.WakeRequest{}); err != nil {
		t.Fatal(err)
	}
	ro, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if n, err := ro.LastSeq(ctx); err != nil || n != 2 {
		t.Fatalf("LastSeq = %d, %v; want 2", n, err)
	}
	var types []events.Type
	if err := ro.ReadLog(ctx, 0, func(ev events.Event) error { types = append(types, ev.Type()); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(types) != 2 || types[0] != events.TypeTaskSubmitted || types[1] != events.TypeWakeRecorded {
		t.Fatalf("ReadLog: %v", types)
	}
	var sessions []string
	ro.Sessions(ctx, func(s string) error { sessions = append(sessions, s); return nil })
	if strings.Join(sessions, ",") != "s,other" { // source.SessionOrder: shorter first
		t.Fatalf("Sessions: %v", sessions)
	}
	var got *projection.Task
	if err := ro.View(ctx, func(r projection.Reader) error { got, err = r.Task(task.ID); return err }); err != nil {
		t.Fatal(err)
	}
	if got == nil || string(got.Input) != `{"a":1}` {
		t.Fatalf("View Task = %+v", got)
	}
	if p, err := ro.Verify(ctx, VerifyOptions{}); err != nil || len(p) != 0 {
		t.Fatalf("Verify = %v, %v", p, err)
	}
	if _, err := ro.e.pool.Exec(ctx, "DELETE FROM events"); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("a write on the read-only store's connection: %v, want the server's read-only refusal", err)
	}
}

// Another process's commit wakes this one's watcher (LISTEN/NOTIFY).
func TestWatcherSeesOtherQueuesCommits(t *testing.T) {
	t.Parallel() // see TestMain
	dsn := pgtest.Schema(t)
	ea, _ := openEngine(t, dsn, nil)
	_, qb := openEngine(t, dsn, nil)
	ctx := context.Background()
	// Drain the signal of the listener's (re)connection, then wait for the one of b's commit.
	deadline := time.After(10 * time.Second)
	for {
		if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ea.Changed():
		case <-deadline:
			t.Fatal("no change signal from the other queue's commits")
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	// Now that it listens: one commit of b, one signal of a.
	for len(ea.Changed()) > 0 {
		<-ea.Changed()
	}
	time.Sleep(100 * time.Millisecond)
	for len(ea.Changed()) > 0 {
		<-ea.Changed()
	}
	if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ea.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("the listening queue was not signalled of the other's commit")
	}
}

// The core module's users do not compile pgx unless they import this package.
func TestWorkDoesNotDependOnPgx(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/worklog/worklog/work").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "jackc/") || p == "github.com/worklog/worklog/postgres" {
			t.Errorf("package work depends on %s", p)
		}
	}
}
