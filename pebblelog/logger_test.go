package pebblelog

import "testing"

// testLogger routes the messages of a test's own pebble.Open (the WAL replay's "Found 1 WALs",
// "replayed 67 keys in 1 batches") into the test's log, printed with -v or when the test
// fails, instead of Pebble's default logger, which printed them into every test run.
type testLogger struct{ t testing.TB }

func (l testLogger) Infof(format string, args ...any) { l.t.Logf("pebble: "+format, args...) }

func (l testLogger) Errorf(format string, args ...any) { l.t.Logf("pebble error: "+format, args...) }

// Fatalf fails the test and parks the calling goroutine, which may be one of Pebble's own
// (t.Fatal may only be called from the test's goroutine).
func (l testLogger) Fatalf(format string, args ...any) {
	l.t.Errorf("pebble fatal: "+format, args...)
	select {}
}
