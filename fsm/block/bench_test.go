package block

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"

	"lukechampine.com/blake3"
)

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20}

func benchData(size, i int) []byte {
	b := make([]byte, size)
	for j := 0; j+8 <= size; j += 64 {
		binary.LittleEndian.PutUint64(b[j:], uint64(i)*0x9e3779b97f4a7c15+uint64(j))
	}
	return b
}

// BenchmarkPut stores new content each time (hash + copy + index).
func BenchmarkPut(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			s, _ := NewStore(16<<20, 0)
			data := benchData(size, 0)
			b.SetBytes(int64(size))
			for i := 0; b.Loop(); i++ {
				binary.LittleEndian.PutUint64(data, uint64(i)) // new content
				s.Put(data)
			}
		})
	}
}

// BenchmarkPutDup stores content already present (hash + reference).
func BenchmarkPutDup(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			s, _ := NewStore(16<<20, 0)
			data := benchData(size, 0)
			s.Put(data)
			b.SetBytes(int64(size))
			for b.Loop() {
				s.Put(data)
			}
		})
	}
}

func BenchmarkGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			s, _ := NewStore(16<<20, 0)
			var hs []Hash
			for i := range 1024 {
				hs = append(hs, s.Put(benchData(min(size, 4096), i)).Hash())
			}
			b.SetBytes(int64(size))
			for i := 0; b.Loop(); i++ {
				if s.Get(hs[i&1023]) == nil {
					b.Fatal("missing")
				}
			}
		})
	}
}

// BenchmarkPutRelease stores a new block and frees it again.
func BenchmarkPutRelease(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			s, _ := NewStore(16<<20, 0)
			data := benchData(size, 0)
			b.SetBytes(int64(size))
			for i := 0; b.Loop(); i++ {
				binary.LittleEndian.PutUint64(data, uint64(i))
				s.Release(s.Put(data))
			}
		})
	}
}

// BenchmarkHash compares the two candidate content hashes.
func BenchmarkHash(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		data := benchData(size, 1)
		b.Run(fmt.Sprintf("sha256/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				sha256.Sum256(data)
			}
		})
		b.Run(fmt.Sprintf("blake3/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				blake3.Sum256(data)
			}
		})
	}
}
