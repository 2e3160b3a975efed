package pebblelog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Each option out of range is refused with ErrInvalidOptions naming the field, before the
// directory is touched: a missing directory is not created, an existing store is unchanged.
// MemTableSize below Pebble's minimum used to panic inside pebble.Open, after the marker and
// the lock files were written.
func TestOpenInvalidOptions(t *testing.T) {
	store := t.TempDir()
	s := openT(t, store, nil)
	seedStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before := listing(t, store)
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{CacheSize: -1}, "CacheSize"},
		{Options{CacheSize: MaxCacheSize + 1}, "CacheSize"},
		{Options{MemTableSize: 1}, "MemTableSize"},
		{Options{MemTableSize: 1000}, "MemTableSize"},
		{Options{MemTableSize: MinMemTableSize - 1}, "MemTableSize"},
		{Options{MemTableSize: MaxMemTableSize + 1}, "MemTableSize"},
		{Options{MemTableSize: 4 << 30}, "MemTableSize"},
		{Options{MaxBatchCommands: -1}, "MaxBatchCommands"},
		{Options{MaxBatchCommands: MaxMaxBatchCommands + 1}, "MaxBatchCommands"},
	} {
		err := c.o.Validate()
		var oe *OptionError
		if !errors.Is(err, ErrInvalidOptions) || !errors.As(err, &oe) || oe.Options != "pebblelog.Options" || oe.Field != c.field {
			t.Errorf("Validate(%+v) = %#v, want an OptionError naming pebblelog.Options.%s", c.o, err, c.field)
		}
		for _, ro := range []bool{false, true} {
			o := c.o
			o.ReadOnly = ro
			missing := filepath.Join(t.TempDir(), "a", "store")
			for _, dir := range []string{missing, store} {
				_, err := Open(dir, &o)
				oe := wantOpenErr(t, err, ErrInvalidOptions, dir)
				var opt *OptionError
				if oe.Field != c.field || !strings.Contains(err.Error(), c.field) || !errors.As(err, &opt) || opt.Field != c.field {
					t.Errorf("Open(%+v) = %v, want the field %s named, the OptionError wrapped", o, err, c.field)
				}
			}
			if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
				t.Errorf("Open with %+v created %s", o, filepath.Dir(missing))
			}
			if after := listing(t, store); !slices.Equal(before, after) {
				t.Errorf("Open with %+v changed the store:\nbefore %q\nafter  %q", o, before, after)
			}
		}
	}
	// The bounds themselves are fine, and so are the zero values (the defaults).
	for _, o := range []Options{
		{},
		{MemTableSize: MinMemTableSize},
		{MemTableSize: MaxMemTableSize, CacheSize: 1},
		{MaxBatchCommands: 1, RecordCacheSize: -1},
		{MaxBatchCommands: MaxMaxBatchCommands},
	} {
		if err := o.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", o, err)
		}
		s := openT(t, t.TempDir(), &o)
		seedStore(t, s)
		mustVerify(t, s)
		s.Close()
	}
}

// Open takes defaults from EnsureDefaults and leaves the caller's Options alone.
func TestOpenOptionsDefaults(t *testing.T) {
	var o Options
	o.EnsureDefaults()
	if o.FS == nil || o.Logger == nil || o.CacheSize != DefaultCacheSize || o.MemTableSize != DefaultMemTableSize ||
		o.MaxBatchCommands != DefaultMaxBatchCommands || o.RecordCacheSize != DefaultRecordCacheSize ||
		o.StallTimeout != DefaultStallTimeout || o.NoSync || o.ReadOnly {
		t.Errorf("EnsureDefaults gave %+v", o)
	}
	fieldsCovered(t, Options{}, "FS", "NoSync", "ReadOnly", "CacheSize", "MemTableSize",
		"MaxBatchCommands", "RecordCacheSize", "Logger", "StallTimeout")
	mine := Options{MaxBatchCommands: 7}
	s := openT(t, t.TempDir(), &mine)
	if mine != (Options{MaxBatchCommands: 7}) {
		t.Errorf("Open changed the caller's options: %+v", mine)
	}
	if s.opts.MaxBatchCommands != 7 || s.opts.CacheSize != DefaultCacheSize {
		t.Errorf("the store runs with %+v", s.opts)
	}
}

// Metrics and DiskUsage after Close return ErrClosed instead of reaching a closed database.
func TestMetricsAfterClose(t *testing.T) {
	s := openT(t, t.TempDir(), nil)
	seedStore(t, s)
	if n, err := s.DiskUsage(context.Background()); err != nil || n == 0 {
		t.Fatalf("DiskUsage = %d, %v", n, err)
	}
	if m, err := s.Metrics(); err != nil || m == nil {
		t.Fatalf("Metrics = %v, %v", m, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DiskUsage(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("DiskUsage after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Metrics(); !errors.Is(err, ErrClosed) {
		t.Errorf("Metrics after Close = %v, want ErrClosed", err)
	}
}

// fieldsCovered is internal/optionerr.FieldsCovered, which this package's tests cannot import
// (optionerr imports pebblelog: OptionError is declared here).
func fieldsCovered(t *testing.T, v any, covered ...string) {
	t.Helper()
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		if f := rt.Field(i).Name; !slices.Contains(covered, f) {
			t.Errorf("%s.%s is in no case of its table test: add its refusals and its default", rt.Name(), f)
		}
	}
}
