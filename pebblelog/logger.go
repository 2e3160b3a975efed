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

// Fatalf is called by Pebble on unrecoverable errors; Pebble expects it not to return.
func (l slogLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.l.Error(msg, "component", "pebble", "fatal", true)
	panic("pebble: " + msg)
}
