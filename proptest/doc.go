// Package proptest holds model-based property tests of package work, written with gopter's
// commands package: random histories of operations run both on a small reference model (the
// gopter State) and on a real *work.Queue (the SystemUnderTest), and every property is
// checked after every step. The package has no non-test code besides this comment.
//
// # The model
//
// model_test.go restates the rules of the API spec (work-api.md) and of the seed
// (everruns-work.rs) in about 450 lines, without importing package work: records are plain
// structs of pool indexes and int64 nanosecond times after a fixed origin, claim order is a
// stable sort of the model's own records by (time it became eligible, handle), JSON
// equality is a lookup in a hand-written table of spellings and value classes
// ({"a":1,"b":2} and { "b": 2, "a": 1 } are one class, 1 and 1.0 are two, nil and null one).
// Each transition also records what the call must return (model.exp): the task or wake it
// names, the error kind and detail, the deliveries of a claim in order, the completion
// wakes it records, and how many state-changing events it appends.
//
// Retention (work-api-2.md) is model.prune, restated from the spec and not from
// projection/prune.go, so that the two can disagree: a terminal task with FinishedAt <
// before, with its completion wake only once that wake is acknowledged at a time < before;
// a direct wake acknowledged before before. A pruned record keeps its handle, marked
// pruned: it reads as absent, a delivery of a pruned task is ErrTaskNotFound (finish,
// extend, release, settle-and-claim, cancel), of a pruned wake ErrStaleDelivery, a pruned
// cursor is ErrTaskNotFound, and the keys are free (a Submit or Wake with one creates a new
// record, a new handle).
//
// Pools are small so that collisions are frequent: 2 or 3 sessions (s1 s2 s3), 2 kinds, 3
// keys (task keys and wake keys are separate namespaces), 6 spellings of 4 JSON values, 9
// outcomes (successes with equal and different outputs, a summary, two failures, a
// cancellation), leases of 0.5 to 3 s, limits 1, 2, 3 and 100.
//
// # Handles and deliveries: keeping model and system aligned
//
// Ops never hold real ids or deliveries, only model handles: Tn is the n-th task the model
// created, Wn the n-th wake, and a delivery is (handle, attempt), written T2#1 — unique,
// since every claim adds exactly one attempt, and the model knows which exist (attempts
// 1..n of a record). The system side (system_test.go) keeps the real ids behind handles and
// every delivery the queue returned, keyed by (handle, attempt):
//
//   - A task or direct wake is bound to its handle in the PostCondition of the Submit or
//     Wake that the model says created it, from the returned id; a completion wake is bound
//     from the WakeRecorded event the step appended to the log (read with Queue.ReadLog),
//     in creation order, so it has a handle before anyone claims it.
//   - A claim's PostCondition compares the returned deliveries position by position with
//     the model's predicted list and stores each matching one under (handle, attempt).
//   - Later Finish and AckWake ops look deliveries up by (handle, attempt): the current
//     one, an older superseded one, a repeat of one already used, or one with a forged
//     token (same attempt, made-up token); an unknown id is also generated.
//
// So commands carry only stable data, the Result carries what the queue returned plus a
// pointer to its system, and PostCondition (which sees the model after the step) updates
// the shared handle tables. After the first violation a history's later steps are not
// checked (the property is already false), which keeps the report to the real cause.
// The clock is a model variable (AdvanceOp), mirrored by the system and passed to every
// ...At method; time.Now is never used.
//
// # Operations
//
// Each op (ops_test.go) has a String for the report and is generated (gen_test.go) with
// weights that favour the interesting cases; TestGeneratorCoverage checks that random
// histories reach each of them (123 named cases):
//
//	submit     immediate or scheduled (before, at, 1ns after, later than now); fresh, or a
//	           repeat under a used key with the same intent (maybe another spelling of the
//	           input) or one changed field (kind, input, schedule incl. immediate vs an
//	           explicit time equal to it, wake policy, or the same key in another session)
//	read       from the owning session, another session, an unknown id
//	cancel     pending, scheduled, running (first and repeated request), terminal,
//	           foreign, unknown
//	claim      varied leases and limits
//	finish     current delivery, superseded one, after settlement by another attempt,
//	           forged token, repeat with an equal (maybe differently spelled) and with a
//	           different outcome, unknown task
//	wake       direct wake, with colliding keys and payloads
//	claimWakes varied leases and limits
//	ack        current (also after its lease expired), stale, repeated, forged, unknown
//	advance    1ns to 2s, or exactly onto / 1ns before / 1ns after a lease expiry or a
//	           schedule
//	invalid    one of 24 requests that validation must refuse (blank kind, whitespace
//	           key, bad JSON, zero lease or limit, non-terminal or malformed outcome, a
//	           release's RunAt or reason, empty kinds, ...)
//	extend     (work-api-2.md) a heartbeat of the current delivery (its lease later or
//	           earlier than before, after it expired, with a cancel request), of a superseded,
//	           settled or released one, forged, unknown
//	release    current (no RunAt, RunAt in the past, now, 1ns after, later), of a
//	           cancel-requested task (canceled, with its completion wake), repeated,
//	           superseded, settled, forged, unknown
//	claimKinds one kind, both, the kind nobody submits, a kind named twice
//	claimSessionWakes (work-api-3.md) any set of sessions, one named twice: only their
//	           wakes, in ClaimWakes' order, cut by the limit, redeliveries after expiry
//	tasks      a session's list, filtered by states and kinds, after a cursor of its own,
//	           of another session, or an unknown id, varied limits
//	settleAndClaim  up to 3 finishes and releases (any of the deliveries above), then a
//	           claim of all kinds or some, limit 0 to 100, all in one step
//	prune      (work-api-2.md, Retention) with before exactly at a terminal task's
//	           FinishedAt or a wake's acknowledgment, 1ns before or after it, now, 1ns or 1s
//	           after now, or in the past; weighted up when something is prunable; later
//	           ops meet the pruned subjects (late finishes, extends, releases, acks,
//	           cancels, reads, cursors, submits and wakes reusing their keys, restarts).
//	           TestGeneratorCoverage also requires that at least 35% of the prunes remove
//	           something (about half do)
//	schedule   (work-api-3.md) set (new, replacing, again after its ticks: @every 1s, 2s or
//	           a year, catch-up all or latest) and remove; every task claim first submits the
//	           due ticks' tasks (ops_schedules_test.go), which it may then take; prunes
//	           take ticks' tasks but a schedule's latest tick (model.prunableTask)
//	reopen     (restartable backends) Close, then Open the same directory
//	crash      (restartable backends) open a vfs.CrashClone holding exactly the synced data,
//	           without closing first
//
// # Properties
//
// Every violation message starts with the property it breaks:
//
//	[idempotency]     an equal request under a used key returns the same task or wake (and
//	                  its current snapshot); a changed one is ErrIdempotencyConflict with the
//	                  key and appends nothing to the log
//	[fencing]         a superseded or forged token always gets ErrStaleDelivery; a settled
//	                  task never changes again (it is read back every step and compared with
//	                  its first terminal snapshot); repeating a settlement with an equal
//	                  outcome is fine, with another one ErrInvalidTransition; an acknowledged
//	                  wake is never delivered again; nothing is delivered while its previous
//	                  lease is live; lease tokens are non-empty and never reused
//	[at-least-once]   a claim delivers every task that is due or whose lease expired (and
//	                  every unacknowledged wake that is new or whose lease expired), up to
//	                  the limit, exactly at the boundary (lease expiry <= now)
//	[claim-order]     in the order they became eligible (schedule, lease expiry), ties by
//	                  submission order; wakes likewise
//	[attempts]        attempts count claims: delivery attempt = task attempts = claims so far
//	[completion-wake] a task with WakeOnCompletion has exactly one completion wake once
//	                  terminal, however it ended (success, failure, cancel while pending or
//	                  while running), carrying its outcome; no other task has one (checked in
//	                  the log after every step, and in every delivered wake)
//	[isolation]       reads, cancels and keys are per session: another session's task reads
//	                  as not found and cannot be canceled (checked for every task every step)
//	[replay]          Queue.Verify (refold the whole log from empty, compare with the live
//	                  projection) is nil after every step
//	[log]             every transition is one event and a refused or repeated call appends
//	                  none, except one audit record for a stale settlement or ack
//	[model]           every returned snapshot, and every task read back after every step,
//	                  equals the model field by field (state, times compared as instants,
//	                  input and output bytes as first given, outcome, cancel request time)
//	[schedule]        a claim submits exactly one task per due tick of each live schedule,
//	                  none before its tick, under the key schedule:<name>:<tick>, as the
//	                  catch-up rule says; Session.Schedules lists each one's next and last tick
//	[errors]          validation refuses bad requests with ErrInvalidRequest and the field;
//	                  every error matches exactly one kind sentinel, is a *work.Error with the
//	                  id or key, and has the seed's message
//	[redaction]       a lease token never appears in fmt output of a delivery or in an error
//	[claim-kinds]     a claim by kind delivers only those kinds, in the claim order among
//	                  them (with [at-least-once] and [claim-order] against the model)
//	[list]            Session.Tasks is the session's tasks in submission order, filtered,
//	                  after the cursor, at most the limit; a cursor that is not the session's
//	                  is ErrTaskNotFound
//	[stats]           Queue.StatsAt(now) equals the model's counts by state and by kind, the
//	                  number due now and the oldest due time, after every step
//	                  Part 2's rules hold through the properties above: a heartbeat or release
//	                  by a stale delivery is ErrStaleDelivery and changes nothing ([fencing],
//	                  [log], every task read back); attempts count claims through releases
//	                  ([attempts]); an extended lease fences redelivery until its new expiry,
//	                  earlier or later, and a released one not at all ([fencing],
//	                  [at-least-once]); a SettleAndClaim settles each delivery on its own
//	                  (one stale settle fails only its own result) before its claims
//	[prune]           Prune removes exactly the model's subjects: PruneResult.Tasks and
//	                  Wakes (completion wakes counted) are the model's, Events the number
//	                  of those subjects' events the harness saw appended; nothing
//	                  unprunable changes: every task read through the API and every task
//	                  and wake record of the fold of the retained log (below) is exactly
//	                  what it was before the prune; the pruned ones are gone from both;
//	                  the log is exactly the retained events, and its only gaps are the
//	                  pruned events; a pruned subject reads as absent afterwards (every
//	                  step) and its deliveries fail as the model says
//	                  With prunes, [replay] also folds the retained log as replay does
//	                  (projection.Apply on a fresh Mem, the last sequence moved across
//	                  each gap of pruned events, any other gap refused) after every prune
//	                  and restart, and compares the fold with the model: exactly its
//	                  unpruned tasks and wakes, in its state
//	[durability]      (restartable backends) after Reopen or Crash the log holds exactly the
//	                  acknowledged events that were not pruned, and the state still equals
//	                  the model
//	[differential]    two backends given the same history return the same results, rendered
//	                  with ids replaced by handles (plus the model checks on both)
//
// # Tests
//
//	TestQueueProperties         random histories on NewInMemory
//	TestQueuePropertiesDurable  random histories on work.Open over vfs.NewCrashableMem,
//	                            with reopen and crash ops
//	TestDifferentialMemory      two in-memory queues, same histories
//	TestDifferentialDurable     in-memory vs durable
//	TestScenarios               hand-written histories (main flow, JSON idempotency, exact
//	                            lease expiry, cancel, claim order, isolation, wake leases)
//	TestRegressions             replays testdata/regress/*.json on memory and durable; a file with
//	                            "skip" documents a known bug and skips with that reason. The
//	                            mut-*.json files are the shrunk histories that killed the
//	                            mutants of the mutation check (each names its mutant); they
//	                            pass on a correct queue
//	TestPruneLongRun            a history whose prune removes a run of ~180 consecutive events
//	                            (on Pebble one range deletion, which random histories, too
//	                            short, never reach), then restarts and takes more work
//	TestRegressionsPostgres     replays the saved histories that prune on PostgreSQL (when a
//	                            server is available; about 0.3 s a history there)
//	TestDifferentialPostgres    memory vs PostgreSQL, with reopen, crash and prune
//	TestGeneratorCoverage       the generator reaches every named case (model only)
//	TestHistoryRoundTrip        the JSON printed with a failure loads back unchanged
//
// # Backends
//
// A backendSpec (backends_test.go) opens fresh, empty stores; the same ops run on every
// backend, and only restartable ones get reopen and crash. The durable backend is plugged in
// at the marked PLUG-IN POINT: durable_open_test.go sets openDurable to work.Open with
// Options{FS: fs}; without that file the durable tests skip.
//
// # Reading a failure
//
// A failure prints the first violation, the seed, a one-line command that reproduces it, the
// shrunk history as a numbered list of ops with the model time, what the queue returned and
// each violation, and the same history as JSON. Save the JSON as testdata/regress/NAME.json
// to keep it as a regression test (with "skip": "known bug: ..." while it fails). gopter
// shrinks by dropping ops; dropping an op that created a handle renumbers later handles, so
// such candidates are often invalid and a shrunk history is minimal only against dropping
// ops that keep it valid.
//
// # Budget and knobs
//
//	go test ./proptest -run '^TestQueueProperties$' -seed 12345   replay one seed
//	WORKLOG_PROPTEST_RUNS=N     histories of TestQueueProperties (default 800); the other
//	                            random tests run in proportion (defaults: 250 for the
//	                            in-memory differential test, 100 for each durable test)
//	WORKLOG_PROPTEST_MAXLEN=N   longest history (default 60; lengths grow from 5 to N over
//	                            a run)
//	WORKLOG_PROPTEST_SKIP_VERIFY=1  leaves out Verify after each step: only for the
//	                            mutation check, to see whether the model's own properties
//	                            catch a mutant that Verify reports first
//
// The seed (-seed; default: from the clock) is logged by every run (visible with go test -v)
// and printed with every failure; a seed reproduces the same histories only with the same two
// knobs, which the printed command includes when they are set. The defaults cost about 13 s
// of CPU: about 15 s on an idle 2-core machine and 30 to 40 s on a busy one (measured at
// load 14), most of it in the two durable tests. Under -race the budget is divided by 8
// unless WORKLOG_PROPTEST_RUNS is set.
package proptest
