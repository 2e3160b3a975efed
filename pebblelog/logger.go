package pebblelog

import (
	"fmt"
	"log/slog"
)

// slogLogger adapts slog to Pebble's logger.
type slogLogger struct{ l *slog.Logger }

func (l slogLogger) Infof(format string, args ...any) {
	l.l.Info(fmt.Sprintf(format, args...), "component", "pebble")
}

func (l slogLogger) Errorf(format string, args ...any) {
	l.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf is called by Pebble on errors it cannot recover from; Pebble expects it not to
// return. It must not end the host process either, so it logs and parks the calling goroutine
// for good. A store's own Pebble instance never gets here: Open installs fatalLogger
// (failure.go), which fails the store first and returns where Pebble copes with that. This
// one serves Pebble instances without a store, such as Verify's scratch copy.
func (l slogLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.l.Error(msg, "component", "pebble", "fatal", true)
	select {}
}
