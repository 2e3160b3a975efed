package events

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode: Decode never panics, fails only with a *DecodeError of a known kind, and an
// event it accepts encodes, and decodes again to the same event and the same bytes. It also
// agrees with the reference decoder (refdecode_test.go) on every input.
//
// Every input is decoded twice: as it is, and with its checksum recomputed, so that the
// fuzzer's mutations reach the body parser instead of stopping at the CRC.
//
//	go test ./events -run XXX -fuzz FuzzDecode -fuzztime 30s
func FuzzDecode(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.bin"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, b := range [][]byte{
		nil,
		{1},
		{1, 1, 1, 0x90, 0, 0, 0, 0},
		{1, 4, 1, 0x94, 0x01, 0xa1, 's', 0x00, 0xa1, 't', 0, 0, 0, 0},
		bytes.Repeat([]byte{0xff}, 40),
		bytes.Repeat([]byte{0x91}, 64),
	} {
		f.Add(b)
	}
	r := rand.New(rand.NewPCG(7, 7))
	for range 8 {
		b := make([]byte, 8+r.IntN(64))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		b[0] = EnvelopeV1
		b[1] = byte(AllTypes()[r.IntN(len(AllTypes()))]) // a known type: the body is what is random
		b[2] = 1
		f.Add(b)
	}
	g := newGen(3)
	for _, typ := range AllTypes() {
		f.Add(mustEncode(f, g.event(typ, 0)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b)
		sameDecode(t, b, 0)
		if len(b) >= trailerLen {
			c := withCRC(b)
			checkDecode(t, c)
			sameDecode(t, c, 0)
			sameDecode(t, c, 5)
		}
	})
}

func checkDecode(t *testing.T, b []byte) {
	t.Helper()
	in := bytes.Clone(b)
	ev, err := Decode(b, 0)
	if !bytes.Equal(in, b) {
		t.Fatal("Decode changed its input")
	}
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("error %T is not a *DecodeError: %v", err, err)
		}
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownType) && !errors.Is(err, ErrUnknownVersion) {
			t.Fatalf("error of unknown kind: %v", err)
		}
		if ev != nil {
			t.Fatalf("Decode returned an event with its error %v", err)
		}
		if de.Field == "" {
			t.Fatalf("error names no field: %v", err)
		}
		return
	}
	enc, err := Encode(ev)
	if err != nil {
		t.Fatalf("decoded %#v does not encode: %v", ev, err)
	}
	ev2, err := Decode(enc, ev.Head().Seq)
	if err != nil {
		t.Fatalf("re-encoding of %#v does not decode: %v", ev, err)
	}
	if !eventsEqual(ev, ev2) {
		t.Fatalf("re-encoding changed the event:\n first  %#v\n second %#v", ev, ev2)
	}
	if enc2 := mustEncode(t, ev2); !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding not canonical:\n %x\n %x", enc, enc2)
	}
}
