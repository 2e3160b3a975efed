package work

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"io"
)

// idSource makes task and wake ids and lease tokens. Randomness is an input: the default reads
// crypto/rand; tests may pass another reader through Options.Entropy.
type idSource struct {
	r io.Reader
}

func newIDSource(r io.Reader) *idSource {
	if r == nil {
		r = rand.Reader
	}
	return &idSource{r: r}
}

// id returns prefix + "_" + a UUIDv7 in hex: 48 bits of the caller's time in milliseconds, then
// version and variant bits and 74 random bits. Ids sort by creation time; the random part
// keeps them unique.
func (s *idSource) id(prefix string, nowNanos int64) (string, error) {
	var out [1]string
	err := s.ids(prefix, nowNanos, out[:])
	return out[0], err
}

// ids fills out with ids as id makes them one after another, from one read of the
// randomness they need (SubmitMany draws 10,000 at once).
func (s *idSource) ids(prefix string, nowNanos int64, out []string) error {
	const random = 10 // bytes per id: u[6:]
	rnd := make([]byte, random*len(out))
	if _, err := io.ReadFull(s.r, rnd); err != nil {
		return err
	}
	ms := uint64(nowNanos / 1e6)
	if nowNanos < 0 {
		ms = 0
	}
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], ms)
	for i := range out {
		var u [16]byte
		copy(u[:6], ts[2:])
		copy(u[6:], rnd[random*i:])
		u[6] = 0x70 | (u[6] & 0x0f) // version 7
		u[8] = 0x80 | (u[8] & 0x3f) // RFC 4122 variant
		out[i] = prefix + "_" + hex.EncodeToString(u[:])
	}
	return nil
}

// token returns an unguessable lease token: 128 random bits.
func (s *idSource) token(prefix string) (string, error) {
	var b [16]byte
	if _, err := io.ReadFull(s.r, b[:]); err != nil {
		return "", err
	}
	return prefix + "_" + hex.EncodeToString(b[:]), nil
}
