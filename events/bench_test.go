package events

import (
	"testing"
)

// The benchmarks use the golden fixtures: realistic ids, tokens and small JSON documents.

func BenchmarkDecode(b *testing.B) {
	for _, f := range goldenFixtures {
		enc := mustEncode(b, f.ev)
		b.Run(f.ev.Type().String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(enc)))
			for b.Loop() {
				if _, err := Decode(enc, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncode/append reuses its buffer, as a store's write path does; BenchmarkEncode/new
// allocates the result each time (Encode).
func BenchmarkEncode(b *testing.B) {
	for _, f := range goldenFixtures {
		b.Run("append/"+f.ev.Type().String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(mustEncode(b, f.ev))))
			var buf []byte
			for b.Loop() {
				var err error
				if buf, err = Append(buf[:0], f.ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, f := range goldenFixtures {
		b.Run("new/"+f.ev.Type().String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(f.ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
