package runner

import (
	"math/rand/v2"
	"time"
)

// ExponentialBackoff returns a backoff that doubles from base with each attempt, up to max,
// with "equal jitter": a uniformly random duration between half of that and all of it, so
// tasks that failed together do not retry together.
func ExponentialBackoff(base, max time.Duration) func(attempt uint32, err error) time.Duration {
	return func(attempt uint32, _ error) time.Duration {
		d := base
		for i := uint32(1); i < attempt && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		if d <= 1 {
			return d
		}
		half := d / 2
		return half + rand.N(d-half+1)
	}
}
