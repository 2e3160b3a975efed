package msgp

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// Integers at every msgpack width boundary, both sides.
var ints = []int64{0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000,
	math.MaxInt64, -1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1,
	math.MinInt64}

// Lengths at every str, bin, array and map size-class boundary.
var lens = []int{0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536}

// ref returns what msgpack's Encoder writes for the calls of f.
func ref(t *testing.T, f func(e *msgpack.Encoder) error) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := f(msgpack.NewEncoder(&buf)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func same(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got %x, msgpack writes %x", what, got[:min(len(got), 16)], want[:min(len(want), 16)])
	}
}

// TestAppendMatchesEncoder: each append function writes exactly what the msgpack call it
// names writes, at every boundary.
func TestAppendMatchesEncoder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	vals := append([]int64{}, ints...)
	for range 1000 {
		vals = append(vals, r.Int64()>>r.IntN(64))
	}
	for _, v := range vals {
		same(t, "AppendInt", AppendInt(nil, v), ref(t, func(e *msgpack.Encoder) error { return e.EncodeInt(v) }))
		u := uint64(v)
		same(t, "AppendUint", AppendUint(nil, u), ref(t, func(e *msgpack.Encoder) error { return e.EncodeUint(u) }))
		same(t, "AppendUint64", AppendUint64(nil, u), ref(t, func(e *msgpack.Encoder) error { return e.EncodeUint64(u) }))
		same(t, "AppendInt64", AppendInt64(nil, v), ref(t, func(e *msgpack.Encoder) error { return e.EncodeInt64(v) }))
		same(t, "AppendUint32", AppendUint32(nil, uint32(u)), ref(t, func(e *msgpack.Encoder) error { return e.EncodeUint32(uint32(u)) }))
		same(t, "AppendUint8", AppendUint8(nil, uint8(u)), ref(t, func(e *msgpack.Encoder) error { return e.EncodeUint8(uint8(u)) }))
	}
	for _, n := range lens {
		s := strings.Repeat("x", n)
		same(t, "AppendStr", AppendStr(nil, s), ref(t, func(e *msgpack.Encoder) error { return e.EncodeString(s) }))
		same(t, "AppendBin", AppendBin(nil, []byte(s)), ref(t, func(e *msgpack.Encoder) error { return e.EncodeBytes([]byte(s)) }))
		same(t, "AppendArrayLen", AppendArrayLen(nil, n), ref(t, func(e *msgpack.Encoder) error { return e.EncodeArrayLen(n) }))
		same(t, "AppendMapLen", AppendMapLen(nil, n), ref(t, func(e *msgpack.Encoder) error { return e.EncodeMapLen(n) }))
	}
	same(t, "AppendBin(nil)", AppendBin(nil, nil), ref(t, func(e *msgpack.Encoder) error { return e.EncodeBytes(nil) }))
	same(t, "AppendBool", AppendBool(AppendBool(nil, true), false),
		ref(t, func(e *msgpack.Encoder) error { return errors.Join(e.EncodeBool(true), e.EncodeBool(false)) }))
	// Appending keeps what is there.
	if got := AppendStr([]byte("pre"), "x"); string(got) != "pre\xa1x" {
		t.Fatalf("AppendStr after a prefix: %q", got)
	}
}

// encodings is every msgpack encoding of v that a writer may choose: each integer width it
// fits, as msgpack's reflection encoder and a compact one would write.
func encodings(v int64) [][]byte {
	var out [][]byte
	add := func(b ...byte) { out = append(out, b) }
	if v >= 0 && v <= 0x7f || v >= -32 && v < 0 {
		add(byte(v))
	}
	if v >= 0 {
		u := uint64(v)
		if u <= 0xff {
			add(0xcc, byte(u))
		}
		if u <= 0xffff {
			add(0xcd, byte(u>>8), byte(u))
		}
		if u <= 0xffffffff {
			out = append(out, AppendUint32(nil, uint32(u)))
		}
		out = append(out, AppendUint64(nil, u))
	}
	if v >= -128 && v <= 127 {
		add(0xd0, byte(v))
	}
	if v >= -32768 && v <= 32767 {
		add(0xd1, byte(v>>8), byte(v))
	}
	if v >= math.MinInt32 && v <= math.MaxInt32 {
		add(0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return append(out, AppendInt64(nil, v))
}

// TestIntMatchesDecoder: Int reads every width of every boundary value as msgpack's
// DecodeInt64 and DecodeUint64 do, and Uint and Int64 check their ranges.
func TestIntMatchesDecoder(t *testing.T) {
	for _, v := range ints {
		for _, b := range encodings(v) {
			r := NewReader(b)
			got, k, err := r.Int()
			if err != nil || r.Left() != 0 {
				t.Fatalf("Int(%x) = %v, left %d", b, err, r.Left())
			}
			wantI, err1 := msgpack.NewDecoder(bytes.NewReader(b)).DecodeInt64()
			wantU, err2 := msgpack.NewDecoder(bytes.NewReader(b)).DecodeUint64()
			if err := errors.Join(err1, err2); err != nil {
				t.Fatal(err)
			}
			if int64(got) != wantI || got != wantU {
				t.Fatalf("Int(%x) = %d; msgpack gives %d, %d", b, got, wantI, wantU)
			}
			if (k == Signed) != (b[0] >= 0xd0 && b[0] <= 0xd3 || b[0] >= 0xe0) {
				t.Fatalf("Int(%x): kind %d", b, k)
			}

			r = NewReader(b)
			u, err := r.Uint(math.MaxUint32)
			if fits := v >= 0 && v <= math.MaxUint32; fits != (err == nil) || fits && u != uint64(v) {
				t.Fatalf("Uint(%x, MaxUint32) = %d, %v", b, u, err)
			}
			if err != nil && !errors.Is(err, ErrRange) {
				t.Fatalf("Uint(%x): %v is not ErrRange", b, err)
			}
			r = NewReader(b)
			if i, err := r.Int64(); err != nil || i != v {
				t.Fatalf("Int64(%x) = %d, %v", b, i, err)
			}
		}
	}
	// A uint 64 above MaxInt64 is a uint64 but no int64.
	b := AppendUint64(nil, math.MaxUint64)
	r := NewReader(b)
	if _, err := r.Int64(); !errors.Is(err, ErrRange) {
		t.Fatalf("Int64(%x): %v", b, err)
	}
	r = NewReader(b)
	if u, err := r.Uint(math.MaxUint64); err != nil || u != math.MaxUint64 {
		t.Fatalf("Uint(%x) = %d, %v", b, u, err)
	}
	// nil is 0 to Int and refused by Uint and Int64.
	r = NewReader([]byte{0xc0})
	if v, k, err := r.Int(); v != 0 || k != Nil || err != nil {
		t.Fatalf("Int(nil) = %d, %d, %v", v, k, err)
	}
	var ce *CodeError
	r = NewReader([]byte{0xc0})
	if _, err := r.Uint(1); !errors.As(err, &ce) {
		t.Fatalf("Uint(nil): %v", err)
	}
	r = NewReader([]byte{0xc0})
	if _, err := r.Int64(); !errors.As(err, &ce) {
		t.Fatalf("Int64(nil): %v", err)
	}
}

// TestReadValues: str, bin, bool, nil, arrays and maps read back what the append functions
// (so msgpack's Encoder) wrote, at every length class.
func TestReadValues(t *testing.T) {
	for _, n := range lens {
		s := strings.Repeat("s", n)
		var b []byte
		b = AppendStr(b, s)
		b = AppendBin(b, []byte(s))
		b = AppendArrayLen(b, n)
		b = AppendMapLen(b, n)
		b = AppendBin(b, nil)
		b = AppendBool(b, true)
		b = append(b, 0xc0, 0xc0, 0xc0)
		r := NewReader(b)
		if v, isNil, err := r.Raw(); string(v) != s || isNil || err != nil {
			t.Fatalf("Raw(str %d) = %d bytes, %v, %v", n, len(v), isNil, err)
		}
		if v, isNil, err := r.Raw(); string(v) != s || isNil || err != nil {
			t.Fatalf("Raw(bin %d) = %d bytes, %v, %v", n, len(v), isNil, err)
		}
		if got, err := r.ArrayLen(); got != n || err != nil {
			t.Fatalf("ArrayLen(%d) = %d, %v", n, got, err)
		}
		if got, err := r.MapLen(); got != n || err != nil {
			t.Fatalf("MapLen(%d) = %d, %v", n, got, err)
		}
		if v, isNil, err := r.Raw(); v != nil || !isNil || err != nil {
			t.Fatalf("Raw(nil) = %v, %v, %v", v, isNil, err)
		}
		if v, isNil, err := r.Bool(); !v || isNil || err != nil {
			t.Fatalf("Bool(true) = %v, %v, %v", v, isNil, err)
		}
		if v, isNil, err := r.Bool(); v || !isNil || err != nil {
			t.Fatalf("Bool(nil) = %v, %v, %v", v, isNil, err)
		}
		if got, err := r.ArrayLen(); got != -1 || err != nil {
			t.Fatalf("ArrayLen(nil) = %d, %v", got, err)
		}
		if got, err := r.MapLen(); got != -1 || err != nil {
			t.Fatalf("MapLen(nil) = %d, %v", got, err)
		}
		if r.Left() != 0 || r.Pos() != len(b) {
			t.Fatalf("left %d at %d of %d", r.Left(), r.Pos(), len(b))
		}
	}
	// Wrong types are CodeErrors naming the byte.
	for _, c := range []struct {
		b    []byte
		read func(*Reader) error
	}{
		{[]byte{0xc3}, func(r *Reader) error { _, _, err := r.Int(); return err }},
		{[]byte{0x01}, func(r *Reader) error { _, _, err := r.Bool(); return err }},
		{[]byte{0x90}, func(r *Reader) error { _, err := r.StrLen(); return err }},
		{[]byte{0xa0}, func(r *Reader) error { _, err := r.ArrayLen(); return err }},
		{[]byte{0x90}, func(r *Reader) error { _, err := r.MapLen(); return err }},
		{[]byte{0xc1}, func(r *Reader) error { return r.Skip() }},
		{[]byte{0x91, 0x01}, func(r *Reader) error { return r.SkipScalar() }},
		{[]byte{0xd4, 0x01, 0x01}, func(r *Reader) error { return r.SkipScalar() }},
	} {
		r := NewReader(c.b)
		var ce *CodeError
		if err := c.read(&r); !errors.As(err, &ce) || ce.Code != c.b[0] {
			t.Errorf("reading %x: %v, want a CodeError for %x", c.b, err, c.b[0])
		}
	}
}

// TestReadShort: no read of any prefix of a value panics or moves past the input; each
// fails with ErrShort or a CodeError; Skip of every proper prefix is ErrShort and of the whole
// value reads it all. A forged length is refused before anything is sliced or allocated.
func TestReadShort(t *testing.T) {
	var vals [][]byte
	for _, v := range ints {
		vals = append(vals, encodings(v)...)
	}
	for _, n := range []int{1, 31, 32, 256, 65536} {
		vals = append(vals, AppendStr(nil, strings.Repeat("x", n)), AppendBin(nil, make([]byte, n)))
	}
	vals = append(vals, AppendArrayLen(nil, 70000), AppendMapLen(nil, 300), []byte{0xd4, 1, 2},
		[]byte{0xc8, 0, 3, 1, 2, 3, 4}, []byte{0x92, 0xa1, 'x', 0x81, 0x01, 0xc3})
	reads := []func(*Reader) error{
		func(r *Reader) error { _, _, err := r.Int(); return err },
		func(r *Reader) error { _, err := r.StrLen(); return err },
		func(r *Reader) error { _, _, err := r.Raw(); return err },
		func(r *Reader) error { _, err := r.ArrayLen(); return err },
		func(r *Reader) error { _, err := r.MapLen(); return err },
		func(r *Reader) error { _, _, err := r.Bool(); return err },
		func(r *Reader) error { return r.SkipScalar() },
	}
	var ce *CodeError
	for _, v := range vals {
		for n := range len(v) + 1 {
			for i, read := range reads {
				r := NewReader(v[:n])
				if err := read(&r); err != nil && !errors.Is(err, ErrShort) && !errors.As(err, &ce) {
					t.Fatalf("read %d of %x: %v", i, v[:n], err)
				}
				if r.Pos() > n {
					t.Fatalf("read %d of %x moved to %d", i, v[:n], r.Pos())
				}
			}
			r := NewReader(v[:n])
			err := r.Skip()
			container := v[0] >= 0xdc && v[0] <= 0xdf // headers without their elements
			if n < len(v) || container {
				if !errors.Is(err, ErrShort) {
					t.Fatalf("Skip of %x (a prefix of %x): %v", v[:n], v[:min(len(v), 8)], err)
				}
			} else if err != nil || r.Left() != 0 {
				t.Fatalf("Skip of %x: %v, left %d", v[:min(len(v), 8)], err, r.Left())
			}
		}
	}
	r := NewReader([]byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'x'})
	if _, err := r.StrLen(); !errors.Is(err, ErrShort) || !strings.Contains(err.Error(), "bytes left") {
		t.Fatalf("forged str length: %v", err)
	}
}

// TestSkipMatchesDecoder: Skip moves past exactly the value msgpack's Decoder skips, for
// random nested values; SkipScalar skips the scalars and refuses the rest.
func TestSkipMatchesDecoder(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var gen func(depth int) any
	gen = func(depth int) any {
		switch r.IntN(9) {
		case 0:
			return ints[r.IntN(len(ints))]
		case 1:
			return strings.Repeat("x", lens[r.IntN(7)])
		case 2:
			return make([]byte, lens[r.IntN(7)])
		case 3:
			return r.Float64()
		case 4:
			return float32(r.Float64())
		case 5:
			return nil
		case 6:
			if depth < 3 {
				a := make([]any, r.IntN(20))
				for i := range a {
					a[i] = gen(depth + 1)
				}
				return a
			}
		case 7:
			if depth < 3 {
				m := map[string]any{}
				for range r.IntN(18) {
					m[strings.Repeat("k", r.IntN(40))] = gen(depth + 1)
				}
				return m
			}
		case 8:
			return &msgpack.RawMessage{0xd6, 0x01, 1, 2, 3, 4} // fixext 4
		}
		return r.IntN(2) == 0
	}
	for range 500 {
		v := gen(0)
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, 0xc3) // a value after it
		rd := NewReader(b)
		if err := rd.Skip(); err != nil || rd.Left() != 1 {
			t.Fatalf("Skip(%x) = %v, left %d", b[:min(len(b), 32)], err, rd.Left())
		}
		rd = NewReader(b)
		err = rd.SkipScalar()
		_, container := v.([]any)
		_, isMap := v.(map[string]any)
		_, isExt := v.(*msgpack.RawMessage)
		if refused := container || isMap || isExt; refused != (err != nil) || !refused && rd.Left() != 1 {
			t.Fatalf("SkipScalar(%x) = %v, left %d", b[:min(len(b), 32)], err, rd.Left())
		}
	}
}
