package narrate

import (
	"time"

	"github.com/worklog/worklog/internal/replayjson"
)

// The Append forms write what Time, Word and ShortJSON return into a buffer, without the
// string: replay's log lines (a follower prints every event of a busy queue) are built in
// one buffer, with no allocation per field.

// AppendTime appends Time(ns), without parsing TextTime's layout each time as AppendFormat
// does. The years of int64 nanoseconds (1677 to 2262) all have four digits.
func AppendTime(dst []byte, ns int64) []byte {
	t := time.Unix(0, ns).UTC()
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	dst = appendDigits(dst, y, 4)
	dst = appendDigits(append(dst, '-'), int(mo), 2)
	dst = appendDigits(append(dst, '-'), d, 2)
	dst = appendDigits(append(dst, 'T'), h, 2)
	dst = appendDigits(append(dst, ':'), mi, 2)
	dst = appendDigits(append(dst, ':'), s, 2)
	dst = appendDigits(append(dst, '.'), t.Nanosecond()/1e6, 3)
	return append(dst, 'Z')
}

// appendDigits appends the n low decimal digits of v ≥ 0, zero-padded.
func appendDigits(dst []byte, v, n int) []byte {
	dst = append(dst, "0000"[:n]...)
	for i := len(dst) - 1; n > 0; i, n = i-1, n-1 {
		dst[i] = byte('0' + v%10)
		v /= 10
	}
	return dst
}

// AppendWord appends Word(s).
func AppendWord(dst []byte, s string) []byte {
	if plainASCII(s) {
		return append(dst, s...)
	}
	return append(dst, Word(s)...)
}

// plainASCII reports whether s is printable ASCII that Word leaves as it is: not empty, no
// space, no '"', '=' or '\\'. Anything else takes Word's own path.
func plainASCII(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '"' || c == '=' || c == '\\' {
			return false
		}
	}
	return true
}

// AppendShortJSON appends ShortJSON(b, max).
func AppendShortJSON(dst, b []byte, max int) []byte {
	start := len(dst)
	if out, ok := compactASCII(dst, b); ok {
		if len(out)-start <= max {
			return out
		}
		return append(out[:start+max], "…"...) // ASCII: any byte is a character boundary
	}
	return append(dst[:start], cut(string(replayjson.Value(b)), max)...)
}

// compactASCII appends b without the white space between its tokens, as json.Compact does,
// when b is one JSON value of ASCII characters nested at most maxFastDepth deep; otherwise
// ok is false (b may still be JSON: the caller takes encoding/json's path, which also
// decides what bytes that are not JSON become). It only ever accepts JSON: a byte it does
// not know, a grammar it does not follow, is a no.
func compactASCII(dst, b []byte) (_ []byte, ok bool) {
	c := compacter{b: b, out: dst}
	if len(b) == 0 || !c.value(0) {
		return dst, false
	}
	c.space()
	return c.out, c.i == len(b)
}

const maxFastDepth = 64

type compacter struct {
	b   []byte
	i   int
	out []byte
}

func (c *compacter) space() {
	for c.i < len(c.b) {
		switch c.b[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// peek skips white space and returns the next byte, 0 at the end.
func (c *compacter) peek() byte {
	c.space()
	if c.i == len(c.b) {
		return 0
	}
	return c.b[c.i]
}

// take appends the next byte when it is want.
func (c *compacter) take(want byte) bool {
	if c.peek() != want {
		return false
	}
	c.out = append(c.out, want)
	c.i++
	return true
}

func (c *compacter) value(depth int) bool {
	switch ch := c.peek(); {
	case ch == '{' || ch == '[':
		if depth == maxFastDepth {
			return false
		}
		end := byte(']')
		if ch == '{' {
			end = '}'
		}
		c.take(ch)
		if c.take(end) {
			return true
		}
		for {
			if ch == '{' && !(c.peek() == '"' && c.str() && c.take(':')) {
				return false
			}
			if !c.value(depth + 1) {
				return false
			}
			if c.take(end) {
				return true
			}
			if !c.take(',') {
				return false
			}
		}
	case ch == '"':
		return c.str()
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	case ch == '-' || '0' <= ch && ch <= '9':
		return c.number()
	}
	return false
}

func (c *compacter) literal(word string) bool {
	if len(c.b)-c.i < len(word) || string(c.b[c.i:c.i+len(word)]) != word {
		return false
	}
	c.out = append(c.out, word...)
	c.i += len(word)
	return true
}

// str copies a string token as it is: '"', then printable ASCII and the escapes JSON has,
// then '"'.
func (c *compacter) str() bool {
	start := c.i
	for i := c.i + 1; i < len(c.b); i++ {
		for i < len(c.b) && plainInString[c.b[i]] {
			i++
		}
		if i == len(c.b) {
			return false
		}
		switch ch := c.b[i]; {
		case ch == '"':
			c.out = append(c.out, c.b[start:i+1]...)
			c.i = i + 1
			return true
		case ch < ' ' || ch >= 0x7f:
			return false
		case ch == '\\':
			i++
			if i == len(c.b) {
				return false
			}
			switch c.b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(c.b)-i <= 4 {
					return false
				}
				for _, h := range c.b[i+1 : i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				i += 4
			default:
				return false
			}
		}
	}
	return false
}

// plainInString marks the bytes a string token holds as themselves: printable ASCII but '"'
// and '\\'. The loop over a string's bytes (most of a JSON input's) is then one load each.
var plainInString = func() (t [256]bool) {
	for c := ' '; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// number copies a number token: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *compacter) number() bool {
	b, i := c.b, c.i
	digits := func() bool {
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	c.out = append(c.out, b[c.i:i]...)
	c.i = i
	return true
}
