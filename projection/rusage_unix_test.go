//go:build unix

package projection

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user and system) this process has used: on a shared machine a
// benchmark's wall time overstates its cost, its CPU time does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
