package hugepages

import (
	"testing"

	"golang.org/x/sys/unix"
)

// What a page fault costs here: map 64 MiB, touch one byte per 4 KiB, unmap,
// with and without MADV_HUGEPAGE (docs/benchmarks.md, "Page faults and huge
// pages"):
//
//	go test ./internal/hugepages -run '^$' -bench Fault
func BenchmarkFault(b *testing.B) {
	const size = 64 << 20
	for _, tc := range []struct {
		name string
		huge bool
	}{{"4KiB", false}, {"advised", true}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				m, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				if err != nil {
					b.Fatal(err)
				}
				if tc.huge {
					if err := unix.Madvise(m, unix.MADV_HUGEPAGE); err != nil {
						b.Fatal(err)
					}
				}
				for i := 0; i < size; i += 4096 {
					m[i] = 1
				}
				if err := unix.Munmap(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
