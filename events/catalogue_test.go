package events

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The tests of this file hold the catalogue (events.go) and every place in this package that
// must know each event type to each other, so that adding a type to the catalogue and
// forgetting one of those places fails here, naming the place. docs/design.md §8 is the
// whole checklist; projection, work and cmd/replay have the same kind of test for theirs.

var snakeName = regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)

func TestCatalogueWellFormed(t *testing.T) {
	rows := Types()
	if len(rows) == 0 {
		t.Fatal("the catalogue is empty")
	}
	names := map[string]Type{}
	for i, r := range rows {
		if r.Type == 0 {
			t.Errorf("row %d (%s): type number 0 is reserved", i, r.Name)
		}
		if i > 0 && rows[i-1].Type >= r.Type {
			t.Errorf("row %d (%s): numbers must be increasing and unique, %d follows %d", i, r.Name, r.Type, rows[i-1].Type)
		}
		if !snakeName.MatchString(r.Name) {
			t.Errorf("type %d: name %q is not snake_case", r.Type, r.Name)
		}
		if other, dup := names[r.Name]; dup {
			t.Errorf("types %d and %d are both named %q", other, r.Type, r.Name)
		}
		names[r.Name] = r.Type
		if r.Subject != SubjectTask && r.Subject != SubjectWake && r.Subject != SubjectSchedule && r.Subject != SubjectKind {
			t.Errorf("%s: subject %s is neither task, wake, schedule nor kind", r.Name, r.Subject)
		}
		if r.Doc == "" || strings.Contains(r.Doc, "\n") {
			t.Errorf("%s: Doc must be one non-empty line for help texts, got %q", r.Name, r.Doc)
		}
	}
	// Everything that lists or names types agrees with the table.
	all := AllTypes()
	if len(all) != len(rows) {
		t.Fatalf("AllTypes() has %d types, the catalogue %d", len(all), len(rows))
	}
	known := 0
	for n := 0; n < 256; n++ {
		if Type(n).Known() {
			known++
		}
	}
	if known != len(rows) {
		t.Errorf("%d type numbers are Known, the catalogue has %d rows", known, len(rows))
	}
	for i, r := range rows {
		if all[i] != r.Type || !r.Type.Known() || r.Type.String() != r.Name {
			t.Errorf("row %s: AllTypes()[%d] = %d, Known %v, String %q", r.Name, i, all[i], r.Type.Known(), r.Type.String())
		}
		if got, ok := TypeByName(r.Name); !ok || got != r.Type {
			t.Errorf("TypeByName(%q) = %d, %v", r.Name, got, ok)
		}
		if info, ok := r.Type.Info(); !ok || info != r {
			t.Errorf("%s.Info() = %+v, %v", r.Name, info, ok)
		}
	}
	if _, ok := Type(0).Info(); ok {
		t.Error("Type(0).Info() reports a known type")
	}
}

// eventOf is one event of type typ, from the golden fixture of its current schema version.
func eventOf(t *testing.T, typ Type) Event {
	t.Helper()
	f, ok := currentFixtures(t)[typ]
	if !ok {
		t.Fatalf("%s: no golden fixture of its current schema version: add one to goldenFixtures "+
			"(golden_test.go) and run go test ./events -run Golden -update", typ)
	}
	return f.ev
}

// catch runs fn and turns a panic into an error: a switch of the codec that lacks a type's
// case may dereference the nil event it leaves behind.
func catch(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	fn()
	return nil
}

// TestEveryTypeEverywhere walks every type of the catalogue through every place of package
// events that must know it. Each failure names the place to add the type to.
func TestEveryTypeEverywhere(t *testing.T) {
	g := newGen(7)
	for _, info := range Types() {
		typ := info.Type
		t.Run(info.Name, func(t *testing.T) {
			// The schema version (codec.go, schemaVersion).
			if int(typ) >= len(schemaVersion) || schemaVersion[typ] == 0 {
				t.Fatalf("%s has no schema version: add it to schemaVersion in codec.go (1 for a new type)", typ)
			}
			// The golden files of every schema version it can read (golden_test.go).
			for v := uint8(1); v <= schemaVersion[typ]; v++ {
				if _, err := os.Stat(filepath.Join(goldenDir, goldenName(typ, v)+".bin")); err != nil {
					t.Errorf("%s: no golden file for schema version %d: add a fixture and run go test ./events -run Golden -update", typ, v)
				}
			}
			// The field names of the .hex dumps and decode errors (golden_test.go).
			ev := eventOf(t, typ)
			if ev.Type() != typ {
				t.Fatalf("the fixture of %s is a %s", typ, ev.Type())
			}
			b, err := Encode(ev)
			if err != nil {
				t.Fatalf("Encode: %v (add a case to the switch of Append in codec.go)", err)
			}
			_, elems, _, err := msgpackValues(b[headerLen : len(b)-trailerLen])
			if err != nil {
				t.Fatal(err)
			}
			if names := fieldNames(typ); len(names) != len(elems) {
				t.Errorf("bodyFieldNames[%s] (golden_test.go) names %d fields with the header, the encoding has %d", typ, len(names), len(elems))
			}

			// The subject slot matches the catalogue's Subject (events.go, Subject methods).
			taskID, wakeID := ev.Subject()
			if (info.Subject == SubjectTask) != (taskID != "") || (info.Subject == SubjectWake) != (wakeID != "") ||
				(info.Subject == SubjectSchedule) != (ScheduleName(ev) != "" && taskID == "") {
				t.Errorf("the catalogue says %s is a %s event, but Subject() = (%q, %q)", typ, info.Subject, taskID, wakeID)
			}

			// Decode and the reusing Decoder (codec.go, decode), and the reference decoder
			// (refdecode_test.go), on the golden event and on random ones (roundtrip_test.go, gen.event).
			var d Decoder
			var ref Event
			if err := catch(func() { ref, err = refDecode(b, 0) }); err != nil || !eventsEqual(ref, ev) {
				t.Errorf("refDecode (refdecode_test.go) of %s: %v, %#v: add the type's case", typ, err, ref)
			}
			evs := []Event{ev}
			if err := catch(func() {
				for range 50 {
					evs = append(evs, g.event(typ, 0))
				}
			}); err != nil {
				t.Fatalf("gen.event (roundtrip_test.go) has no case for %s: %v", typ, err)
			}
			for _, want := range evs {
				b, err := Encode(want)
				if err != nil {
					t.Fatalf("Encode(%#v): %v", want, err)
				}
				var got, reused Event
				var err1, err2 error
				if perr := catch(func() { got, err1 = Decode(b, 0); reused, err2 = d.Decode(b, 0) }); perr != nil {
					t.Fatalf("Decode of a %s: %v: add its case to the switch of decode in codec.go", typ, perr)
				}
				if err1 != nil || err2 != nil {
					t.Fatalf("Decode of a %s: %v; Decoder: %v", typ, err1, err2)
				}
				if !eventsEqual(got, want) || !eventsEqual(reused, want) {
					t.Fatalf("round trip of a %s:\n got  %#v\n Decoder %#v\n want %#v", typ, got, reused, want)
				}
			}

			// LeaseToken (events.go) returns the token of every type that carries one.
			want := ""
			if f := reflect.ValueOf(ev).Elem().FieldByName("LeaseToken"); f.IsValid() {
				want = f.String()
				if want == "" {
					t.Fatalf("the fixture of %s has an empty LeaseToken: give it one", typ)
				}
			}
			if got := LeaseToken(ev); got != want {
				t.Errorf("LeaseToken(%s) = %q, want %q: add the type to LeaseToken's switch in events.go", typ, got, want)
			}
		})
	}
}

// TestDesignTableListsEveryType: docs/events.md has a row for every type, with its number,
// name and subject, and no row for a type the catalogue does not have.
func TestDesignTableListsEveryType(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "events.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| (\\d+) \\| `([a-z_]+)` \\| (task|wake|schedule|kind) \\|")
	rows := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		rows[m[2]] = m[1] + " " + m[3]
	}
	for _, info := range Types() {
		want := fmt.Sprintf("%d %s", info.Type, info.Subject)
		if got, ok := rows[info.Name]; !ok {
			t.Errorf("docs/events.md has no row for %s: add | %d | `%s` | %s | ... |", info.Name, info.Type, info.Name, info.Subject)
		} else if got != want {
			t.Errorf("docs/events.md says %s is %q, the catalogue %q", info.Name, got, want)
		}
		delete(rows, info.Name)
	}
	for name := range rows {
		t.Errorf("docs/events.md has a row for %s, which the catalogue does not have", name)
	}
}
