package work

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestSameJSON(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{`null`, `null`, true},
		{` null `, `null`, true},
		{`{"a":1,"b":2}`, `{ "b" : 2, "a" : 1 }`, true},
		{`{"a":{"x":[1,{"y":2,"z":3}]}}`, `{"a":{"x":[1,{"z":3,"y":2}]}}`, true},
		{`"A"`, `"\u0041"`, true},
		{`"<&>"`, `"\u003c\u0026\u003e"`, true},
		{`{"a":1,"a":2}`, `{"a":2}`, true}, // the last duplicate wins, as in serde_json
		{`1`, `1.0`, false},
		{`1e2`, `100`, false},
		{`0`, `-0`, false},
		{`[1,2]`, `[2,1]`, false},
		{`{"a":1}`, `{"a":1,"b":null}`, false},
		{`null`, `{}`, false},
		{`""`, `null`, false},
		{`true`, `"true"`, false},
		{`12345678901234567890123`, `12345678901234567890124`, false},
	} {
		if got := sameJSON([]byte(c.a), []byte(c.b)); got != c.same {
			t.Errorf("sameJSON(%s, %s) = %v, want %v", c.a, c.b, got, c.same)
		}
		if got := sameJSON([]byte(c.b), []byte(c.a)); got != c.same {
			t.Errorf("sameJSON(%s, %s) = %v, want %v", c.b, c.a, got, c.same)
		}
	}
	// An empty stored value reads as null.
	if !sameJSON(nil, []byte("null")) {
		t.Error("an empty value is not null")
	}
}

func TestLeaseExpiry(t *testing.T) {
	if got, err := leaseExpiry(100, time.Second); err != nil || got != 100+int64(time.Second) {
		t.Errorf("leaseExpiry(100, 1s) = %d, %v", got, err)
	}
	if got, err := leaseExpiry(math.MaxInt64-10, 10); err != nil || got != math.MaxInt64 {
		t.Errorf("a lease ending at the last instant = %d, %v", got, err)
	}
	for _, c := range []struct {
		now int64
		d   time.Duration
	}{{math.MaxInt64 - 10, 11}, {math.MaxInt64, 1}, {1, math.MaxInt64}} {
		if _, err := leaseExpiry(c.now, c.d); err == nil || err.Field != "lease_for" {
			t.Errorf("leaseExpiry(%d, %d) = %v, want an invalid lease_for", c.now, c.d, err)
		}
	}
	if got, err := leaseExpiry(math.MinInt64, math.MaxInt64); err != nil || got != -1 {
		t.Errorf("a lease from the first instant = %d, %v", got, err)
	}
}

func TestNanosRange(t *testing.T) {
	for _, ok := range []time.Time{time.Unix(0, 0), minTime, maxTime, time.Date(2262, 4, 11, 0, 0, 0, 0, time.UTC)} {
		if _, err := nanos("now", ok); err != nil {
			t.Errorf("nanos(%v) = %v", ok, err)
		}
	}
	for _, bad := range []time.Time{{}, maxTime.Add(1), minTime.Add(-1), time.Date(2263, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if _, err := nanos("run_at", bad); err == nil || err.Field != "run_at" {
			t.Errorf("nanos(%v) = %v, want an invalid run_at", bad, err)
		}
	}
	if got := fromNanos(int64(1500 * time.Millisecond)); !got.Equal(time.Unix(1, 5e8)) || got.Location() != time.UTC {
		t.Errorf("fromNanos = %v", got)
	}
}

func TestBlank(t *testing.T) {
	for _, s := range []string{"", " ", "\t\n\v\f\r", "\u0085", "\u00a0", "\u1680", "\u2000\u200a", "\u2028\u2029", "\u202f", "\u205f", "\u3000"} {
		if !blank(s) {
			t.Errorf("blank(%q) = false", s)
		}
	}
	for _, s := range []string{"a", " a ", "\u200b", "\ufeff", "-"} {
		if blank(s) {
			t.Errorf("blank(%q) = true", s)
		}
	}
}

// Text fields are bounded too, so that no single value can grow a record without limit.
func TestTextLimits(t *testing.T) {
	long := strings.Repeat("x", maxTextBytes+1)
	fits := strings.Repeat("x", maxTextBytes)
	if err := validateTaskRequest(&TaskRequest{Kind: long}, DefaultMaxValueBytes); err == nil || err.Field != "kind" {
		t.Errorf("a long kind: %v", err)
	}
	if err := validateTaskRequest(&TaskRequest{Kind: fits, IdempotencyKey: fits}, DefaultMaxValueBytes); err != nil {
		t.Errorf("kind and key at the limit: %v", err)
	}
	if err := validateTaskRequest(&TaskRequest{Kind: "k", IdempotencyKey: long}, DefaultMaxValueBytes); err == nil || err.Field != "idempotency_key" {
		t.Errorf("a long key: %v", err)
	}
	if err := validateWakeRequest(&WakeRequest{IdempotencyKey: long}, DefaultMaxValueBytes); err == nil || err.Field != "idempotency_key" {
		t.Errorf("a long wake key: %v", err)
	}
	if err := validateNonBlank("session_id", long); err == nil || err.Field != "session_id" {
		t.Errorf("a long session id: %v", err)
	}
	for _, o := range []Outcome{SuccessWithSummary(long, nil), Failure(long)} {
		if err := validateOutcome(&o, DefaultMaxValueBytes); err == nil || err.Field != "outcome" {
			t.Errorf("a long summary or error: %v", err)
		}
	}
	for _, o := range []Outcome{SuccessWithSummary(fits, nil), Failure(fits), Failure("")} {
		if err := validateOutcome(&o, DefaultMaxValueBytes); err != nil {
			t.Errorf("an outcome within the limits: %v", err)
		}
	}
}
