package work

import (
	"context"
	"os"
	"strconv"
	"sync"

	"github.com/worklog/worklog/events"
)

// WithWorker returns a context under which every claim (ClaimDue, ClaimKinds, ClaimWakes,
// SettleAndClaim and their At twins) records worker as the identity of whoever claimed, in
// its claim event and in the delivery's Worker field, so that the log tells which process
// ran each attempt. worker must be 1 to 256 bytes, else the claim fails with
// ErrInvalidRequest (field "worker"). Without it a claim records DefaultWorker().
func WithWorker(ctx context.Context, worker string) context.Context {
	return context.WithValue(ctx, workerKey{}, worker)
}

type workerKey struct{}

// DefaultWorker is the worker identity of a claim whose context names none:
// "<host name>:<process id>", cut to 256 bytes. It is read once per process.
func DefaultWorker() string { return defaultWorker() }

var defaultWorker = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	pid := ":" + strconv.Itoa(os.Getpid())
	if len(host)+len(pid) > events.MaxWorker {
		host = host[:events.MaxWorker-len(pid)]
	}
	return host + pid
})

// workerOf is the worker identity a claim under ctx records: WithWorker's, or the default.
// The queue validated it (validateWorker) before the backend reads it.
func workerOf(ctx context.Context) string {
	if w, ok := ctx.Value(workerKey{}).(string); ok {
		return w
	}
	return defaultWorker()
}

// validateWorker checks the identity WithWorker put in ctx, if any.
func validateWorker(ctx context.Context) error {
	w, ok := ctx.Value(workerKey{}).(string)
	switch {
	case !ok:
		return nil
	case w == "":
		return invalid("worker", "must not be empty")
	case len(w) > events.MaxWorker:
		return invalid("worker", "is "+strconv.Itoa(len(w))+" bytes, longer than "+strconv.Itoa(events.MaxWorker))
	}
	return nil
}
