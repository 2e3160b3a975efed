package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// rawUpdate opens a closed store with Pebble directly, bypassing worklog, and lets fn damage
// it. The key layout is pebblelog/keys.go's: 't'+task id for a task record, 'e'+seq (8 bytes,
// big-endian) for an event.
func rawUpdate(t *testing.T, dir string, fn func(db *pebble.DB)) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	fn(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func TestVerifyDamagedProjection(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	charge := demoIDs(t, dir)["charge-card"]
	rawUpdate(t, dir, func(db *pebble.DB) {
		key := append([]byte{'t'}, charge...)
		v, closer, err := db.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		task, err := recordcodec.DecodeTask(key, v)
		if err != nil {
			t.Fatal(err)
		}
		closer.Close()
		task.Attempts = 7 // the log says 2
		if err := db.Set(key, recordcodec.AppendTask(nil, task), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	})
	r := replay(t, "verify", dir)
	if r.code != 1 {
		t.Fatalf("verify of a damaged store: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	want := fmt.Sprintf("task %s: field Attempts: 7 vs 2 (stored vs rebuilt)", charge)
	if !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "FAILED, 1 problem") {
		t.Errorf("verify does not name the task and field; want %q in:\n%s", want, r.stdout)
	}
	var j verifyResult
	r = replay(t, "verify", dir, "--json")
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil || r.code != 1 || j.OK || len(j.Problems) != 1 {
		t.Errorf("verify --json: exit %d, %+v, %v", r.code, j, err)
	}
	// task explains from the log, and notices the stored record disagrees.
	out := mustReplay(t, "task", dir, charge)
	if !strings.Contains(out, "field Attempts: 7 vs 2 (stored vs folded)") {
		t.Errorf("task does not report the damaged record:\n%s", out)
	}
}

func TestCorruptEvent(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	const seq = 7
	rawUpdate(t, dir, func(db *pebble.DB) {
		key := binary.BigEndian.AppendUint64([]byte{'e'}, seq)
		v, closer, err := db.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		b := bytes.Clone(v)
		closer.Close()
		b[len(b)/2] ^= 0x5a
		if err := db.Set(key, b, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	})
	r := replay(t, "verify", dir)
	if r.code != 1 || !strings.Contains(r.stdout, "corrupt event at seq 7") {
		t.Errorf("verify: exit %d, want 1 naming seq 7:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, args := range [][]string{{"log", dir}, {"export", dir}, {"state", dir, "--no-cache"}, {"log", dir, "--session", "chat-7f3a"}} {
		r := replay(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "corrupt log") || !strings.Contains(r.stderr, "at seq 7") ||
			strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, want 2 and one line naming seq 7; stderr:\n%s", args, r.code, r.stderr)
		}
	}
	// The events before the damage are still printed.
	if r := replay(t, "log", dir); !strings.Contains(r.stdout, "task_claimed") {
		t.Errorf("log printed nothing before the corrupt event:\n%s", r.stdout)
	}
}

func TestLiveStoreAndCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "live")
	q, err := work.Open(dir, &work.Options{NoInspect: true}) // without its endpoint (inspect_test.go reads through it)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := q.Session("s1").SubmitAt(ctx, work.TaskRequest{Kind: "k"}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ClaimDueAt(ctx, now, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"log", dir}, {"verify", dir}, {"state", dir, "--at-seq", "1"}} {
		r := replay(t, args...)
		if r.code != 2 {
			t.Fatalf("%v on a live store: exit %d, want 2", args, r.code)
		}
		for _, want := range []string{dir + " is open in a running process", "it serves no inspection endpoint (work.Options.NoInspect is set)", "q.Checkpoint(", "work.Queue.Checkpoint", "replay verify /path/to/copy"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("%v: the message lacks %q:\n%s", args, want, r.stderr)
			}
		}
		for _, raw := range []string{"resource temporarily unavailable", "lock held", "pebblelog:"} {
			if strings.Contains(r.stderr, raw) {
				t.Errorf("%v: the message shows the raw error (%q):\n%s", args, raw, r.stderr)
			}
		}
	}
	// The advice works: a checkpoint taken from inside the process opens while it runs.
	cp := filepath.Join(t.TempDir(), "copy")
	if err := q.Checkpoint(cp); err != nil {
		t.Fatal(err)
	}
	if out := mustReplay(t, "verify", cp); !strings.Contains(out, "ok. The log has 2 events") {
		t.Errorf("verify of the checkpoint:\n%s", out)
	}
	if out := mustReplay(t, "log", cp, "--type", "task_claimed"); !strings.Contains(out, "attempt=1") {
		t.Errorf("log of the checkpoint:\n%s", out)
	}
}

func TestStoreErrors(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	notStore := filepath.Join(tmp, "photos")
	os.MkdirAll(notStore, 0o755)
	os.WriteFile(filepath.Join(notStore, "cat.jpg"), []byte("meow"), 0o644)
	empty := filepath.Join(tmp, "empty")
	os.MkdirAll(empty, 0o755)
	file := filepath.Join(tmp, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	newer := demoStore(t)
	os.WriteFile(filepath.Join(newer, "WORKLOG"), []byte("worklog store format 99\n"), 0o644)
	older := filepath.Join(tmp, "older") // a store of an earlier development format
	if err := os.CopyFS(older, os.DirFS(filepath.Join("..", "..", "pebblelog", "testdata", "format4-store"))); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		dir  string
		want string
	}{
		{filepath.Join(tmp, "missing"), "missing: no such directory"},
		{notStore, "photos is not a worklog store: the directory is not empty and has no WORKLOG file (found cat.jpg)"},
		{empty, "empty is not a worklog store: the directory is empty"},
		{file, "file is a file, not a worklog store directory"},
		{newer, fmt.Sprintf("was written by a newer worklog: store format 99, this build reads up to %d", pebblelog.FormatVersion)},
		{older, "was written by an earlier development build of worklog: store format 4, an earlier development format: this build reads formats 7 and 8; " +
			"move its data: with an earlier worklog build that reads it (up to commit 1a968ef), run `replay export " + older + " --wire > store.wlog`; " +
			"then, with this build, `replay import store.wlog NEWDIR`"},
	}
	for _, c := range cases {
		cmds := [][]string{{"log"}, {"verify"}}
		if c.dir == cases[0].dir { // every command opens stores the same way: check each once
			cmds = [][]string{{"log"}, {"state"}, {"verify"}, {"stats"}, {"export"}, {"timeline", "--session", "x"}, {"task", "task_x"}}
		}
		for _, args := range cmds {
			cmd := args[0]
			r := replay(t, append([]string{cmd, c.dir}, args[1:]...)...)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Errorf("%s %s: exit %d, want 2 and one line with %q; stderr:\n%s", cmd, c.dir, r.code, c.want, r.stderr)
			}
		}
	}
	// Nothing was created in the directories that are not stores.
	for _, d := range []string{notStore, empty} {
		names, _ := os.ReadDir(d)
		if d == empty && len(names) != 0 || d == notStore && len(names) != 1 {
			t.Errorf("replay wrote into %s: %v", d, names)
		}
	}
	// Usage mistakes.
	dir := demoStore(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"log"}, "log needs DIR"},
		{[]string{"log", dir, "extra"}, "log takes 1 argument"},
		{[]string{"log", dir, "--type", "claimed"}, `--type: "claimed" is not an event type`},
		{[]string{"log", dir, "--since", "yesterday"}, "not an RFC 3339 time"},
		{[]string{"log", dir, "--from", "9", "--to", "3"}, "--to 3 is before --from 9"},
		{[]string{"state", dir, "--at-seq", "3", "--at", "2026-01-01T00:00:00Z"}, "not both"},
		{[]string{"state", dir, "--at-seq", "1000"}, "past the end of the log"},
		{[]string{"state", dir, "--session", "nobody"}, `session "nobody" has no events`},
		{[]string{"log", dir, "--session", "nobody"}, `session "nobody" has no events`},
		{[]string{"state", dir, "--cache-dir", filepath.Join(dir, "cache")}, "inside the store"},
		{[]string{"timeline", dir}, "timeline needs --session; the sessions of"},
		{[]string{"timeline", dir, "--session", "chat-7f3a", "--html", filepath.Join(dir, "t.html")}, "inside the store"},
		{[]string{"task", dir, "task_nope"}, `no task or wake "task_nope"`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"log", dir, "--frob"}, "unknown flag: --frob"},
	} {
		r := replay(t, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, want 2 with %q; stderr:\n%s", c.args, r.code, c.want, r.stderr)
		}
	}
}

// TestTokensRedacted checks that no output shows a lease token unless --show-tokens.
func TestTokensRedacted(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	var tokens []string
	sc := bufio.NewScanner(strings.NewReader(mustReplay(t, "export", dir, "--show-tokens")))
	for sc.Scan() {
		var e eventJSON
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		if e.LeaseToken != "" {
			tokens = append(tokens, e.LeaseToken)
		}
	}
	if len(tokens) < 10 {
		t.Fatalf("export --show-tokens shows %d tokens", len(tokens))
	}
	charge := demoIDs(t, dir)["charge-card"]
	page := filepath.Join(t.TempDir(), "p.html")
	var all strings.Builder
	for _, args := range [][]string{
		{"log", dir}, {"log", dir, "--json"}, {"export", dir},
		{"state", dir, "--at-seq", "24", "--json"}, {"state", dir, "--at-seq", "24"},
		{"state", dir, "--session", "checkout-4821", "--at-seq", "24", "--json"},
		{"task", dir, charge}, {"task", dir, charge, "--json"},
		{"timeline", dir, "--session", "checkout-4821", "--html", page},
		{"stats", dir, "--json"}, {"verify", dir}, {"demo", filepath.Join(t.TempDir(), "d"), "--seed", "1"},
	} {
		all.WriteString(mustReplay(t, args...))
	}
	b, _ := os.ReadFile(page)
	all.Write(b)
	for _, tok := range tokens {
		if strings.Contains(all.String(), tok) {
			t.Fatalf("a lease token is printed without --show-tokens: %s", tok)
		}
	}
	if !strings.Contains(all.String(), "[redacted]") {
		t.Error("no [redacted] in the output")
	}
	if out := mustReplay(t, "log", dir, "--show-tokens"); !strings.Contains(out, tokens[0]) {
		t.Error("--show-tokens does not show tokens")
	}
}

// dirState maps every file of a directory to a hash of its content.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = fmt.Sprintf("%x", sha256.Sum256(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadOnly runs every read command and checks that the store's files are byte for byte
// what they were; only worklog's lock file may appear.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	before := dirState(t, dir)
	charge := demoIDs(t, dir)["charge-card"]
	cache := t.TempDir()
	for _, args := range [][]string{
		{"log", dir}, {"export", dir}, {"export", dir, "--wire"}, {"verify", dir}, {"stats", dir}, {"task", dir, charge},
		{"timeline", dir, "--session", "checkout-4821"},
		{"state", dir, "--at-seq", "30", "--cache-dir", cache, "--snapshot-every", "10"},
		{"state", dir, "--at-seq", "30", "--cache-dir", cache, "--snapshot-every", "10"},
		{"state", dir, "--at", "2026-03-02T09:00:35Z"},
		{"state", dir, "--session", "chat-7f3a"},
	} {
		mustReplay(t, args...)
	}
	after := dirState(t, dir)
	delete(after, "WORKLOG.lock")
	delete(before, "WORKLOG.lock")
	for name, h := range before {
		if after[name] != h {
			t.Errorf("replay changed %s", name)
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("replay created %s in the store", name)
		}
	}
	segs, _ := filepath.Glob(filepath.Join(cache, "*", "k10", "seg-*.snap"))
	if len(segs) != 3 {
		t.Errorf("snapshot segments in the cache: %v, want 3 (seq 10, 20, 30)", segs)
	}
}

// buildStore makes a store through work.Open: sessions submit, claim, crash, finish, cancel
// and wake, steps times; seed fixes the ids. The first operation is the same for every seed
// and prefix, so stores built from the same seed share their first event.
func buildStore(t *testing.T, dir string, seed byte, steps int) {
	t.Helper()
	ctx := context.Background()
	q, err := work.Open(dir, &work.Options{Entropy: rand.NewChaCha8([32]byte{seed}), Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	t0 := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(steps)))
	var held []work.TaskDelivery
	for i := 0; i < steps; i++ {
		now := t0.Add(time.Duration(i) * time.Second)
		s := q.Session(fmt.Sprintf("s%d", i%5))
		var err error
		switch op := rng.IntN(10); {
		case i == 0 || op < 4:
			_, err = s.SubmitAt(ctx, work.TaskRequest{Kind: fmt.Sprintf("k%d", op%3),
				Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), Wake: work.WakePolicy(op % 2)}, now)
		case op < 6:
			var ds []work.TaskDelivery
			ds, err = q.ClaimDueAt(ctx, now, 5*time.Second, 3)
			held = append(held, ds...)
		case op < 8 && len(held) > 0:
			// The newest delivery, mostly: the oldest have usually lost their lease by now,
			// and a settlement of them would always be stale.
			i := len(held) - 1
			if rng.IntN(4) == 0 {
				i = 0
			}
			d := held[i]
			held = slices.Delete(held, i, i+1)
			switch rng.IntN(4) {
			case 0: // a heartbeat: the worker keeps the task
				var nd work.TaskDelivery
				if nd, err = q.ExtendAt(ctx, d, 5*time.Second, now); err == nil {
					held = append(held, nd)
				}
			case 1: // given back, due again at once or a little later
				_, err = q.ReleaseAt(ctx, d, work.ReleaseRequest{RunAt: now.Add(time.Duration(rng.IntN(3)) * time.Second),
					Reason: "retry"}, now)
			default:
				_, err = q.FinishAt(ctx, d, work.Success(nil), now)
			}
			if errors.Is(err, work.ErrStaleDelivery) {
				err = nil // redelivered meanwhile: a stale finish is recorded, the others change nothing
			}
		case op == 8:
			_, err = s.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`1`)}, now)
		default:
			var ws []work.WakeDelivery
			ws, err = q.ClaimWakesAt(ctx, now, 3*time.Second, 2)
			for _, w := range ws {
				if rng.IntN(2) == 0 {
					err = q.AckWakeAt(ctx, w, now)
				}
			}
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
}

// TestSnapshotCache checks that time travel through cached snapshot segments gives exactly
// what a fold from the start gives, that segments of a store whose log diverged from the
// cached one are not used, and that damaged segments are ignored.
func TestSnapshotCache(t *testing.T) {
	t.Parallel()
	a := filepath.Join(t.TempDir(), "a")
	b := filepath.Join(t.TempDir(), "b")
	buildStore(t, a, 3, 300)
	buildStore(t, b, 3, 200) // same seed: same first event (same identity), then it differs
	cache := t.TempDir()
	state := func(dir string, seq int, extra ...string) result {
		args := append([]string{"state", dir, "--at-seq", fmt.Sprint(seq), "--json", "--cache-dir", cache, "--snapshot-every", "16", "--cost"}, extra...)
		return replay(t, args...)
	}
	lastOf := func(dir string) int {
		var s statsJSON
		if err := json.Unmarshal([]byte(mustReplay(t, "stats", dir, "--json")), &s); err != nil {
			t.Fatal(err)
		}
		return int(s.LastSeq)
	}
	la, lb := lastOf(a), lastOf(b)
	if la < 200 || lb < 100 {
		t.Fatalf("stores too small: %d, %d events", la, lb)
	}
	// Build the cache on a, then read it at many points.
	if r := state(a, la); r.code != 0 || !strings.Contains(r.stderr, "wrote") {
		t.Fatalf("first fold of a: exit %d, %s", r.code, r.stderr)
	}
	for _, seq := range []int{0, 1, 15, 16, 17, 31, 32, 100, la / 2, la - 1, la} {
		want := mustReplay(t, "state", a, "--at-seq", fmt.Sprint(seq), "--json", "--no-cache")
		r := state(a, seq)
		if r.code != 0 || r.stdout != want {
			t.Errorf("a at seq %d: cached state differs from a fold from the start (exit %d, %s)", seq, r.code, r.stderr)
		}
		if seq >= 32 && !strings.Contains(r.stderr, "loaded") {
			t.Errorf("a at seq %d did not use the cache: %s", seq, r.stderr)
		}
	}
	// b shares a's identity but not its log: a's segments must not be used for it.
	for _, seq := range []int{40, lb} {
		want := mustReplay(t, "state", b, "--at-seq", fmt.Sprint(seq), "--json", "--no-cache")
		if r := state(b, seq); r.code != 0 || r.stdout != want {
			t.Errorf("b at seq %d: wrong state from a diverged cache (%s)", seq, r.stderr)
		}
	}
	// A damaged segment is ignored (and rewritten): the answer stays right.
	segs, _ := filepath.Glob(filepath.Join(cache, "*", "k16", "seg-*.snap"))
	if len(segs) == 0 {
		t.Fatal("no segments")
	}
	for _, s := range segs {
		os.Truncate(s, 40)
	}
	want := mustReplay(t, "state", a, "--json", "--no-cache")
	if r := state(a, la); r.code != 0 || r.stdout != want {
		t.Errorf("a with damaged segments: wrong state (%s)", r.stderr)
	}
	// And the time cut agrees with the sequence cut through the cache too.
	at := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).Add(150 * time.Second).Format(time.RFC3339)
	r1 := replay(t, "state", a, "--at", at, "--json", "--cache-dir", cache, "--snapshot-every", "16")
	r2 := replay(t, "state", a, "--at", at, "--json", "--no-cache")
	if r1.code != 0 || r1.stdout != r2.stdout {
		t.Errorf("--at through the cache differs from a fold from the start")
	}
}

// TestMemFromMatchesFold checks the heart of the cache in process: at every point of a log,
// the state rebuilt from its records alone equals the folded one, idempotency keys and
// eligibility indexes included.
func TestMemFromMatchesFold(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "s")
	buildStore(t, dir, 9, 250)
	st, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := projection.NewMem()
	n := 0
	err = st.ReadRange(context.Background(), 0, 0, func(ev events.Event) error {
		if err := projection.Apply(m, ev); err != nil {
			return err
		}
		tasks := map[string]*projection.Task{}
		for _, x := range m.Tasks() {
			tasks[x.ID] = &x
		}
		wakes := map[string]*projection.Wake{}
		for _, x := range m.Wakes() {
			wakes[x.ID] = &x
		}
		r, err := memFrom(tasks, wakes, ev.Head().Seq)
		if err != nil {
			return err
		}
		if d := m.Diff(r); len(d) > 0 {
			return fmt.Errorf("at seq %d: %v", ev.Head().Seq, d)
		}
		n++
		return nil
	})
	if err != nil || n < 200 {
		t.Fatalf("%d events: %v", n, err)
	}
}

// TestRunInProcess calls run directly, as main does.
func TestRunInProcess(t *testing.T) {
	t.Parallel()
	dir := demoStore(t)
	var out, errb bytes.Buffer
	if code := run([]string{"verify", dir}, &out, &errb); code != 0 || !strings.Contains(out.String(), "ok.") {
		t.Errorf("run verify: %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"log", filepath.Join(dir, "nope")}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "no such directory") {
		t.Errorf("run log on a missing dir: %d %q", code, errb.String())
	}
}
