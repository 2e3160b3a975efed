package work

import (
	"fmt"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/pebblelog"
)

// TestOptionsTable: every out-of-range field of Options is refused by validate, before
// anything is touched, with an *OptionError naming work.Options and the field; every zero
// field takes its documented default.
func TestOptionsTable(t *testing.T) {
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{Sync: SyncMode(2)}, "Sync"},
		{Options{Sync: -1}, "Sync"},
		{Options{MaxValueBytes: -1}, "MaxValueBytes"},
		{Options{MaxValueBytes: maxMaxValueBytes + 1}, "MaxValueBytes"},
		{Options{CacheSize: -1}, "CacheSize"},
		{Options{CacheSize: pebblelog.MaxCacheSize + 1}, "CacheSize"},
		{Options{MemTableSize: pebblelog.MinMemTableSize - 1}, "MemTableSize"},
		{Options{MemTableSize: pebblelog.MaxMemTableSize + 1}, "MemTableSize"},
		{Options{MaxBatchCommands: -1}, "MaxBatchCommands"},
		{Options{MaxBatchCommands: pebblelog.MaxMaxBatchCommands + 1}, "MaxBatchCommands"},
		{Options{Retention: -time.Nanosecond}, "Retention"},
		{Options{PruneInterval: -time.Nanosecond}, "PruneInterval"},
		{Options{ArchiveDir: " \t"}, "ArchiveDir"},
	} {
		d := c.o.withDefaults()
		optionerr.Want(t, fmt.Sprintf("%+v", c.o), d.validate(), "work.Options", c.field)
	}

	var zero Options
	d := zero.withDefaults()
	if err := d.validate(); err != nil {
		t.Fatalf("the zero Options: %v", err)
	}
	so := d.storeOptions()
	for _, c := range []struct {
		field     string
		got, want any
	}{
		{"Sync", d.Sync, SyncAlways},
		{"Sync (store)", so.NoSync, false},
		{"MaxValueBytes", d.MaxValueBytes, DefaultMaxValueBytes},
		{"CacheSize", so.CacheSize, int64(pebblelog.DefaultCacheSize)},
		{"MemTableSize", so.MemTableSize, uint64(pebblelog.DefaultMemTableSize)},
		{"MaxBatchCommands", so.MaxBatchCommands, pebblelog.DefaultMaxBatchCommands},
		{"StallTimeout", so.StallTimeout, pebblelog.DefaultStallTimeout},
		{"FS", so.FS != nil, true},
		{"Logger", so.Logger != nil, true},
		{"Retention", d.Retention, time.Duration(0)},
		{"PruneInterval", d.PruneInterval, DefaultPruneInterval},
		{"ArchiveDir", d.ArchiveDir, ""},
		{"Entropy", d.Entropy == nil, true}, // crypto/rand: the queue's (engine.Config) default
		{"NoInspect", d.NoInspect, false},   // the endpoint is served (any value is valid)
	} {
		if c.got != c.want {
			t.Errorf("default %s = %v, want %v", c.field, c.got, c.want)
		}
	}
	optionerr.FieldsCovered(t, Options{}, "Sync", "MaxValueBytes", "CacheSize", "MemTableSize", "MaxBatchCommands",
		"Logger", "StallTimeout", "FS", "Entropy", "Retention", "PruneInterval", "ArchiveDir", "NoInspect")
}
