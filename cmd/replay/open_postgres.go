package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/worklog/worklog/postgres"
)

// isPostgresURL reports whether a store argument names a PostgreSQL queue rather than a
// directory.
func isPostgresURL(arg string) bool {
	return strings.HasPrefix(arg, "postgres://") || strings.HasPrefix(arg, "postgresql://")
}

// rawURLs maps the name replay prints for a PostgreSQL URL (its password masked) back to the
// URL itself, which only openStore sees.
var rawURLs sync.Map

// displayName is how replay names a store argument in its output and errors: a directory as
// given, a PostgreSQL URL with its password and every other secret replaced by xxxxx
// (redactDSN; put the password in PGPASSWORD or ~/.pgpass instead, which pgx reads, and
// nothing is masked).
func displayName(arg string) string {
	name := redactDSN(arg)
	if name != arg && isPostgresURL(arg) {
		rawURLs.Store(name, arg)
	}
	return name
}

// openPostgres opens the queue name (displayName of a postgres:// URL) through one read-only
// snapshot, and turns every way that can fail into one sentence naming it.
func openPostgres(name string) (store, error) {
	dsn := name
	if raw, ok := rawURLs.Load(name); ok {
		dsn = raw.(string)
	}
	ctx := context.Background()
	r, err := postgres.OpenReadOnly(ctx, dsn)
	if err == nil {
		return r, nil
	}
	// pgx masks the passwords it quotes; a message that quotes the URL another way is
	// masked here too, so that no secret reaches the output whatever the error.
	msg := strings.ReplaceAll(err.Error(), dsn, name)
	switch {
	case errors.Is(err, postgres.ErrNotAQueue):
		return nil, fmt.Errorf("%s is not a worklog queue: %s", name, msg)
	case errors.Is(err, postgres.ErrFormatTooNew):
		return nil, fmt.Errorf("%s was written by a newer worklog: %s: build replay from that worklog version or later", name, msg)
	case errors.Is(err, postgres.ErrInvalidDSN):
		return nil, fmt.Errorf("%s: %s", name, msg)
	}
	return nil, fmt.Errorf("cannot read the queue at %s: %s", name, msg)
}

// pgFormat is the stats line naming a PostgreSQL queue's layout, as the marker file does for
// a Pebble store.
func pgFormat(s *postgres.Store) string {
	return fmt.Sprintf("worklog PostgreSQL format %d, schema %s", postgres.FormatVersion, s.Schema())
}
