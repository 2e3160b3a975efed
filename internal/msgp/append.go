// Package msgp holds the msgpack primitives that worklog's two hand-written codecs share:
// the event bodies (events/codec.go) and the task and wake records
// (pebblelog/record_codec.go). It appends and reads single values (array and map headers,
// integers of any width, str, bin, bool, nil) and skips values; it knows nothing of either
// format. Each codec keeps its own format logic on top: which fields, in which order, which
// integer widths it writes, and what it accepts (the event decoder accepts exactly what
// msgpack's Decoder accepts, nil for any scalar included; the record decoder is stricter).
//
// The append functions write exactly the bytes vmihailenco/msgpack v5's Encoder writes for
// the same call (named on each), so stores and logs written through the library stay
// byte-identical. The Reader checks every length against the bytes it has before it slices
// or allocates anything: a forged length costs nothing.
package msgp

import (
	"encoding/binary"
	"math"
)

// AppendArrayLen appends an array header of n elements in its smallest form
// (msgpack's EncodeArrayLen).
func AppendArrayLen(b []byte, n int) []byte { return appendLen(b, n, 0x90, 0xdc) }

// AppendMapLen appends a map header of n pairs in its smallest form (EncodeMapLen).
func AppendMapLen(b []byte, n int) []byte { return appendLen(b, n, 0x80, 0xde) }

// appendLen appends an array or map header: fix is the fix form's high nibble, c16 the 16-bit
// form's code (the 32-bit form's is the next).
func appendLen(b []byte, n int, fix, c16 byte) []byte {
	switch {
	case n < 16:
		return append(b, fix|byte(n))
	case n < 1<<16:
		return append(b, c16, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, c16+1), uint32(n))
}

// AppendStr appends s as a str in its smallest form (EncodeString).
func AppendStr(b []byte, s string) []byte {
	if len(s) < 32 {
		b = append(b, 0xa0|byte(len(s))) // fixstr
	} else {
		b = appendDataLen(b, len(s), 0xd9)
	}
	return append(b, s...)
}

// AppendBin appends v as a bin in its smallest form, and a nil v as nil (EncodeBytes): an
// empty and a nil byte string stay apart.
func AppendBin(b []byte, v []byte) []byte {
	if v == nil {
		return append(b, 0xc0)
	}
	return append(appendDataLen(b, len(v), 0xc4), v...)
}

// appendDataLen appends the header of a str or bin of n bytes in its 8, 16 or 32-bit form:
// c8 is the 8-bit form's code, the next two are the wider forms'.
func appendDataLen(b []byte, n int, c8 byte) []byte {
	switch {
	case n < 256:
		return append(b, c8, byte(n))
	case n < 1<<16:
		return append(b, c8+1, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, c8+2), uint32(n))
}

// AppendBool appends true or false (EncodeBool).
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

// AppendUint appends v in its smallest form: a positive fixint, or uint 8, 16, 32 or 64
// (EncodeUint).
func AppendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return append(b, 0xcd, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return AppendUint32(b, uint32(v))
	}
	return AppendUint64(b, v)
}

// AppendInt appends v in its smallest form: as AppendUint when v >= 0, else a negative
// fixint or int 8, 16, 32 or 64 (EncodeInt).
func AppendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return AppendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= -1<<7:
		return append(b, 0xd0, byte(v))
	case v >= -1<<15:
		return append(b, 0xd1, byte(v>>8), byte(v))
	case v >= -1<<31:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return AppendInt64(b, v)
}

// The fixed-width forms are what msgpack's reflection encoder writes for a struct field of
// that Go type (EncodeUint8, EncodeUint32, EncodeUint64, EncodeInt64).

// AppendUint8 appends v as a uint 8, whatever its value.
func AppendUint8(b []byte, v uint8) []byte { return append(b, 0xcc, v) }

// AppendUint32 appends v as a uint 32, whatever its value.
func AppendUint32(b []byte, v uint32) []byte {
	return binary.BigEndian.AppendUint32(append(b, 0xce), v)
}

// AppendUint64 appends v as a uint 64, whatever its value.
func AppendUint64(b []byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// AppendInt64 appends v as an int 64, whatever its value.
func AppendInt64(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

// AppendFloat64 appends v as a float 64 (msgpack's EncodeFloat64).
func AppendFloat64(b []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(v))
}
