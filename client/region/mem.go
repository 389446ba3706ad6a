package region

import (
	"fmt"
	"syscall"
)

// allocMem maps n bytes of anonymous memory: outside the Go heap, so the
// collector never scans or moves it, and returned to the system at Close.
func allocMem(n int) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("region: map %d bytes: %w", n, err)
	}
	return b, nil
}

// freeMem unmaps the memory; guarded by mu.
func (r *Region) freeMem() {
	if len(r.mem) > 0 {
		_ = syscall.Munmap(r.mem)
	}
	r.mem = nil
}
