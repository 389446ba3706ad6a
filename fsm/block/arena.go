package block

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
)

// Block bytes live outside the Go heap, in anonymous memory mapped in
// slabs and cut into slots of one chunk size. Three things follow:
//
//   - The collector never scans or counts them, so the heap holds only
//     metadata and transient buffers, and GOGC's proportional headroom
//     applies to those, not to every stored byte.
//   - Each slot's pages are touched only as far as its block reaches and
//     are handed back to the kernel (MADV_DONTNEED) when the block dies,
//     so the process's resident memory for blocks is their size rounded
//     up to pages, counted exactly (ArenaStats). Fragmentation costs
//     address space, not memory: a freed slot in a mostly full slab
//     holds no pages.
//   - A slot is freed when its last holder becomes unreachable, not when
//     the store drops its reference: a snapshot streaming an old state,
//     or a restored state sharing an old store's block, keeps the *Block
//     (and so the slot) alive. A slice of the slot alone does not, which
//     is why the bytes are reached only through Block's accessors.

// slabBytes is the smallest mapping the arena makes; a larger chunk size
// gets slabs of one slot.
const slabBytes = 64 << 20

var pageSize = syscall.Getpagesize()

// arena hands out slots of one size.
type arena struct {
	slot int

	mu    sync.Mutex
	slabs []*slab // nil where a slab was unmapped
}

type slab struct {
	mem  []byte
	free []int32 // free slot numbers
	live int
}

// slot is a block's claim on arena memory; the runtime frees the memory
// once no *Block refers to it.
type slot struct {
	data []byte
}

type slotRef struct {
	a          *arena
	slab, slot int
	n          int
}

var (
	arenasMu sync.Mutex
	arenas   = map[int]*arena{}

	arenaMapped    atomic.Int64
	arenaResident  atomic.Int64
	arenaSlots     atomic.Int64
	arenaFallbacks atomic.Int64
)

// ArenaStats is the process-wide use of block memory.
type ArenaStats struct {
	Mapped   uint64 // address space of the slabs
	Resident uint64 // pages the live slots touch: what blocks cost in RAM
	Slots    uint64 // live slots (blocks not yet reclaimed)
	// HeapFallbacks counts blocks put on the Go heap because the kernel
	// refused to map block memory.
	HeapFallbacks uint64
}

// Arena returns the process-wide block memory figures. Resident falls
// when the collector finds a dead block unreachable, not at once when the
// store forgets it.
func Arena() ArenaStats {
	return ArenaStats{
		Mapped:        uint64(arenaMapped.Load()),
		Resident:      uint64(arenaResident.Load()),
		Slots:         uint64(arenaSlots.Load()),
		HeapFallbacks: uint64(arenaFallbacks.Load()),
	}
}

func arenaFor(size int) *arena {
	arenasMu.Lock()
	defer arenasMu.Unlock()
	a := arenas[size]
	if a == nil {
		a = &arena{slot: size}
		arenas[size] = a
	}
	return a
}

// newSlot returns a slot holding a copy of data (len(data) <= slotSize).
// Where the kernel refuses block memory (an address-space limit, strict
// overcommit) the copy goes on the Go heap instead, as every block did
// before the arena: the store still works and ArenaStats.HeapFallbacks
// says so.
func newSlot(slotSize int, data []byte) *slot {
	if len(data) > slotSize { // a block from a store of larger chunks
		slotSize = 1 << bits.Len(uint(len(data)-1))
	}
	if sl, err := arenaFor(slotSize).alloc(data); err == nil {
		return sl
	}
	arenaFallbacks.Add(1)
	return &slot{data: append(make([]byte, 0, len(data)), data...)}
}

// alloc returns a slot holding a copy of data (len(data) <= a.slot).
func (a *arena) alloc(data []byte) (*slot, error) {
	a.mu.Lock()
	si, sn, err := a.take()
	var mem []byte
	if err == nil {
		s := a.slabs[si]
		mem = s.mem[sn*a.slot : sn*a.slot+len(data) : sn*a.slot+len(data)]
	}
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	copy(mem, data)
	arenaResident.Add(int64(pages(len(data))))
	arenaSlots.Add(1)
	sl := &slot{data: mem}
	runtime.AddCleanup(sl, slotRef.release, slotRef{a: a, slab: si, slot: sn, n: len(data)})
	return sl, nil
}

// take finds a free slot, preferring the lowest slab so that live blocks
// gather and emptied slabs can be unmapped.
func (a *arena) take() (int, int, error) {
	for i, s := range a.slabs {
		if s != nil && len(s.free) > 0 {
			return i, s.pop(), nil
		}
	}
	per := max(1, slabBytes/a.slot)
	mem, err := syscall.Mmap(-1, 0, per*a.slot, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		return 0, 0, fmt.Errorf("block: map %d bytes of block memory: %w", per*a.slot, err)
	}
	arenaMapped.Add(int64(len(mem)))
	s := &slab{mem: mem, free: make([]int32, 0, per)}
	for n := per - 1; n >= 0; n-- {
		s.free = append(s.free, int32(n))
	}
	i := len(a.slabs)
	for j, old := range a.slabs {
		if old == nil {
			i = j
			break
		}
	}
	if i == len(a.slabs) {
		a.slabs = append(a.slabs, s)
	} else {
		a.slabs[i] = s
	}
	return i, s.pop(), nil
}

func (s *slab) pop() int {
	n := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.live++
	return int(n)
}

// release gives a dead slot's pages back to the kernel and the slot to the
// free list; a slab with nothing live left is unmapped unless it is the
// arena's only one.
func (r slotRef) release() {
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.slabs[r.slab]
	off := r.slot * a.slot
	// The pages are private and anonymous: after MADV_DONTNEED they read as
	// zeros and cost nothing until written again. It cannot fail on a range
	// the arena mapped.
	_ = syscall.Madvise(s.mem[off:off+pages(r.n)], syscall.MADV_DONTNEED)
	arenaResident.Add(-int64(pages(r.n)))
	s.free = append(s.free, int32(r.slot))
	s.live--
	if s.live == 0 && a.others(r.slab) {
		arenaMapped.Add(-int64(len(s.mem)))
		_ = syscall.Munmap(s.mem)
		a.slabs[r.slab] = nil
	}
	arenaSlots.Add(-1) // last: a reader of Slots sees the other figures settled
}

// others reports whether the arena has a mapped slab besides slab i.
func (a *arena) others(i int) bool {
	for j, s := range a.slabs {
		if j != i && s != nil {
			return true
		}
	}
	return false
}

// pages rounds n up to whole pages.
func pages(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }
