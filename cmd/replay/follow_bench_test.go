package main

import (
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
)

// BenchmarkFollowLine is what `replay log --follow` does per event of a busy queue, but the
// socket and the terminal: decode the event's wire bytes (into a reused Decoder, as the
// endpoint's client does) and append its text line to the reused buffer. The event is
// BenchmarkSubmit's task (work/bench_test.go: 200 bytes of JSON input). ns/op and allocs/op
// are per event; the whole follower's CPU per event is BenchmarkSubmitInspect's
// replay-cpu-µs/op.
func BenchmarkFollowLine(b *testing.B) {
	input := `{"image":"s3://worklog-bench/uploads/2026/11/30/cover-000123.png","sizes":[64,128,256,512],"format":"webp","quality":82,"owner":"user_7f3a9c2e","note":"`
	input += strings.Repeat("x", 200-len(input)-2) + `"}`
	raw, err := events.Encode(&events.TaskSubmitted{
		Header: events.Header{Seq: 123456, SessionID: "session-042", At: 1_796_000_000_123_456_789},
		TaskID: "01JF3Z8Q9K4W2N6M8P0R2T4V6X", Kind: "thumbnail", Input: []byte(input)})
	if err != nil {
		b.Fatal(err)
	}
	a := &app{}
	w := &eventWriter{a: a, seqWidth: 6, sessionWidth: 11}
	var dec events.Decoder
	b.ReportAllocs()
	for b.Loop() {
		ev, err := dec.Decode(raw, 123456)
		if err != nil {
			b.Fatal(err)
		}
		w.line = append(a.appendEventLine(w.line[:0], ev, w.seqWidth, w.sessionWidth), '\n')
	}
}
