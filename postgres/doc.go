// Package postgres runs worklog's queue on PostgreSQL: the same *work.Queue, the same events
// and the same decide and fold code as the embedded store, on a database that any number of
// processes on any number of hosts share.
//
// The log is the events table (the wire bytes of package events, one row per sequence
// number); the projection is in tables beside it (tasks, wakes, idempotency keys, the
// eligibility indexes, each session's task list, the counts), written in the same
// transaction as the events it folds. projection.Apply runs in Go against a
// projection.State over the transaction: no SQL re-implements a rule.
//
// Every writing transaction locks the one row of log_head first, so sequence numbers are
// gap-free and in commit order across every process; each process keeps its throughput by
// running every command waiting for it in one transaction (group commit, as the Pebble
// store's writer does). docs/postgres.md describes the schema, the log head and the
// failures.
//
// Which schema: the queue's tables live in the schema named worklog (DefaultSchema, created
// when missing) unless the DSN's search_path names another, which is resolved as PostgreSQL
// resolves it for a CREATE TABLE: the first schema of the path that exists, $user meaning the
// session user's; when none exists, the first is created. System schemas (pg_*,
// information_schema) are refused. One database holds several queues, one per schema. A
// queue an older version created in public (which Open without search_path used then) is
// reached with search_path=public; Open without search_path refuses to start a new queue
// beside it and says so.
//
// The queue's own connections set what they need whatever the database or role sets
// (statement_timeout and lock_timeout off, idle_in_transaction_session_timeout 60 s; the
// application's connections keep theirs), keep TCP keepalives on, and bound every wait on
// the server: the writer's transactions by Options.WriteTimeout, Close by
// Options.CloseTimeout, every other call by its context.
//
// # Where each mechanism lives
//
//	postgres.go       Open, Options, the engine struct and its lifecycle
//	schema.go         the tables, FormatVersion, creating and checking a queue's schema
//	storage.go        table storage parameters (fillfactor, autovacuum) for a queue under retention
//	writer.go         the writer goroutine: group commit under the log head's lock, WriteTimeout
//	txn.go            the projection.State a group writes through, and the writer's cache
//	catchup.go        the cache across other processes' writes: the events since its head
//	fast.go           one round trip for a group the cache can answer
//	readfirst.go      reads of committed state outside the writer (an idempotent repeat)
//	claimpre.go       a claim's reads in the begin's round trip
//	index.go          the eligibility indexes: one table each, one set of statements
//	session_wakes.go  the per-session available-wake index
//	kind_policies.go  the kind policies and the per-kind lease index
//	schedules.go      the periodic schedules
//	onerow.go         a one-row insert sent as VALUES instead of arrays
//	copy.go           COPY for the large tables of a large group
//	listeners.go      NOTIFY only when another process's listener would hear it
//	sharedwriter.go   Options.SharedWriter: one elected process runs every process's rounds
//	submittx.go       SubmitTx: a submission decided inside the application's transaction, taken in first
//	clock.go          the server's clock decides
//	deadconn.go       pooled connections whose server process ended
//	prune.go          retention
//	read.go           projection.Reader over a read-only transaction
//	pager.go          every paged read of a table: one keyset loop
//	readonly.go       Store: read-only access for tools (replay, the console)
//	follow.go         Store.Follow: the log, then each commit of any process
//	verify.go         Verify: the fold of the events table against every stored table
//	verify_spill.go   Verify's two states in a scratch Pebble database, so its heap is bounded
//	importer.go       Importer: appending a log moved from another store
//	headstats.go      the writer's counts of groups and head holds, for benchmarks
//	diskusage.go      the size of the queue's tables, for replay stats
package postgres
