package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/work"
)

// TestOptionsTable: every out-of-range field of Options is refused by Open, before it
// connects, with a *work.OptionError naming postgres.Options and the field; every zero field
// takes its documented default.
func TestOptionsTable(t *testing.T) {
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{MaxValueBytes: -1}, "MaxValueBytes"},
		{Options{MaxValueBytes: maxMaxValueBytes + 1}, "MaxValueBytes"},
		{Options{MaxBatchCommands: -1}, "MaxBatchCommands"},
		{Options{MaxConns: -1}, "MaxConns"},
		{Options{MaxConns: 1}, "MaxConns"},
		{Options{CommitResolveTimeout: -time.Nanosecond}, "CommitResolveTimeout"},
		{Options{WriteTimeout: -time.Nanosecond}, "WriteTimeout"},
		{Options{CloseTimeout: -time.Nanosecond}, "CloseTimeout"},
		{Options{Retention: -time.Nanosecond}, "Retention"},
		{Options{PruneInterval: -time.Nanosecond}, "PruneInterval"},
		{Options{SharedWriterAddr: "no port"}, "SharedWriterAddr"},
	} {
		// No server listens at this address: a refusal must come before any connection.
		_, err := Open(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", &c.o)
		optionerr.Want(t, fmt.Sprintf("Open with %+v", c.o), err, "postgres.Options", c.field)
	}

	d := (*Options)(nil).withDefaults()
	if err := d.validate(); err != nil {
		t.Fatalf("the zero Options: %v", err)
	}
	for _, c := range []struct {
		field     string
		got, want any
	}{
		{"MaxValueBytes", d.MaxValueBytes, work.DefaultMaxValueBytes},
		{"Entropy", d.Entropy == nil, true}, // crypto/rand: the queue's (engine.Config) default
		{"MaxBatchCommands", d.MaxBatchCommands, 256},
		{"MaxConns", d.MaxConns, int32(8)},
		{"CommitResolveTimeout", d.CommitResolveTimeout, 30 * time.Second},
		{"WriteTimeout", d.WriteTimeout, 30 * time.Second},
		{"CloseTimeout", d.CloseTimeout, 10 * time.Second},
		{"Retention", d.Retention, time.Duration(0)},
		{"PruneInterval", d.PruneInterval, work.DefaultPruneInterval},
		{"Logger", d.Logger == nil, true}, // discarded: the pruner's default
		{"SharedWriter", d.SharedWriter, false},
		{"SharedWriterAddr", d.SharedWriterAddr, "127.0.0.1:0"},
	} {
		if c.got != c.want {
			t.Errorf("default %s = %v, want %v", c.field, c.got, c.want)
		}
	}
	optionerr.FieldsCovered(t, Options{}, "MaxValueBytes", "Entropy", "MaxBatchCommands", "MaxConns",
		"CommitResolveTimeout", "WriteTimeout", "CloseTimeout", "Retention", "PruneInterval", "Logger",
		"SharedWriter", "SharedWriterAddr")
}
