package msgp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrShort: the input ends inside a value.
var ErrShort = errors.New("msgpack: unexpected end of input")

// ErrRange: an integer does not fit the range the caller asked for (Uint, Int64).
var ErrRange = errors.New("msgpack: integer out of range")

// CodeError: the value's first byte is not of the type being read.
type CodeError struct {
	Code byte
	Want string // what was being read: "integer", "bool", "str or bin", "array", ...
}

func (e *CodeError) Error() string {
	return fmt.Sprintf("msgpack: invalid code=%x decoding %s", e.Code, e.Want)
}

// IntKind is the family of the msgpack value an integer was read from.
type IntKind uint8

const (
	Unsigned IntKind = iota // positive fixint, uint 8, 16, 32, 64
	Signed                  // negative fixint, int 8, 16, 32, 64
	Nil                     // nil, which msgpack's Decoder reads as 0
)

// A Reader reads msgpack values from a byte slice, in order. It never reads past the slice:
// a value cut short gives ErrShort. After an error the read position is unspecified; the
// callers stop at their first error. The zero Reader reads nothing; Reset gives it input.
type Reader struct {
	b   []byte
	off int // read position in b
}

// NewReader returns a Reader of b.
func NewReader(b []byte) Reader { return Reader{b: b} }

// Reset makes r read b from its start.
func (r *Reader) Reset(b []byte) { r.b, r.off = b, 0 }

// Pos is the read position: how many bytes of the input have been read.
func (r *Reader) Pos() int { return r.off }

// Left is the number of bytes not read yet.
func (r *Reader) Left() int { return len(r.b) - r.off }

func (r *Reader) byte1() (byte, bool) {
	if r.off >= len(r.b) {
		return 0, false
	}
	c := r.b[r.off]
	r.off++
	return c, true
}

// Take returns the next n bytes, which alias the input, and moves past them.
func (r *Reader) Take(n int) ([]byte, error) {
	p, ok := r.take(uint64(n))
	if !ok || n < 0 {
		return nil, ErrShort
	}
	return p, nil
}

func (r *Reader) take(n uint64) ([]byte, bool) {
	if n > uint64(len(r.b)-r.off) {
		r.off = len(r.b)
		return nil, false
	}
	p := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return p, true
}

// fixed reads a big-endian unsigned integer of n (1, 2, 4 or 8) bytes.
func (r *Reader) fixed(n int) (uint64, bool) {
	p, ok := r.take(uint64(n))
	if !ok {
		return 0, false
	}
	switch n {
	case 1:
		return uint64(p[0]), true
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), true
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), true
	}
	return binary.BigEndian.Uint64(p), true
}

// Int reads an integer of any width, or nil, as the 64 bits msgpack's DecodeInt64 and
// DecodeUint64 both give: signed widths sign-extended, unsigned ones zero-extended, nil 0.
// The kind tells them apart, for a caller that checks a range (Uint, Int64) or refuses nil.
func (r *Reader) Int() (uint64, IntKind, error) {
	c, ok := r.byte1()
	if !ok {
		return 0, 0, ErrShort
	}
	switch {
	case c <= 0x7f: // positive fixint
		return uint64(c), Unsigned, nil
	case c >= 0xe0: // negative fixint
		return uint64(int64(int8(c))), Signed, nil
	}
	var v uint64
	k := Unsigned
	switch c {
	case 0xc0:
		return 0, Nil, nil
	case 0xcc:
		v, ok = r.fixed(1)
	case 0xcd:
		v, ok = r.fixed(2)
	case 0xce:
		v, ok = r.fixed(4)
	case 0xcf:
		v, ok = r.fixed(8)
	case 0xd0:
		v, ok = r.fixed(1)
		v, k = uint64(int64(int8(v))), Signed
	case 0xd1:
		v, ok = r.fixed(2)
		v, k = uint64(int64(int16(v))), Signed
	case 0xd2:
		v, ok = r.fixed(4)
		v, k = uint64(int64(int32(v))), Signed
	case 0xd3:
		v, ok = r.fixed(8)
		k = Signed
	default:
		return 0, 0, &CodeError{Code: c, Want: "integer"}
	}
	if !ok {
		return 0, 0, ErrShort
	}
	return v, k, nil
}

// Uint reads an integer of any width whose value is in [0, max]; nil is refused.
func (r *Reader) Uint(max uint64) (uint64, error) {
	v, k, err := r.number()
	switch {
	case err != nil:
	case k == Signed && int64(v) < 0:
		err = fmt.Errorf("%w: %d for an unsigned field", ErrRange, int64(v))
	case v > max:
		err = fmt.Errorf("%w: %d (max %d)", ErrRange, v, max)
	}
	if err != nil {
		return 0, err
	}
	return v, nil
}

// Int64 reads an integer of any width whose value fits an int64; nil is refused.
func (r *Reader) Int64() (int64, error) {
	v, k, err := r.number()
	if err == nil && k == Unsigned && v > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %d (max %d)", ErrRange, v, uint64(math.MaxInt64))
	}
	if err != nil {
		return 0, err
	}
	return int64(v), nil
}

// number is Int refusing nil.
func (r *Reader) number() (uint64, IntKind, error) {
	v, k, err := r.Int()
	if err == nil && k == Nil {
		err = &CodeError{Code: 0xc0, Want: "integer"}
	}
	return v, k, err
}

// Float reads a float 64 or a float 32 (widened) as msgpack's DecodeFloat64 does, and like
// it an integer of any width (its 64 bits as an int64, converted) or nil (0).
func (r *Reader) Float() (v float64, isNil bool, err error) {
	c, ok := r.byte1()
	switch {
	case !ok:
		return 0, false, ErrShort
	case c == 0xcb:
		u, ok := r.fixed(8)
		if !ok {
			return 0, false, ErrShort
		}
		return math.Float64frombits(u), false, nil
	case c == 0xca:
		u, ok := r.fixed(4)
		if !ok {
			return 0, false, ErrShort
		}
		return float64(math.Float32frombits(uint32(u))), false, nil
	}
	r.off--
	n, k, err := r.Int()
	if err != nil {
		if ce, ok := err.(*CodeError); ok {
			ce.Want = "float"
		}
		return 0, false, err
	}
	return float64(int64(n)), k == Nil, nil
}

// Bool reads true, false or nil (isNil, with v false).
func (r *Reader) Bool() (v, isNil bool, err error) {
	c, ok := r.byte1()
	switch {
	case !ok:
		return false, false, ErrShort
	case c == 0xc3:
		return true, false, nil
	case c == 0xc2:
		return false, false, nil
	case c == 0xc0:
		return false, true, nil
	}
	return false, false, &CodeError{Code: c, Want: "bool"}
}

// StrLen reads the header of a str or bin (msgpack's Decoder reads either as a string or a
// byte string) and returns the length of its data, which follows; -1 means nil. The length
// is checked against the bytes left before it is returned, so a caller may allocate it.
func (r *Reader) StrLen() (int, error) {
	c, ok := r.byte1()
	if !ok {
		return 0, ErrShort
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf: // fixstr
		n = uint64(c & 0x1f)
	case c == 0xc0:
		return -1, nil
	case c == 0xd9 || c == 0xc4:
		n, ok = r.fixed(1)
	case c == 0xda || c == 0xc5:
		n, ok = r.fixed(2)
	case c == 0xdb || c == 0xc6:
		n, ok = r.fixed(4)
	default:
		return 0, &CodeError{Code: c, Want: "str or bin"}
	}
	if !ok {
		return 0, ErrShort
	}
	if left := len(r.b) - r.off; n > uint64(left) {
		return 0, fmt.Errorf("length %d, %d bytes left: %w", n, left, ErrShort)
	}
	return int(n), nil
}

// Raw reads a str, bin or nil and returns its data, which aliases the input; nil gives
// (nil, true).
func (r *Reader) Raw() (v []byte, isNil bool, err error) {
	n, err := r.StrLen()
	if err != nil || n < 0 {
		return nil, err == nil, err
	}
	v, _ = r.take(uint64(n)) // StrLen checked n
	return v, false, nil
}

// ArrayLen reads an array header; -1 means nil.
func (r *Reader) ArrayLen() (int, error) {
	return r.containerLen(0x90, 0xdc, "array")
}

// MapLen reads a map header (the number of key-value pairs); -1 means nil.
func (r *Reader) MapLen() (int, error) {
	return r.containerLen(0x80, 0xde, "map")
}

// containerLen reads the header of an array or a map: fix is its fix form's high nibble,
// c16 its 16-bit form's code (the 32-bit form's is the next).
func (r *Reader) containerLen(fix, c16 byte, want string) (int, error) {
	c, ok := r.byte1()
	if !ok {
		return 0, ErrShort
	}
	var n uint64
	switch {
	case c&0xf0 == fix:
		return int(c & 0x0f), nil
	case c == 0xc0:
		return -1, nil
	case c == c16:
		n, ok = r.fixed(2)
	case c == c16+1:
		n, ok = r.fixed(4)
	default:
		return 0, &CodeError{Code: c, Want: want}
	}
	if !ok {
		return 0, ErrShort
	}
	return int(n), nil
}

// Skip skips one value of any type, nested ones included, without recursion: pending counts
// the values still to skip, so a forged count costs no more than the bytes there are.
func (r *Reader) Skip() error {
	for pending := uint64(1); pending > 0; pending-- {
		c, ok := r.byte1()
		if !ok {
			return ErrShort
		}
		var size int // bytes of a length field to read, then that many bytes to skip
		var fix uint64
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
			continue
		case c >= 0x80 && c <= 0x8f: // fixmap
			pending += 2 * uint64(c&0x0f)
			continue
		case c >= 0x90 && c <= 0x9f: // fixarray
			pending += uint64(c & 0x0f)
			continue
		case c >= 0xa0 && c <= 0xbf: // fixstr
			fix = uint64(c & 0x1f)
		case c == 0xcc || c == 0xd0:
			fix = 1
		case c == 0xcd || c == 0xd1:
			fix = 2
		case c == 0xce || c == 0xd2 || c == 0xca:
			fix = 4
		case c == 0xcf || c == 0xd3 || c == 0xcb:
			fix = 8
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16 and the type byte
			fix = 1<<(c-0xd4) + 1
		case c == 0xc4 || c == 0xd9:
			size = 1
		case c == 0xc5 || c == 0xda:
			size = 2
		case c == 0xc6 || c == 0xdb:
			size = 4
		case c == 0xc7, c == 0xc8, c == 0xc9: // ext 8, 16, 32: length, type byte, data
			n, ok := r.fixed(1 << (c - 0xc7))
			if !ok {
				return ErrShort
			}
			fix = n + 1
		case c == 0xdc || c == 0xdd: // array 16, 32
			n, ok := r.fixed(2 << (c - 0xdc))
			if !ok {
				return ErrShort
			}
			pending += n
			continue
		case c == 0xde || c == 0xdf: // map 16, 32
			n, ok := r.fixed(2 << (c - 0xde))
			if !ok {
				return ErrShort
			}
			pending += 2 * n
			continue
		default: // 0xc1, never used
			return &CodeError{Code: c, Want: "any value"}
		}
		if size > 0 {
			n, ok := r.fixed(size)
			if !ok {
				return ErrShort
			}
			fix = n
		}
		if _, ok := r.take(fix); !ok {
			return ErrShort
		}
	}
	return nil
}

// SkipScalar skips one integer, float, bool, nil, str or bin; an array, a map or an ext is
// refused (its first byte read).
func (r *Reader) SkipScalar() error {
	if r.off < len(r.b) {
		switch c := r.b[r.off]; {
		case c >= 0x80 && c <= 0x9f, c >= 0xdc && c <= 0xdf, // fixmap, fixarray; array, map 16/32
			c >= 0xc7 && c <= 0xc9, c >= 0xd4 && c <= 0xd8, c == 0xc1: // ext, fixext, unused
			r.off++
			return &CodeError{Code: c, Want: "scalar"}
		}
	}
	return r.Skip()
}
