package console

import (
	"testing"
	"time"
)

// TestFmtDuration: every page writes a duration in human units, the two largest, cut down
// to whole numbers (issue 44 §2: "oldest due age 6597h27m37.916s").
func TestFmtDuration(t *testing.T) {
	const day = 24 * time.Hour
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0 ms"},
		{300 * time.Microsecond, "< 1 ms"},
		{time.Millisecond, "1 ms"},
		{850*time.Millisecond + 900*time.Microsecond, "850 ms"},
		{999 * time.Millisecond, "999 ms"},
		{time.Second, "1 s"},
		{4250 * time.Millisecond, "4.2 s"},
		{9999 * time.Millisecond, "9.9 s"},
		{10 * time.Second, "10 s"},
		{59*time.Second + 999*time.Millisecond, "59 s"},
		{time.Minute, "1 min"},
		{3*time.Minute + 12*time.Second + 916*time.Millisecond, "3 min 12 s"},
		{59*time.Minute + 59*time.Second, "59 min 59 s"},
		{time.Hour, "1 h"},
		{5*time.Hour + 7*time.Minute + 30*time.Second, "5 h 7 min"},
		{23*time.Hour + 59*time.Minute, "23 h 59 min"},
		{day, "1 day"},
		{day + 3*time.Hour + 59*time.Minute, "1 day 3 h"},
		{2*day + 3*time.Hour, "2 days 3 h"},
		{10 * day, "10 days"},
		{6597*time.Hour + 27*time.Minute + 37916*time.Millisecond, "274 days"},
		{-(3*time.Minute + 12*time.Second), "-3 min 12 s"},
	} {
		if got := fmtDuration(c.d); got != c.want {
			t.Errorf("fmtDuration(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
