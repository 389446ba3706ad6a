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

// freeMem unmaps the memory. It holds mu only to take the mapping away:
// giving a large one back to the system takes long (75 ms for 1 GiB on
// the test machine), and a writer waiting on mu to learn that the region
// was handed off would wait as long, which the handoff's pause counts.
func (r *Region) freeMem() {
	r.mu.Lock()
	mem := r.mem
	r.mem = nil
	r.mu.Unlock()
	if len(mem) > 0 {
		if beforeUnmap != nil {
			beforeUnmap()
		}
		_ = syscall.Munmap(mem)
	}
}

// beforeUnmap, when set (by tests), runs in freeMem before the unmapping.
var beforeUnmap func()
