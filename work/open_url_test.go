package work_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/worklog/worklog/work"
)

// Issue 26.5: a PostgreSQL DSN handed to Open was taken for a relative directory, and Open
// made a Pebble store in ./postgres:/…. Open refuses anything shaped like a URL with a
// scheme, naming the field dir, hinting at postgres.Open, and without echoing the DSN (it
// may hold a password). Paths that merely contain a colon still open.
func TestOpenRefusesURL(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, dsn := range []string{
		"postgres://u:secret@localhost:5432/db?search_path=q",
		"postgresql://localhost/db",
		"postgres:///db?host=/run/postgresql",
		"postgres:db",
		"POSTGRES://localhost/db",
		"file:///var/lib/worklog",
		"s3://bucket/queue",
	} {
		q, err := work.Open(dsn, nil)
		if err == nil {
			q.Close()
			t.Errorf("Open(%q) opened a store", dsn)
			continue
		}
		var we *work.Error
		if !errors.As(err, &we) || !errors.Is(err, work.ErrInvalidRequest) || we.Field != "dir" {
			t.Errorf("Open(%q): err = %v, want ErrInvalidRequest naming the field dir", dsn, err)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): the error shows the DSN's password: %v", dsn, err)
		}
		if strings.HasPrefix(strings.ToLower(dsn), "postgres") && !strings.Contains(err.Error(), "postgres.Open") {
			t.Errorf("Open(%q): err = %v, want a hint to use postgres.Open", dsn, err)
		}
	}
	if names, _ := os.ReadDir("."); len(names) != 0 {
		t.Errorf("refused Opens left %v in the working directory", names)
	}
	// A colon is a legal character of a directory name; only a scheme followed by // (or a
	// postgres scheme) is a URL.
	for _, dir := range []string{"data:2024", filepath.Join(t.TempDir(), "a:b"), "C:store"} {
		q, err := work.Open(dir, nil)
		if err != nil {
			t.Errorf("Open(%q): %v", dir, err)
			continue
		}
		q.Close()
	}
}
