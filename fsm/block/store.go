package block

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
)

// DefaultChunkSize is the chunk size of a new cluster.
const DefaultChunkSize = 64 << 10

// Block is one immutable chunk of data. Its bytes must never be modified.
type Block struct {
	hash Hash
	data []byte // mem.data, kept here to save a load on every read; never handed out (View)
	mem  *slot  // keeps data's memory alive while the block is reachable
	refs int64  // guarded by Store.mu
}

// Hash returns the block's content hash.
func (b *Block) Hash() Hash { return b.hash }

// The block's bytes are reached only through View, ReadAt and Bytes.
// They live off the Go heap, in a slot that goes back to the arena (and
// then to another block) once the *Block is unreachable, and a slice of
// them alone does not keep the *Block reachable. Each accessor therefore
// holds b (runtime.KeepAlive) until it has finished with the bytes, and
// the raw slice never leaves this package except inside View's callback.

// View calls fn with the block's bytes, which stay valid until fn returns
// and not a moment longer: fn must not modify them, keep them, or hand
// them to anything that keeps them (an io.Writer may take them: Write
// must not retain its argument).
func (b *Block) View(fn func(data []byte)) {
	fn(b.data)
	runtime.KeepAlive(b)
}

// ReadAt copies the block's bytes from off into p and returns how many it
// copied: fewer than len(p) at the block's end, 0 from off >= Len().
func (b *Block) ReadAt(p []byte, off int) int {
	if b == nil || off >= len(b.data) {
		return 0
	}
	n := copy(p, b.data[off:])
	runtime.KeepAlive(b)
	return n
}

// Bytes returns a copy of the block's bytes on the Go heap.
func (b *Block) Bytes() []byte {
	p := make([]byte, b.Len())
	b.ReadAt(p, 0)
	return p
}

// Len returns the block's length in bytes; 0 for a nil block (a hole).
func (b *Block) Len() int {
	if b == nil {
		return 0
	}
	return len(b.data)
}

// Stats is a moment's view of the store.
type Stats struct {
	Blocks        uint64 // unique blocks stored
	PhysicalBytes uint64 // bytes of unique blocks
	Refs          uint64 // references held on them
	RefBytes      uint64 // bytes those references cover (what a store without dedup holds)
	SharedBytes   uint64 // bytes of the blocks held by more than one reference
	Limit         uint64 // byte budget; 0 = none
}

// DedupRatio is RefBytes / PhysicalBytes, 1 for an empty store.
func (s Stats) DedupRatio() float64 {
	if s.PhysicalBytes == 0 {
		return 1
	}
	return float64(s.RefBytes) / float64(s.PhysicalBytes)
}

// Store holds blocks by hash. Mutations (Put, Ref, Release) are made by the
// state machine's single apply goroutine; lookups and stats may come from
// any goroutine.
type Store struct {
	chunkSize int
	limit     atomic.Uint64 // may change while readers call Stats

	mu     sync.RWMutex
	blocks map[Hash]*Block

	physical atomic.Uint64
	refs     atomic.Uint64
	refBytes atomic.Uint64
	shared   atomic.Uint64
}

// NewStore returns an empty store. limit caps physical bytes (0 = no cap).
func NewStore(chunkSize int, limit uint64) (*Store, error) {
	if chunkSize < 4096 || chunkSize > 16<<20 || chunkSize&(chunkSize-1) != 0 {
		return nil, fmt.Errorf("block: chunk size %d is not a power of two in [4 KiB, 16 MiB]: %w", chunkSize, syscall.EINVAL)
	}
	st := &Store{chunkSize: chunkSize, blocks: make(map[Hash]*Block)}
	st.limit.Store(limit)
	return st, nil
}

// ChunkSize returns the fixed chunk size.
func (s *Store) ChunkSize() int { return s.chunkSize }

// Limit returns the byte budget (0 = none).
func (s *Store) Limit() uint64 { return s.limit.Load() }

// SetLimit changes the byte budget. Blocks already stored stay.
func (s *Store) SetLimit(limit uint64) { s.limit.Store(limit) }

// Fits reports whether n more physical bytes stay within the budget.
func (s *Store) Fits(n uint64) bool {
	return s.FitsChange(n, 0)
}

// FitsChange reports whether a change that stores add new bytes and frees
// free bytes leaves physical bytes within the budget. A change that does
// not grow the store always fits, even over a budget lowered since.
func (s *Store) FitsChange(add, free uint64) bool {
	limit := s.limit.Load()
	if limit == 0 || add <= free {
		return true
	}
	return s.physical.Load()+(add-free) <= limit
}

// Get returns the block with hash h, or nil.
func (s *Store) Get(h Hash) *Block {
	s.mu.RLock()
	b := s.blocks[h]
	s.mu.RUnlock()
	return b
}

// Has reports whether the store holds h.
func (s *Store) Has(h Hash) bool { return s.Get(h) != nil }

// Put stores data (hashed here) with one reference and returns its block.
// When the content is already stored, the existing block gains a reference
// and data is not kept. data is copied only when it is new, so the caller
// may reuse its buffer.
func (s *Store) Put(data []byte) *Block {
	return s.PutHashed(Sum(data), data)
}

// PutHashed is Put for a caller that already hashed data. The caller
// vouches that h == Sum(data).
func (s *Store) PutHashed(h Hash, data []byte) *Block {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.blocks[h]; b != nil {
		s.refLocked(b)
		return b
	}
	b := s.newBlock(h, newSlot(s.chunkSize, data))
	s.blocks[h] = b
	s.physical.Add(uint64(len(data)))
	s.refLocked(b)
	return b
}

// Adopt is PutHashed for a buffer the caller hands over and will not
// touch again. Block bytes live in the arena, so it is copied there like
// any other; the caller's buffer becomes garbage.
func (s *Store) Adopt(h Hash, data []byte) *Block { return s.PutHashed(h, data) }

// Share stores another store's block b, with one reference, sharing its
// bytes rather than copying them (a restore keeps the blocks the state it
// replaces already holds). b's memory lives while either block does.
func (s *Store) Share(b *Block) *Block {
	s.mu.Lock()
	defer s.mu.Unlock()
	if have := s.blocks[b.hash]; have != nil {
		s.refLocked(have)
		return have
	}
	nb := s.newBlock(b.hash, b.mem)
	s.blocks[b.hash] = nb
	s.physical.Add(uint64(len(nb.data)))
	s.refLocked(nb)
	return nb
}

// NewBlock puts a copy of data in block memory as a block of no store yet,
// for a caller that gathers blocks before a store takes them with Share (a
// restore fetching blocks from peers), so that they are held once, off the
// heap, rather than on the heap and then again in block memory. The caller
// vouches that h == Sum(data).
func NewBlock(chunkSize int, h Hash, data []byte) *Block {
	mem := newSlot(chunkSize, data)
	return &Block{hash: h, data: mem.data, mem: mem}
}

func (s *Store) newBlock(h Hash, mem *slot) *Block {
	return &Block{hash: h, data: mem.data, mem: mem}
}

// Ref adds a reference to a stored block (a clone, a hard copy, a write
// that names a block by hash). It fails with ENOENT if h is not stored.
func (s *Store) Ref(h Hash) (*Block, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[h]
	if b == nil {
		return nil, fmt.Errorf("block %s: %w", h.Short(), syscall.ENOENT)
	}
	s.refLocked(b)
	return b, nil
}

// RefBlock adds a reference to b, which must be stored.
func (s *Store) RefBlock(b *Block) {
	s.mu.Lock()
	s.refLocked(b)
	s.mu.Unlock()
}

func (s *Store) refLocked(b *Block) {
	b.refs++
	s.refs.Add(1)
	s.refBytes.Add(uint64(len(b.data)))
	if b.refs == 2 {
		s.shared.Add(uint64(len(b.data)))
	}
}

// Release drops one reference; the block leaves the store at zero.
// Releasing a block with no references is a bug in the caller and is
// ignored rather than driving counts negative.
func (s *Store) Release(b *Block) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.refs <= 0 {
		return
	}
	b.refs--
	s.refs.Add(^uint64(0))
	s.refBytes.Add(-uint64(len(b.data)))
	if b.refs == 1 {
		s.shared.Add(-uint64(len(b.data)))
	}
	if b.refs == 0 && s.blocks[b.hash] == b {
		delete(s.blocks, b.hash)
		s.physical.Add(-uint64(len(b.data)))
	}
}

// Refs returns the reference count of b.
func (s *Store) Refs(b *Block) int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return b.refs
}

// Stats returns the current totals.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	n := len(s.blocks)
	s.mu.RUnlock()
	return Stats{
		Blocks:        uint64(n),
		PhysicalBytes: s.physical.Load(),
		Refs:          s.refs.Load(),
		RefBytes:      s.refBytes.Load(),
		SharedBytes:   s.shared.Load(),
		Limit:         s.limit.Load(),
	}
}

// Each calls fn for every stored block in no particular order; fn must not
// call back into the store.
func (s *Store) Each(fn func(*Block)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, b := range s.blocks {
		fn(b)
	}
}
