package work

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/pebblelog"
)

// SyncMode says when an acknowledged write is durable.
type SyncMode int

const (
	// SyncAlways (the default) returns from a call only after its events and projection
	// changes are fsynced. Concurrent calls share fsyncs: the store's single writer drains
	// every waiting command into one synced batch.
	SyncAlways SyncMode = iota
	// SyncNever returns once the batch is in Pebble's write-ahead log buffer, without an
	// fsync. A crash of the process loses at most the calls in the unwritten WAL buffer (up
	// to 32 KiB of events); a crash of the machine loses every call acknowledged since the
	// last fsync, up to a memtable's worth (MemTableSize). Lost calls vanish whole, never
	// half-applied, and the store stays consistent. Close syncs. Values stored in blob files
	// (pebblelog.BlobMin bytes or more) are fsynced anyway, file and directory entry, by the
	// call that stages them, before its batch commits: a later WAL sync (a prune's, Close's,
	// a memtable flush) may make any acknowledged batch durable, and the log never refers to
	// a blob a crash lost. SyncNever makes only the log's own writes cheaper.
	SyncNever
)

func (m SyncMode) String() string {
	switch m {
	case SyncAlways:
		return "always"
	case SyncNever:
		return "never"
	}
	return fmt.Sprintf("SyncMode(%d)", int(m))
}

// OptionError refuses one field of an options struct: Options names the struct
// ("work.Options", "postgres.Options", "runner.Config", "pebblelog.Options"), Field the
// field as spelled in Go ("MaxValueBytes"), Message what is wrong and what is allowed. It is
// the one error shape of every worklog options struct (pebblelog.OptionError and
// runner.ConfigError are the same type), and matches ErrInvalidOptions. Open, NewInMemory's
// siblings and postgres.Open check their options in one step, before anything is touched.
type OptionError = pebblelog.OptionError

// ErrInvalidOptions is matched by every *OptionError (pebblelog.ErrInvalidOptions and
// runner.ErrInvalidConfig are the same value).
var ErrInvalidOptions = pebblelog.ErrInvalidOptions

// Options configures Open. A nil *Options means all defaults; a zero field means that
// field's default.
type Options struct {
	// Sync is the durability of acknowledged writes. Default SyncAlways.
	Sync SyncMode

	// MaxValueBytes bounds one JSON value: a task's input, a wake's payload, a success's
	// output. A larger one is ErrInvalidRequest naming the field. Default 1 MiB
	// (DefaultMaxValueBytes); at most 64 MiB.
	MaxValueBytes int

	// CacheSize is Pebble's block cache in bytes. Default pebblelog.DefaultCacheSize
	// (24 MiB); at most pebblelog.MaxCacheSize. The cache is created with room for two
	// memtables on top, which Pebble charges to it: with the defaults, blocks and memtables
	// together stay within 56 MiB.
	CacheSize int64

	// MemTableSize is the size of one Pebble memtable in bytes; two may exist at once.
	// Default pebblelog.DefaultMemTableSize (16 MiB; Pebble's own 4 MiB stalls writers
	// under bursts); between pebblelog.MinMemTableSize (256 KiB) and
	// pebblelog.MaxMemTableSize (1 GiB).
	MemTableSize uint64

	// MaxBatchCommands bounds how many waiting commands the writer folds into one batch and
	// one fsync. Default pebblelog.DefaultMaxBatchCommands (1024); at most
	// pebblelog.MaxMaxBatchCommands.
	MaxBatchCommands int

	// Logger receives Pebble's and worklog's messages. Default: discarded.
	Logger *slog.Logger

	// StallTimeout bounds how long a write may wait on the disk (a write stall behind a
	// flush that keeps failing on a full disk, a disk that stopped answering) before the
	// store fails: every waiting and later call returns ErrBackend, and the queue must be
	// reopened. It also bounds Open's recovery. Default pebblelog.DefaultStallTimeout
	// (30 s); negative waits forever. See docs/design.md §7.4.
	StallTimeout time.Duration

	// FS is the filesystem the store lives on. Default vfs.Default (the OS). Tests use
	// vfs.NewCrashableMem to drop unsynced writes.
	FS vfs.FS

	// Entropy is the source of random bits for ids and lease tokens. Default crypto/rand;
	// anything else must be as unguessable wherever tokens cross a trust boundary.
	Entropy io.Reader

	// Retention is how long history is kept: 0 (the default) keeps all of it, as the seed
	// does; otherwise the queue prunes, in the background, what became prunable longer than
	// Retention ago (Queue.Prune, by the queue's clock). See docs/design.md, "Retention".
	Retention time.Duration

	// PruneInterval is how often background pruning runs when Retention is set. Default
	// one minute (DefaultPruneInterval).
	PruneInterval time.Duration

	// ArchiveDir, when not "", is a directory (outside the store's, created if needed)
	// where every event the queue prunes is written, and fsynced, before the prune removes
	// it from the store: history leaves the store but is kept, in the archive format of
	// package archive, for the replay tool (replay --archive) and auditors. Default "": no
	// archive, pruned events are dropped. Only Open (the Pebble store) has it. See
	// docs/design.md, "Retention".
	ArchiveDir string

	// NoInspect, when true, serves no inspection endpoint. By default (false) Open serves
	// one while the queue is open: a Unix socket, mode 0600, for this process's own user
	// only (SO_PEERCRED is checked where the platform has it), found from the store
	// directory (DIR/WORKLOG.sock; when that path is too long for a socket address, a socket
	// in the user's runtime directory that DIR/WORKLOG.sock-path names). Through it the
	// replay tool's read commands and replay serve read the live store, which this process
	// holds locked: the log (and log --follow), the state, verify on a snapshot. It only
	// reads: no request writes. A client that sends nothing or stops reading is dropped
	// after seconds, at most 16 are served at once, and Close closes every connection, so an
	// inspector never holds the queue up. A socket left by a crashed process is removed at
	// the next Open (the store's lock proves nobody serves it). If the endpoint cannot be
	// served (the directory refuses a socket), Open still succeeds and says so through
	// Logger. See docs/replay.md, "A store held by a running process". Only Open (the Pebble
	// store) has one: any process can read a PostgreSQL queue.
	NoInspect bool
}

const maxMaxValueBytes = 64 << 20

// withDefaults returns a copy of o with MaxValueBytes set to its default when zero. The
// store's fields take their defaults from pebblelog (storeOptions), the one source of them.
func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = DefaultMaxValueBytes
	}
	if c.PruneInterval == 0 {
		c.PruneInterval = DefaultPruneInterval
	}
	return c
}

// storeOptions returns the store's options for o, with pebblelog's defaults.
func (o *Options) storeOptions() pebblelog.Options {
	po := pebblelog.Options{
		FS:               o.FS,
		NoSync:           o.Sync == SyncNever,
		CacheSize:        o.CacheSize,
		MemTableSize:     o.MemTableSize,
		MaxBatchCommands: o.MaxBatchCommands,
		Logger:           o.Logger,
		StallTimeout:     o.StallTimeout,
	}
	po.EnsureDefaults()
	return po
}

// validate names the first field that is out of range: work's own here, the store's by
// pebblelog's Options.Validate, whose bounds are the ones Pebble accepts.
func (o *Options) validate() error {
	bad := func(field, msg string) error { return optionerr.New("work.Options", field, msg) }
	switch {
	case o.Sync != SyncAlways && o.Sync != SyncNever:
		return bad("Sync", fmt.Sprintf("unknown mode %d", int(o.Sync)))
	case o.MaxValueBytes < 0 || o.MaxValueBytes > maxMaxValueBytes:
		return bad("MaxValueBytes", fmt.Sprintf("must be between 1 and %d, or 0 for the default %d", maxMaxValueBytes, DefaultMaxValueBytes))
	case o.Retention < 0:
		return bad("Retention", "must not be negative (0 keeps all history)")
	case o.PruneInterval < 0:
		return bad("PruneInterval", "must not be negative (0 is the default, one minute)")
	case o.ArchiveDir != "" && strings.TrimSpace(o.ArchiveDir) == "":
		return bad("ArchiveDir", "must not be blank (\"\" means no archive)")
	}
	so := o.storeOptions()
	var oe *OptionError
	if err := so.Validate(); errors.As(err, &oe) {
		return bad(oe.Field, oe.Message) // the store's fields have the same names here
	} else if err != nil {
		return bad("", err.Error())
	}
	return nil
}
