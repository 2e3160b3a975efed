package narrate

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/replayjson"
)

// appendCases are inputs on both sides of the fast paths' edges: JSON that compactASCII
// takes, JSON it leaves to encoding/json (non-ASCII, deep nesting), and bytes that are not
// JSON at all, which must come out as encoding/json makes them (a JSON string).
var appendCases = []string{
	``, `null`, `true`, `false`, `0`, `-0`, `01`, `-`, `1.`, `1.5e`, `1.5e+7`, `-12.25E-3`, `1x`,
	` { "a" : [ 1 , 2 , { } , [ ] ] , "b" : "x y" } `, `{"a":1,}`, `[1,]`, `{"a" 1}`, `{1:2}`,
	`"\u00e9\n\"\\\/\b\f\r\t"`, `"aé"`, `"\u00zz"`, `"\x"`, "\"tab\there\"", `"é"`, "\xff", `"\u2028"`,
	`<a&b>`, `{"html":"<b>&amp;</b>"}`, "{\"del\":\"\x7f\"}", `truex`, `nul`, `key=value`, `two words`, `back\slash`, "bell\a", `[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]`,
	strings.Repeat("[", 65) + strings.Repeat("]", 65), strings.Repeat("[", 64) + strings.Repeat("]", 64),
	`{"image":"s3://bucket/path/to/an/image/that/is/long.png","sizes":[64,128,256,512],"crop":true,"quality":0.85}`,
	"\t\n\r 7 \r\n\t", `"unterminated`, `[1 2]`, `{"a":1 "b":2}`, `tru`, `[-]`, `-01`, `0.e1`,
}

// TestAppendFormsAsStrings: each Append form writes exactly what its string form returns,
// after what the buffer held.
func TestAppendFormsAsStrings(t *testing.T) {
	for _, in := range appendCases {
		checkAppendForms(t, in)
	}
}

// FuzzAppendForms is TestAppendFormsAsStrings on any input (go test -fuzz FuzzAppendForms).
func FuzzAppendForms(f *testing.F) {
	for _, in := range appendCases {
		f.Add(in)
	}
	f.Fuzz(func(t *testing.T, in string) { checkAppendForms(t, in) })
}

func checkAppendForms(t *testing.T, in string) {
	t.Helper()
	for _, max := range []int{0, 3, 50, 80, 1000} {
		want := cut(string(replayjson.Value([]byte(in))), max) // ShortJSON as it was written first
		if got := string(AppendShortJSON([]byte("x "), []byte(in), max)); got != "x "+want {
			t.Fatalf("AppendShortJSON(%q, %d) = %q, want %q", in, max, got, "x "+want)
		}
		if got := ShortJSON([]byte(in), max); got != want {
			t.Fatalf("ShortJSON(%q, %d) = %q, want %q", in, max, got, want)
		}
	}
	if got := string(AppendWord([]byte("x "), in)); got != "x "+Word(in) {
		t.Fatalf("AppendWord(%q) = %q, want %q", in, got, "x "+Word(in))
	}
	checkAppendTime(t, int64(len(in))*1_234_567_891_011)
	for _, c := range []byte(in) {
		checkAppendTime(t, int64(c)*-987_654_321_012_345_67)
	}
}

func checkAppendTime(t *testing.T, ns int64) {
	t.Helper()
	if got := string(AppendTime([]byte("x "), ns)); got != "x "+Time(ns) {
		t.Fatalf("AppendTime(%d) = %q, want %q", ns, got, "x "+Time(ns))
	}
}

// TestAppendTimeEdges: the first and last instants of int64 nanoseconds, the epoch, a leap
// day and the last millisecond of a year.
func TestAppendTimeEdges(t *testing.T) {
	for _, ns := range []int64{math.MinInt64, math.MaxInt64, 0, -1, 1, 999_999, 1_000_000,
		time.Date(2024, 2, 29, 23, 59, 59, 999_999_999, time.UTC).UnixNano(),
		time.Date(1999, 12, 31, 23, 59, 59, 999_000_000, time.UTC).UnixNano(),
		time.Date(1969, 12, 31, 23, 59, 59, 1, time.UTC).UnixNano()} {
		checkAppendTime(t, ns)
	}
}
