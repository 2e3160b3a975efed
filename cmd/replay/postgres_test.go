package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// demoEntropy is the entropy `replay demo --seed seed` gives work.Options.Entropy.
func demoEntropy(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return rand.NewChaCha8(s)
}

// postgresDemo builds the demo's history on a new PostgreSQL schema through postgres.Open,
// with the demo's clock and the entropy of --seed 1: the same calls as `replay demo --seed 1`
// made on Pebble, so the same log. It returns the schema's URL.
func postgresDemo(t *testing.T) string {
	t.Helper()
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, &postgres.Options{Entropy: demoEntropy(1)})
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{ctx: ctx, q: q, t0: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)}
	if err := d.script(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return dsn
}

var (
	storeFormat     = regexp.MustCompile(`worklog (store|PostgreSQL) format [^)"]*`)
	storeFormatJSON = regexp.MustCompile(`"format":"[^"]*"`)
)

// sameStore masks what names the store itself (its place, its layout, its size), the only
// parts of an output that may differ between two stores of one log.
func sameStore(s, name string) string {
	// The name as JSON and HTML escape it.
	s = strings.ReplaceAll(s, strings.ReplaceAll(name, "&", `\u0026`), "$STORE")
	s = strings.ReplaceAll(s, strings.ReplaceAll(name, "&", "&amp;"), "$STORE")
	s = diskBytes.ReplaceAllString(normalize(s, name), `"disk_bytes":0`)
	s = storeFormatJSON.ReplaceAllString(s, `"format":"FORMAT"`)
	return storeFormat.ReplaceAllString(s, "FORMAT")
}

// firstDiff is the first line where a and b differ, for a failure message.
func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  pebble:   %s\n  postgres: %s", i+1, x, y)
		}
	}
	return "(equal)"
}

// sameOutputCases are replay's commands over the demo log: every command, text and JSON,
// time travel by sequence and by time, whole store and one session. ids are demoIDs'.
func sameOutputCases(ids map[string]string) [][]string {
	charge := ids["charge-card"]
	return [][]string{
		{"log"}, {"log", "--json", "--show-tokens"},
		{"log", "--session", "checkout-4821"},
		{"log", "--type", "task_claimed,task_settle_rejected", "--type", "wake_ack_rejected"},
		{"log", "--from", "5", "--to", "9"},
		{"log", "--since", "2026-03-02T09:00:40Z", "--until", "2026-03-02T09:00:45Z"},
		{"log", "--task", charge}, {"log", "--wake", ids["redelivered-wake"]},
		{"log", "--task-kind", "summarize"},
		{"log", "--session", "chat-7f3a", "--from", "10", "--to", "40", "--limit", "3"},
		{"log", "--session", "no-such-session"},
		{"state", "--at-seq", "0"}, {"state", "--at-seq", "22", "--no-cache"},
		{"state", "--at-seq", "22", "--json", "--no-cache", "--show-tokens"},
		{"state", "--at", "2026-03-02T09:00:35Z", "--no-cache"},
		{"state", "--no-cache"}, {"state", "--no-cache", "--json", "--show-tokens"},
		{"state", "--session", "checkout-4821", "--at-seq", "30"},
		{"state", "--session", "checkout-4821", "--at", "2026-03-02T09:00:35Z", "--json"},
		{"timeline", "--session", "checkout-4821"}, {"timeline", "--session", "nightly-report-0302"},
		{"timeline", "--session", "chat-7f3a"},
		{"task", charge}, {"task", charge, "--json"}, {"task", ids["export-csv"]},
		{"task", ids["build-report"]}, {"task", ids["redelivered-wake"]}, {"task", "task_unknown"},
		{"verify"}, {"verify", "--json"},
		{"stats"}, {"stats", "--json"},
		{"export"}, {"export", "--show-tokens"},
	}
}

// compareStores runs every case on both stores and fails on any difference but the store's
// name, format and size.
func compareStores(t *testing.T, dir, dsn string, cases [][]string) {
	t.Helper()
	for _, c := range cases {
		args := func(store string) []string { return append([]string{c[0], store}, c[1:]...) }
		a, b := replay(t, args(dir)...), replay(t, args(dsn)...)
		if a.code != b.code {
			t.Errorf("replay %v: exit %d on Pebble, %d on PostgreSQL\nstdout: %s%s\nstderr: %s%s", c, a.code, b.code, a.stdout, b.stdout, a.stderr, b.stderr)
			continue
		}
		if x, y := sameStore(a.stdout, dir), sameStore(b.stdout, dsn); x != y {
			t.Errorf("replay %v: the outputs differ, %s", c, firstDiff(x, y))
		}
		if x, y := sameStore(a.stderr, dir), sameStore(b.stderr, dsn); x != y {
			t.Errorf("replay %v: the errors differ, %s", c, firstDiff(x, y))
		}
	}
}

// TestPostgresSameOutput: the same history, built through the same calls, clock and entropy
// on Pebble (work.Open) and on PostgreSQL (postgres.Open), reads the same through every
// replay command: replay takes a postgres:// URL wherever it takes a store directory.
func TestPostgresSameOutput(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	dsn := postgresDemo(t)
	dir := demoStore(t)
	ids := demoIDs(t, dir)
	if len(ids) < 5 {
		t.Fatalf("demo ids: %v", ids)
	}
	compareStores(t, dir, dsn, sameOutputCases(ids))

	// What names the store names the queue: its schema and format.
	out := mustReplay(t, "stats", dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("(worklog PostgreSQL format %d, schema %s)", postgres.FormatVersion, u.Query().Get("search_path")); !strings.Contains(out, want) {
		t.Errorf("stats of a PostgreSQL queue does not name it %s:\n%s", want, out)
	}
	// The timeline page too.
	pa, pb := filepath.Join(t.TempDir(), "a.html"), filepath.Join(t.TempDir(), "b.html")
	mustReplay(t, "timeline", dir, "--session", "checkout-4821", "--html", pa)
	mustReplay(t, "timeline", dsn, "--session", "checkout-4821", "--html", pb)
	ha, _ := os.ReadFile(pa)
	hb, _ := os.ReadFile(pb)
	if x, y := sameStore(string(ha), dir), sameStore(string(hb), dsn); x != y {
		t.Errorf("timeline --html differs: %s", firstDiff(x, y))
	}
}

// exportWire runs replay export --wire on store and returns the wire log.
func exportWire(t *testing.T, store string) []byte {
	t.Helper()
	return []byte(mustReplay(t, "export", store, "--wire"))
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestExportImportBetweenBackends moves the demo log Pebble -> PostgreSQL -> Pebble through
// export --wire and import. Each import folds the log with the same projection.Apply through
// its store's own writer; each store verifies clean (import checks), exports the same bytes
// and reads the same through every replay command, lease tokens included; and the queues
// opened on the imported stores go on alike: the same claims, fenced by the same leases.
func TestExportImportBetweenBackends(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	src := demoStore(t)
	ids := demoIDs(t, src)
	wire := exportWire(t, src)
	file := writeFile(t, "demo.wlog", wire)
	n := strings.Count(mustReplay(t, "export", src), "\n") // the demo's events
	okLine := fmt.Sprintf("ok. %d events (seq 1..%d) appended and folded", n, n)

	dsn := pgtest.Schema(t)
	out := mustReplay(t, "import", file, dsn)
	if !strings.Contains(out, okLine) {
		t.Errorf("import into PostgreSQL says:\n%s", out)
	}
	back := writeFile(t, "pg.wlog", exportWire(t, dsn))
	if b, _ := os.ReadFile(back); string(b) != string(wire) {
		t.Fatalf("the log exported from PostgreSQL (%d bytes) differs from the one imported (%d bytes)", len(b), len(wire))
	}
	dst := filepath.Join(t.TempDir(), "back")
	if out := mustReplay(t, "import", back, dst); !strings.Contains(out, okLine) {
		t.Errorf("import into Pebble says:\n%s", out)
	}
	if again := exportWire(t, dst); string(again) != string(wire) {
		t.Fatalf("the log exported from the re-imported Pebble store differs from the original")
	}
	cases := sameOutputCases(ids)
	compareStores(t, src, dsn, cases)
	compareStores(t, src, dst, cases)

	// FILE - reads the wire log from standard input (export --wire | import - DEST).
	piped := filepath.Join(t.TempDir(), "piped")
	cmd := exec.Command(replayBin, "import", "-", piped)
	cmd.Stdin = bytes.NewReader(wire)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), okLine) {
		t.Errorf("import - from standard input: %v\n%s", err, out)
	} else if string(exportWire(t, piped)) != string(wire) {
		t.Errorf("the store imported from standard input exports another log")
	}

	// The queues on the three stores go on alike: before the translate task's lease expires
	// nothing is claimable, after it the task is claimed again (attempt 2) with the summary
	// that came due; with the same entropy, the same deliveries, tokens included; finishing
	// them works on each, and each verifies.
	ctx := context.Background()
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	type claimed struct {
		ID, Kind string
		Attempt  uint32
		Expires  time.Time
		Token    string
	}
	run := func(q *work.Queue) []claimed {
		t.Helper()
		defer q.Close()
		if ds, err := q.ClaimDueAt(ctx, t0.Add(206*time.Second), time.Minute, 10); err != nil || len(ds) != 0 {
			t.Fatalf("claim while the lease holds: %v, %v", ds, err)
		}
		ds, err := q.ClaimDueAt(ctx, t0.Add(31*time.Minute), time.Minute, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []claimed
		for _, d := range ds {
			got = append(got, claimed{d.Task.ID, d.Task.Kind, d.Attempt, d.LeaseExpiresAt, d.LeaseToken()})
			if _, err := q.FinishAt(ctx, d, work.Success(json.RawMessage(`{"ok":true}`)), t0.Add(32*time.Minute)); err != nil {
				t.Errorf("finish %s: %v", d.Task.ID, err)
			}
		}
		if err := q.Verify(ctx); err != nil {
			t.Errorf("verify: %v", err)
		}
		return got
	}
	openPebble := func(dir string) *work.Queue {
		q, err := work.Open(dir, &work.Options{Entropy: demoEntropy(7)})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	pq, err := postgres.Open(ctx, dsn, &postgres.Options{Entropy: demoEntropy(7)})
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := run(openPebble(src)), run(pq), run(openPebble(dst))
	if len(a) != 2 || a[0].Kind != "translate" || a[0].Attempt != 2 {
		t.Errorf("claims after the lease expired, on the original store: %+v", a)
	}
	if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(a, c) {
		t.Errorf("the stores claim differently:\noriginal    %+v\npostgres    %+v\nre-imported %+v", a, b, c)
	}
}

// TestImportRefusals: import writes only into an empty store, and only a complete wire log;
// each refusal says why, names the store or file, and writes nothing.
func TestImportRefusals(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	src := demoStore(t)
	wire := exportWire(t, src)
	file := writeFile(t, "demo.wlog", wire)
	dsn := pgtest.Schema(t)
	mustReplay(t, "import", file, dsn)

	refused := func(what, want string, args ...string) {
		t.Helper()
		r := replay(t, args...)
		if r.code != exitError || !strings.Contains(r.stderr, want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 and %q", what, r.code, r.stderr, want)
		}
	}
	n := strings.Count(mustReplay(t, "export", src), "\n")
	holds := fmt.Sprintf(" already holds %d events (seq 1..%d)", n, n)
	refused("into a non-empty Pebble store", src+holds+": import loads a log only into an empty store",
		"import", file, src)
	refused("into a non-empty PostgreSQL queue", dsn+holds, "import", file, dsn)
	if out := mustReplay(t, "verify", src); !strings.Contains(out, fmt.Sprintf("ok. The log has %d events", n)) {
		t.Errorf("the refused import changed the store:\n%s", out)
	}

	truncated := writeFile(t, "cut.wlog", wire[:len(wire)-3])
	empty := pgtest.Schema(t)
	refused("a truncated file into PostgreSQL", "without its end record (truncated)", "import", truncated, empty)
	dir := filepath.Join(t.TempDir(), "new")
	refused("a truncated file into Pebble", "without its end record (truncated)", "import", truncated, dir)
	if out := mustReplay(t, "verify", dir); !strings.Contains(out, "The log is empty") {
		t.Errorf("a truncated import of fewer events than one group left:\n%s", out)
	}
	jsonl := writeFile(t, "demo.jsonl", []byte(mustReplay(t, "export", src)))
	refused("JSON lines", "does not start with \"worklog wire log 1\"", "import", jsonl, filepath.Join(t.TempDir(), "j"))
	damaged := append([]byte(nil), wire...)
	damaged[len(wireMagic)+10] ^= 0xff
	refused("a damaged event", "seq 1", "import", writeFile(t, "bad.wlog", damaged), filepath.Join(t.TempDir(), "d"))
	refused("--wire with --from", "--wire exports the whole log", "export", src, "--wire", "--from", "3")
}

// TestPostgresSessionOrder: sessions are listed in the order of Pebble's per-session index
// (shorter ids first, then byte order), not in PostgreSQL's byte order, so that the lists
// replay prints are the same on both.
func TestPostgresSessionOrder(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	fill := func(q *work.Queue) {
		t.Helper()
		defer q.Close()
		for i, s := range []string{"b", "aa", "c", "ab", "a"} {
			if _, err := q.Session(s).SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage(`1`)}, t0.Add(time.Duration(i)*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := filepath.Join(t.TempDir(), "s")
	q, err := work.Open(dir, &work.Options{Entropy: demoEntropy(3)})
	if err != nil {
		t.Fatal(err)
	}
	fill(q)
	dsn := pgtest.Schema(t)
	pq, err := postgres.Open(ctx, dsn, &postgres.Options{Entropy: demoEntropy(3)})
	if err != nil {
		t.Fatal(err)
	}
	fill(pq)
	compareStores(t, dir, dsn, [][]string{{"log", "--session", "nope"}, {"stats"}, {"state", "--session", "nope"}})
	r := replay(t, "log", dsn, "--session", "nope")
	if !strings.Contains(r.stderr, "a, b, c, aa, ab") {
		t.Errorf("sessions not in the per-session index's order: %s", r.stderr)
	}
}

// TestPostgresURLPasswordMasked: replay never prints a URL's password; it names the queue
// with xxxxx in its place (here in the error of a server that does not answer).
func TestPostgresURLPasswordMasked(t *testing.T) {
	t.Parallel()
	emptyLog := writeFile(t, "empty.wlog", []byte(wireMagic+"\x00\x00"))
	for _, args := range [][]string{
		{"log", "postgres://worker:s3cret-pw@127.0.0.1:1/jobs?search_path=q&connect_timeout=5"},
		{"import", emptyLog, "postgresql://worker:s3cret-pw@127.0.0.1:1/jobs?search_path=q&connect_timeout=5"},
	} {
		r := replay(t, args...)
		if r.code != exitError || strings.Contains(r.stderr+r.stdout, "s3cret-pw") || !strings.Contains(r.stderr, "worker:xxxxx@127.0.0.1:1") {
			t.Errorf("replay %v: exit %d, stderr %q: want exit 2 naming the queue with its password masked", args[0], r.code, r.stderr)
		}
	}
}

// pruneBoth prunes the demo history on the Pebble store dir and the PostgreSQL queue dsn
// with the same before, and checks both removed the same.
func pruneBoth(t *testing.T, dir, dsn string, before time.Time) work.PruneResult {
	t.Helper()
	ctx := context.Background()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := q.Prune(ctx, before)
	if cerr := q.Close(); err != nil || cerr != nil {
		t.Fatalf("prune on Pebble: %v, %v", err, cerr)
	}
	pq, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pq.Prune(ctx, before)
	if cerr := pq.Close(); err != nil || cerr != nil {
		t.Fatalf("prune on PostgreSQL: %v, %v", err, cerr)
	}
	if a != b || a.Events == 0 {
		t.Fatalf("prune before %s removed %+v on Pebble, %+v on PostgreSQL", before, a, b)
	}
	return a
}

// TestPostgresSameOutputPruned: the demo history pruned the same way on Pebble and on
// PostgreSQL reads the same through every replay command. Pruning before 09:01:10 removes
// every subject but the send-receipt task (seq 3), the second summarize, the translate task
// and its requested wake: seqs 1-2 and 4-36 are pruned, history begins at seq 3, and the
// cases' time travel lands before the horizon (refused, saying where history begins), inside
// the middle range (the fold steps over it) and after it.
func TestPostgresSameOutputPruned(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	dsn := postgresDemo(t)
	dir := demoStore(t)
	ids := demoIDs(t, dir)
	pruneBoth(t, dir, dsn, time.Date(2026, 3, 2, 9, 1, 10, 0, time.UTC))

	cases := append(sameOutputCases(ids),
		[]string{"state", "--at-seq", "2"}, []string{"state", "--at", "2026-03-02T09:00:00Z"},
		[]string{"state", "--at-seq", "3", "--json"}, []string{"log", "--from", "30", "--to", "40", "--json"},
		[]string{"stats", "--json"})
	compareStores(t, dir, dsn, cases)

	// The outputs agree because both read the ranges: the marks, the refusal and the stats.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"log"}, 0, "seqs 4–36 pruned"},
		{[]string{"state", "--at-seq", "2"}, exitError, "history begins at seq 3"},
		{[]string{"stats"}, 0, "35 events in 2 ranges; history begins at seq 3"},
		{[]string{"verify"}, 0, "ok"},
	} {
		r := replay(t, append([]string{c.args[0], dsn}, c.args[1:]...)...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("replay %v on PostgreSQL: exit %d, want %d and %q:\n%s%s", c.args, r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
}

// prunedRangesOf reads store's pruned ranges from log --json's pruned records.
func prunedRangesOf(t *testing.T, store string) []projection.SeqRange {
	t.Helper()
	var out []projection.SeqRange
	for _, l := range strings.Split(strings.TrimSpace(mustReplay(t, "log", "--json", store)), "\n") {
		var m struct {
			Record   string
			From, To uint64
		}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log --json line %q: %v", l, err)
		}
		if m.Record == "pruned" {
			out = append(out, projection.SeqRange{From: m.From, To: m.To})
		}
	}
	return out
}

// TestExportImportPruned moves a pruned log Pebble -> PostgreSQL -> Pebble. The demo history
// pruned before 09:05 keeps 7 events and has three pruned ranges: at the start (1-36), in
// the middle (38-39) and at the end (46-47, the newest events). export --wire writes them
// in their places (version 2), the same bytes from either backend; each import records them
// as pruned, verifies clean and exports the same bytes again; every replay command reads the
// same on all the stores; and a later prune on each imported store coalesces with the
// imported ranges as it does on the store the log came from.
func TestExportImportPruned(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	src := demoStore(t)
	srcPG := postgresDemo(t)
	ids := demoIDs(t, src)
	pruneBoth(t, src, srcPG, time.Date(2026, 3, 2, 9, 5, 0, 0, time.UTC))
	want := []projection.SeqRange{{From: 1, To: 36}, {From: 38, To: 39}, {From: 46, To: 47}}
	if got := prunedRangesOf(t, src); !reflect.DeepEqual(got, want) {
		t.Fatalf("pruned ranges of the source: %v, want %v", got, want)
	}

	wire := exportWire(t, src)
	if !bytes.HasPrefix(wire, []byte(wireMagic2)) {
		t.Fatalf("the export of a pruned store starts with %q, want version 2", wire[:min(len(wire), 20)])
	}
	if pg := exportWire(t, srcPG); !bytes.Equal(pg, wire) {
		t.Fatalf("the same pruned history exports %d bytes from PostgreSQL, %d from Pebble", len(pg), len(wire))
	}
	file := writeFile(t, "pruned.wlog", wire)
	okLine := "ok. 7 events (seq 1..47, and 3 pruned ranges of 40 seqs recorded as pruned) appended and folded"

	dsn := pgtest.Schema(t)
	if out := mustReplay(t, "import", file, dsn); !strings.Contains(out, okLine) {
		t.Errorf("import into PostgreSQL says:\n%s", out)
	}
	back := exportWire(t, dsn)
	if !bytes.Equal(back, wire) {
		t.Fatalf("the log exported from PostgreSQL (%d bytes) differs from the one imported (%d bytes)", len(back), len(wire))
	}
	dst := filepath.Join(t.TempDir(), "back")
	if out := mustReplay(t, "import", writeFile(t, "pg.wlog", back), dst); !strings.Contains(out, okLine) {
		t.Errorf("import into Pebble says:\n%s", out)
	}
	if again := exportWire(t, dst); !bytes.Equal(again, wire) {
		t.Fatalf("the log exported from the re-imported Pebble store differs from the original")
	}
	for _, s := range []string{dsn, dst} {
		if got := prunedRangesOf(t, s); !reflect.DeepEqual(got, want) {
			t.Errorf("pruned ranges of %s: %v, want %v", s, got, want)
		}
	}
	cases := append(sameOutputCases(ids), []string{"state", "--at-seq", "36"}, []string{"state", "--at-seq", "37", "--json"},
		[]string{"log", "--from", "40", "--to", "47"}, []string{"stats", "--json"})
	compareStores(t, src, dsn, cases)
	// The Pebble copy exports the same bytes as the source: fewer cases suffice.
	compareStores(t, src, dst, [][]string{{"log", "--json", "--show-tokens"}, {"state", "--no-cache", "--json", "--show-tokens"},
		{"state", "--at-seq", "37"}, {"state", "--at-seq", "36"}, {"timeline", "--session", "chat-7f3a"}, {"task", ids["translate"]},
		{"stats", "--json"}, {"verify"}})

	// Later prunes coalesce with the imported ranges: the requested wake (seq 42) is claimed
	// (48) and acknowledged (49), then pruned: 42 alone, and 48-49 joins the imported 46-47.
	ctx := context.Background()
	goOn := func(q *work.Queue) {
		t.Helper()
		defer q.Close()
		at := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
		ws, err := q.ClaimWakesAt(ctx, at, time.Minute, 10)
		if err != nil || len(ws) != 1 {
			t.Fatalf("claim wakes: %v, %v", ws, err)
		}
		if err := q.AckWakeAt(ctx, ws[0], at.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if r, err := q.Prune(ctx, at.Add(time.Hour)); err != nil || r != (work.PruneResult{Wakes: 1, Events: 3}) {
			t.Fatalf("prune after the import: %+v, %v", r, err)
		}
	}
	openPebble := func(dir string) *work.Queue {
		q, err := work.Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	pq, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	goOn(openPebble(src))
	goOn(pq)
	goOn(openPebble(dst))
	want = []projection.SeqRange{{From: 1, To: 36}, {From: 38, To: 39}, {From: 42, To: 42}, {From: 46, To: 49}}
	for _, s := range []string{src, dsn, dst} {
		if got := prunedRangesOf(t, s); !reflect.DeepEqual(got, want) {
			t.Errorf("pruned ranges of %s after a later prune: %v, want %v", s, got, want)
		}
		if out := mustReplay(t, "verify", s); !strings.Contains(out, "ok") {
			t.Errorf("verify of %s after a later prune:\n%s", s, out)
		}
	}
	compareStores(t, src, dst, [][]string{{"log"}, {"stats"}, {"state", "--no-cache"}})
}
