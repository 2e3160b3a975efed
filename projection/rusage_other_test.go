//go:build !unix

package projection

import "time"

func cpuTime() time.Duration { return 0 }
