package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"math/rand/v2"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/work"
)

const demoLong = `Build a realistic sample store through the public work API (work.Open), with explicit
times, then show what replay does with it: one session's timeline and the verify result.

The story, on 2026-03-02 from 09:00 UTC, in three sessions:
  checkout-4821        a card charge whose first worker crashes: its lease expires, the task is
                       redelivered, and when the crashed worker comes back its Finish is fenced
                       off (task_settle_rejected); a stock reservation that fails; a receipt
                       scheduled three minutes out, whose mail server says "try again later":
                       its worker releases it for a retry a minute on (task_released), and
                       attempt 2 sends it; completion wakes, one of which is redelivered after
                       its consumer crashed, and a stale acknowledgment
  nightly-report-0302  a scheduled report canceled while pending (with its completion wake),
                       an export canceled while running (its worker sees the request on its
                       heartbeat, task_extended, and settles with Cancellation)
  chat-7f3a            a summary with a completion wake, direct wakes with idempotency keys,
                       work still scheduled, and a translation still running when the log
                       ends, its lease kept alive by heartbeats

With no DIR the store goes into a new temporary directory, which demo removes when it is done
(and says so); --keep keeps it and prints where it is and how big. DIR must not exist or be
empty: demo never writes into an existing store, and never removes a DIR it was given.

--seed N makes the ids and lease tokens deterministic (work.Options.Entropy from a ChaCha8
generator seeded with N), so the output is the same on every run; without it they are
random, as in production.`

func (a *app) demoCommand() *cobra.Command {
	var seed uint64
	var keep, serve bool
	var addr string
	var allow []string
	c := &cobra.Command{
		Use:   "demo [DIR]",
		Short: "Build a sample store, then show its timeline and verify it",
		Long:  demoLong,
		Example: `  replay demo
  replay demo --keep
  replay demo ./sample --seed 1 && replay log ./sample`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef(c, "demo takes at most one argument, the directory, got %q", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			dir := ""
			if len(args) == 1 {
				dir = args[0]
			}
			if keep && dir != "" {
				return usagef(c, "--keep is for the temporary store; a DIR given to demo is always kept")
			}
			if serve {
				return a.runDemoServe(c.Context(), dir, seed, c.Flags().Changed("seed"), keep, addr, allow)
			}
			return a.runDemo(c.Context(), dir, seed, c.Flags().Changed("seed"), keep)
		},
	}
	c.Flags().Var(seedValue(&seed), "seed", "make ids and lease tokens deterministic, from this seed")
	c.Flags().BoolVar(&keep, "keep", false, "keep the temporary store (without DIR) and print where it is and how big")
	c.Flags().BoolVar(&serve, "serve", false, "then serve the web console on the store, read-only, until interrupted (replay serve)")
	c.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "with --serve: the address to listen on")
	allowHostFlag(c, &allow, "with --serve: ")
	return c
}

const demoSession = "checkout-4821"

// runDemo builds the demo store in dir, or in a temporary directory when dir is "", which it
// removes at the end unless keep: a demo run from a tutorial should not leave a store in
// /tmp behind each time.
func (a *app) runDemo(ctx context.Context, dir string, seed uint64, seeded, keep bool) error {
	if dir != "" {
		if names, err := os.ReadDir(dir); err == nil && len(names) > 0 {
			return fmt.Errorf("%s is not empty: demo builds a new store and never writes into an existing directory's files; give a new or empty directory", dir)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: %v", dir, unwrapPathError(err))
		}
		return a.demoIn(ctx, dir, seed, seeded, true)
	}
	dir, err := os.MkdirTemp("", "worklog-demo-")
	if err != nil {
		return fmt.Errorf("making a temporary directory: %v", err)
	}
	// demoIn has closed the store when it returns, even on an error or an interrupt, so
	// the directory can go.
	err = a.demoIn(ctx, dir, seed, seeded, keep)
	if keep {
		size, serr := dirBytes(dir)
		if serr != nil {
			return errors.Join(err, fmt.Errorf("measuring the store in %s: %v", dir, unwrapPathError(serr)))
		}
		fmt.Fprintf(a.out, "\nKept the store in %s (%s on disk); remove it with `rm -r %s` when done.\n", dir, humanBytes(size), dir)
		return err
	}
	if rerr := os.RemoveAll(dir); rerr != nil {
		return errors.Join(err, fmt.Errorf("removing the temporary store %s: %v", dir, unwrapPathError(rerr)))
	}
	fmt.Fprintf(a.out, "\nRemoved the temporary store %s. To keep a store to try replay on: replay demo --keep, or replay demo DIR.\n", dir)
	return err
}

// dirBytes is the size of the files under dir.
func dirBytes(dir string) (uint64, error) {
	var n uint64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += uint64(info.Size())
		return nil
	})
	return n, err
}

// demoIn builds the demo store in dir and shows it; kept says whether dir stays afterwards
// (the commands to try next are printed only then).
func (a *app) demoIn(ctx context.Context, dir string, seed uint64, seeded, kept bool) error {
	var entropy io.Reader
	if seeded {
		var s [32]byte
		binary.LittleEndian.PutUint64(s[:], seed)
		entropy = rand.NewChaCha8(s)
	}
	q, err := work.Open(dir, &work.Options{Entropy: entropy})
	if err != nil {
		return fmt.Errorf("creating the store in %s: %v", dir, err)
	}
	d := &demo{ctx: ctx, q: q, t0: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)}
	err = d.script()
	if cerr := q.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("building the demo store in %s: %v", dir, err)
	}

	st, err := openStore(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	last, err := st.LastSeq(ctx)
	if err != nil {
		return err
	}
	w := a.out
	seedNote := "random ids"
	if seeded {
		seedNote = fmt.Sprintf("seed %d", seed)
	}
	fmt.Fprintf(w, "Built a sample worklog store in %s (%s):\n", dir, seedNote)
	fmt.Fprintf(w, "3 sessions, %d tasks, %d wakes and %d events, on 2026-03-02 from 09:00:00 to %s UTC,\n",
		d.tasks, d.wakes, last, clock(d.last.UnixNano()))
	fmt.Fprintln(w, "written through work.Open with explicit times: a worker crashes and its task is redelivered")
	fmt.Fprintln(w, "after the lease expires, the crashed worker's late Finish is fenced off, work is scheduled,")
	fmt.Fprintln(w, "canceled while pending and while running, a worker gives a task back to retry it later, long")
	fmt.Fprintln(w, "work keeps its lease with heartbeats, and sessions are woken directly and on completion.")
	fmt.Fprintf(w, "\nThe story of session %s, as `replay timeline %s --session %s` tells it:\n\n", demoSession, dir, demoSession)
	s, err := readStory(ctx, st, demoSession)
	if err != nil {
		return readError(dir, err)
	}
	a.writeTimelineText(w, s)
	fmt.Fprintf(w, "\n`replay verify %s` rebuilds the projection from the log and compares:\n\n", dir)
	r, err := a.verify(ctx, st)
	if err != nil {
		return readError(dir, err)
	}
	r.writeText(a, dir)
	if kept {
		fmt.Fprintf(w, `
Try next:
  replay task %[1]s %[2]s
      why the charge succeeded on attempt 2, rule by rule
  replay task %[1]s %[4]s
      the receipt: released for a retry by attempt 1, sent by attempt 2
  replay state %[1]s --at 2026-03-02T09:00:35Z
      time travel: the charge's first lease has just expired, unnoticed
  replay log %[1]s --session %[3]s
  replay timeline %[1]s --session %[3]s --html checkout.html
  replay stats %[1]s
`, dir, d.charge, demoSession, d.receipt)
	}
	if !r.OK {
		return exitCode(exitFindings)
	}
	return nil
}

// demo runs the sample story against a queue, checking that each claim gets the work the
// story expects (the claim order is the queue's: eligibility time, then submission).
type demo struct {
	ctx     context.Context
	q       *work.Queue
	t0      time.Time
	last    time.Time
	tasks   int
	wakes   int
	charge  string // the charge-card task: the demo's example for `replay task`
	receipt string // the send-receipt task: released once, then sent
}

func (d *demo) at(sec float64) time.Time {
	t := d.t0.Add(time.Duration(sec * float64(time.Second)))
	if t.After(d.last) {
		d.last = t
	}
	return t
}

func js(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func (d *demo) submit(session string, sec float64, r work.TaskRequest) (work.Task, error) {
	t, err := d.q.Session(session).SubmitAt(d.ctx, r, d.at(sec))
	if err != nil {
		return t, fmt.Errorf("submit %s: %w", r.Kind, err)
	}
	return t, nil
}

// claim claims, as worker (the identity its claim events record), exactly the tasks of
// the given kinds, in that order.
func (d *demo) claim(sec float64, worker string, lease time.Duration, kinds ...string) ([]work.TaskDelivery, error) {
	ds, err := d.q.ClaimDueAt(work.WithWorker(d.ctx, worker), d.at(sec), lease, len(kinds))
	if err != nil {
		return nil, fmt.Errorf("claim at +%gs: %w", sec, err)
	}
	if len(ds) != len(kinds) {
		return nil, fmt.Errorf("claim at +%gs: got %d deliveries, the story expects %d", sec, len(ds), len(kinds))
	}
	for i, k := range kinds {
		if ds[i].Task.Kind != k {
			return nil, fmt.Errorf("claim at +%gs: got %s, the story expects %s", sec, ds[i].Task.Kind, k)
		}
	}
	return ds, nil
}

func (d *demo) finish(sec float64, del work.TaskDelivery, o work.Outcome) error {
	if _, err := d.q.FinishAt(d.ctx, del, o, d.at(sec)); err != nil {
		return fmt.Errorf("finish %s: %w", del.Task.Kind, err)
	}
	return nil
}

// extend is a worker's heartbeat: the lease of del then ends lease after sec.
func (d *demo) extend(sec float64, del work.TaskDelivery, lease time.Duration) (work.TaskDelivery, error) {
	out, err := d.q.ExtendAt(d.ctx, del, lease, d.at(sec))
	if err != nil {
		return out, fmt.Errorf("extend %s at +%gs: %w", del.Task.Kind, sec, err)
	}
	return out, nil
}

// claimWakes claims the session wakes as the agent runtime that serves the sessions.
func (d *demo) claimWakes(sec float64, lease time.Duration, n int) ([]work.WakeDelivery, error) {
	ws, err := d.q.ClaimWakesAt(work.WithWorker(d.ctx, "agent-runtime-1"), d.at(sec), lease, 10)
	if err != nil {
		return nil, fmt.Errorf("claim wakes at +%gs: %w", sec, err)
	}
	if len(ws) != n {
		return nil, fmt.Errorf("claim wakes at +%gs: got %d, the story expects %d", sec, len(ws), n)
	}
	return ws, nil
}

func (d *demo) ack(sec float64, w work.WakeDelivery) error {
	if err := d.q.AckWakeAt(d.ctx, w, d.at(sec)); err != nil {
		return fmt.Errorf("ack wake at +%gs: %w", sec, err)
	}
	return nil
}

func (d *demo) script() error {
	const lease, wakeLease = 30 * time.Second, 20 * time.Second
	checkout := "checkout-4821"
	report := "nightly-report-0302"
	chat := "chat-7f3a"

	// 09:00:00 The checkout session submits its work.
	charge, err := d.submit(checkout, 0, work.TaskRequest{Kind: "charge-card",
		Input:          js(map[string]any{"order": 4821, "amount_cents": 12999, "currency": "EUR"}),
		IdempotencyKey: "charge:4821", Wake: work.WakeOnCompletion})
	if err != nil {
		return err
	}
	d.charge = charge.ID
	if _, err := d.submit(checkout, 0.5, work.TaskRequest{Kind: "reserve-stock",
		Input: js(map[string]any{"order": 4821, "sku": "sku-981", "qty": 2}), Wake: work.WakeOnCompletion}); err != nil {
		return err
	}
	receipt, err := d.submit(checkout, 1, work.TaskRequest{Kind: "send-receipt",
		Input: js(map[string]any{"order": 4821, "email": "ana@example.com"}), RunAt: d.t0.Add(3 * time.Minute)})
	if err != nil {
		return err
	}
	d.receipt = receipt.ID
	if _, err := d.submit(chat, 1.5, work.TaskRequest{Kind: "summarize",
		Input: js(map[string]any{"thread": "7f3a", "messages": 48}), Wake: work.WakeOnCompletion}); err != nil {
		return err
	}
	// A retried request with the same key returns the same task and appends nothing.
	again, err := d.submit(checkout, 2, work.TaskRequest{Kind: "charge-card",
		Input:          js(map[string]any{"order": 4821, "amount_cents": 12999, "currency": "EUR"}),
		IdempotencyKey: "charge:4821", Wake: work.WakeOnCompletion})
	if err != nil {
		return err
	}
	if again.ID != charge.ID {
		return errors.New("the retried charge made a second task")
	}

	// 09:00:03 Worker A claims the charge and crashes: it never finishes in time.
	a, err := d.claim(3, "worker-a", lease, "charge-card")
	if err != nil {
		return err
	}
	crashed := a[0]
	// 09:00:04 Worker B takes the stock reservation and the summary.
	b, err := d.claim(4, "worker-b", lease, "reserve-stock", "summarize")
	if err != nil {
		return err
	}
	if err := d.finish(6, b[0], work.Failure("out of stock: sku-981 has 1 left, 2 requested")); err != nil {
		return err
	}
	if err := d.finish(9, b[1], work.SuccessWithSummary("48 messages condensed into 5 bullet points",
		js(map[string]any{"bullets": 5}))); err != nil {
		return err
	}
	// 09:00:10 A direct wake for the chat session: a new message arrived.
	if _, err := d.q.Session(chat).WakeAt(d.ctx, work.WakeRequest{
		Payload: js(map[string]any{"from": "ana", "text": "any update on my order?"}), IdempotencyKey: "msg-1029"}, d.at(10)); err != nil {
		return err
	}
	// 09:00:12 The sessions' wake consumer takes three wakes; it acknowledges two, then
	// crashes before acknowledging the reservation's failure.
	ws, err := d.claimWakes(12, wakeLease, 3)
	if err != nil {
		return err
	}
	lostAck := ws[0]
	if err := d.ack(14, ws[1]); err != nil {
		return err
	}
	if err := d.ack(14.5, ws[2]); err != nil {
		return err
	}
	// 09:00:20 The nightly report is scheduled for 09:10; an export starts now.
	reportTask, err := d.submit(report, 20, work.TaskRequest{Kind: "build-report",
		Input: js(map[string]any{"date": "2026-03-01"}), RunAt: d.t0.Add(10 * time.Minute), Wake: work.WakeOnCompletion})
	if err != nil {
		return err
	}
	exportTask, err := d.submit(report, 21, work.TaskRequest{Kind: "export-csv", Input: js(map[string]any{"rows": 120000})})
	if err != nil {
		return err
	}
	ex, err := d.claim(22, "worker-b", lease, "export-csv")
	if err != nil {
		return err
	}
	// 09:00:25 The export is canceled while running; at 09:00:26 its worker's heartbeat
	// returns the task with the request on it, and the worker stops.
	if _, err := d.q.Session(report).CancelAt(d.ctx, exportTask.ID, d.at(25)); err != nil {
		return err
	}
	hb, err := d.extend(26, ex[0], lease)
	if err != nil {
		return err
	}
	if hb.Task.CancelRequestedAt.IsZero() {
		return errors.New("the export's heartbeat did not show its cancel request")
	}
	if err := d.finish(27, hb, work.Cancellation()); err != nil {
		return err
	}
	// 09:00:40 The charge's lease expired at 09:00:33: worker C gets it again (attempt 2).
	c, err := d.claim(40, "worker-c", lease, "charge-card")
	if err != nil {
		return err
	}
	// 09:00:41 The lost wake's lease expired at 09:00:32: it is delivered again.
	ws, err = d.claimWakes(41, wakeLease, 1)
	if err != nil {
		return err
	}
	// 09:00:42 The crashed consumer's acknowledgment arrives late and is rejected.
	if err := d.q.AckWakeAt(d.ctx, lostAck, d.at(42)); !errors.Is(err, work.ErrStaleDelivery) {
		return fmt.Errorf("the stale acknowledgment was not fenced off: %v", err)
	}
	if err := d.ack(43, ws[0]); err != nil {
		return err
	}
	// 09:00:43.5 Worker A wakes up and tries to finish attempt 1: fenced off by attempt 2.
	if _, err := d.q.FinishAt(d.ctx, crashed, work.Success(js(map[string]any{"charge_id": "ch_dup"})), d.at(43.5)); !errors.Is(err, work.ErrStaleDelivery) {
		return fmt.Errorf("the crashed worker's Finish was not fenced off: %v", err)
	}
	if err := d.finish(45, c[0], work.SuccessWithSummary("charged 129.99 EUR",
		js(map[string]any{"charge_id": "ch_3Q8xK2", "amount_cents": 12999}))); err != nil {
		return err
	}
	ws, err = d.claimWakes(47, wakeLease, 1)
	if err != nil {
		return err
	}
	if err := d.ack(48, ws[0]); err != nil {
		return err
	}
	// 09:01:00 The report is no longer needed: canceled while pending, its session is woken.
	if _, err := d.q.Session(report).CancelAt(d.ctx, reportTask.ID, d.at(60)); err != nil {
		return err
	}
	ws, err = d.claimWakes(62, wakeLease, 1)
	if err != nil {
		return err
	}
	if err := d.ack(63, ws[0]); err != nil {
		return err
	}
	// 09:01:40 The chat schedules a follow-up summary for 09:30.
	if _, err := d.submit(chat, 100, work.TaskRequest{Kind: "summarize",
		Input: js(map[string]any{"thread": "7f3a", "messages": 12}), RunAt: d.t0.Add(30 * time.Minute), Wake: work.WakeOnCompletion}); err != nil {
		return err
	}
	// 09:03:00 The receipt is due; the mail server answers "try again later", so the worker
	// gives the task back for a retry at 09:04:00.
	r, err := d.claim(180, "worker-c", lease, "send-receipt")
	if err != nil {
		return err
	}
	if _, err := d.q.ReleaseAt(d.ctx, r[0], work.ReleaseRequest{RunAt: d.t0.Add(4 * time.Minute),
		Reason: "smtp 421 4.7.0 mx.example.com: try again later"}, d.at(181)); err != nil {
		return fmt.Errorf("release send-receipt: %w", err)
	}
	// 09:03:10 A translation starts; its worker sends a heartbeat every ten seconds, and it
	// is still running when the log ends.
	if _, err := d.submit(chat, 190, work.TaskRequest{Kind: "translate",
		Input: js(map[string]any{"thread": "7f3a", "to": "de"}), Wake: work.WakeOnCompletion}); err != nil {
		return err
	}
	tr, err := d.claim(200, "worker-b", lease, "translate")
	if err != nil {
		return err
	}
	// 09:03:25 One more message for the chat; nobody has claimed it yet.
	if _, err := d.q.Session(chat).WakeAt(d.ctx, work.WakeRequest{
		Payload: js(map[string]any{"from": "ana", "text": "thanks!"}), IdempotencyKey: "msg-1030"}, d.at(205)); err != nil {
		return err
	}
	hb = tr[0]
	for _, sec := range []float64{210, 220, 230} {
		if hb, err = d.extend(sec, hb, lease); err != nil {
			return err
		}
	}
	// 09:04:00 The receipt is due again: attempt 2 sends it.
	r, err = d.claim(240, "worker-a", lease, "send-receipt")
	if err != nil {
		return err
	}
	if err := d.finish(241.5, r[0], work.Success(js(map[string]any{"message_id": "msg_77e1"}))); err != nil {
		return err
	}
	d.tasks, d.wakes = 8, 6
	return nil
}
