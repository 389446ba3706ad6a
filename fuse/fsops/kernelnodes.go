package fsops

import "sync"

// KernelNodes is the set of inodes the kernel holds nodes for, with the
// kernel's lookup count of each, kept by a binding: Add for every reply
// that hands the kernel a node, Forget for what the kernel forgets. Its
// one use is InvalidateAll, after a gap in the change stream. The zero
// value is ready to use.
type KernelNodes struct {
	mu sync.Mutex
	m  map[uint64]uint64 // guarded by mu: ino → lookups not yet forgotten
}

// Add counts one lookup of ino.
func (k *KernelNodes) Add(ino uint64) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[uint64]uint64{}
	}
	k.m[ino]++
	k.mu.Unlock()
}

// Forget drops n lookups of ino; the inode leaves the set when none is
// left. A binding that learns only that the kernel forgot the node
// entirely passes ForgetAll.
func (k *KernelNodes) Forget(ino, n uint64) {
	k.mu.Lock()
	if k.m[ino] <= n {
		delete(k.m, ino)
	} else {
		k.m[ino] -= n
	}
	k.mu.Unlock()
}

// ForgetAll is a lookup count larger than any the kernel can hold.
const ForgetAll = ^uint64(0)

// InvalidateAll drops the cached attributes and pages of every inode in
// the set, and of the root (which the kernel holds without a lookup),
// from the kernel.
func (k *KernelNodes) InvalidateAll(inv Invalidator) {
	k.mu.Lock()
	inos := make([]uint64, 0, len(k.m)+1)
	inos = append(inos, RootIno)
	for ino := range k.m {
		inos = append(inos, ino)
	}
	k.mu.Unlock()
	for _, ino := range inos {
		inv.InvalidateData(ino)
	}
}
