package work

import (
	"reflect"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
)

// TestInboxRequestRoundTrip: every field of TaskRequest survives an inbox row (inboxEvent,
// the codec, requestOf), so a field added to TaskRequest (priority, headers) and not carried
// by the inbox fails here. Each field is set to a value other than its zero.
func TestInboxRequestRoundTrip(t *testing.T) {
	var r TaskRequest
	v := reflect.ValueOf(&r).Elem()
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		switch {
		case sf.Name == "Input":
			f.SetBytes([]byte(`{"a":1}`))
		case sf.Name == "Kind":
			f.SetString("kind")
		case sf.Name == "Wake":
			f.SetInt(int64(WakeOnCompletion))
		case f.Type() == reflect.TypeOf(time.Time{}):
			f.Set(reflect.ValueOf(time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)))
		case f.Kind() == reflect.String:
			f.SetString("v-" + sf.Name)
		case f.CanInt():
			f.SetInt(3)
		case f.CanUint():
			f.SetUint(3)
		case f.Kind() == reflect.Map && f.Type().Key().Kind() == reflect.String && f.Type().Elem().Kind() == reflect.String:
			f.Set(reflect.ValueOf(map[string]string{"h": "v"}).Convert(f.Type()))
		default:
			t.Fatalf("TaskRequest.%s (%s): teach this test a non-zero value, and the inbox (inboxEvent, requestOf) the field", sf.Name, f.Type())
		}
	}
	b := &logBackend{maxValue: DefaultMaxValueBytes, clock: func() time.Time { return time.Unix(1e9, 0) }}
	b.ids = newIDSource(nil)
	sub, err := b.encodeInbox("s1", &r)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(sub.Body, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := requestOf(ev.(*events.TaskSubmitted))
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("through the inbox:\n got %+v\nwant %+v", got, r)
	}
	if ev.(*events.TaskSubmitted).TaskID != sub.Task.(Task).ID || sub.Task.(Task).ID == "" {
		t.Fatalf("the row's task %q, the answer's %q", ev.(*events.TaskSubmitted).TaskID, sub.Task.(Task).ID)
	}
	if _, err := b.encodeInbox("s1", &TaskRequest{Kind: "k"}); err != nil {
		t.Fatalf("a request without a key: %v", err)
	}
}
