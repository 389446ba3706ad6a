package block

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// reclaimSlot is a slot size no other test uses, so that the slots this
// test frees are reused by this test's own blocks and nothing else.
const reclaimSlot = 128 << 10

// fillBlock writes the content of block id: every 8-byte word names id
// and its own position, so a byte of another block, or of a freed slot
// (zeros), is told apart wherever it lands.
func fillBlock(p []byte, id uint64) {
	for i := 0; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], id<<32|uint64(i))
	}
}

// checkBlock fails unless p is exactly the content of some block from its
// offset off on; it returns that block's id.
func checkBlock(p []byte, off int) (uint64, error) {
	if len(p) < 8 {
		return 0, fmt.Errorf("%d bytes", len(p))
	}
	id := binary.LittleEndian.Uint64(p) >> 32
	for i := 0; i+8 <= len(p); i += 8 {
		if got, want := binary.LittleEndian.Uint64(p[i:]), id<<32|uint64(off+i); got != want {
			return 0, fmt.Errorf("word at %d is %#x, want %#x (block %d): a freed or reused slot", off+i, got, want, id)
		}
	}
	return id, nil
}

// TestReadersNeverSeeReusedSlots stresses the one rule that makes
// off-heap blocks safe: bytes are read only while the *Block is held, so
// its slot cannot be freed (MADV_DONTNEED, zeros) or handed to another
// block (other bytes) mid-copy. A writer replaces blocks and lets the
// store forget the old ones at once, the collector runs without pause,
// and freed slots are taken again at once (the free list is LIFO);
// readers hold a block only through the accessor they call and check
// every word they get.
func TestReadersNeverSeeReusedSlots(t *testing.T) {
	s, err := NewStore(reclaimSlot, 0)
	require.NoError(t, err)
	const keys = 4
	var cur [keys]atomic.Pointer[Block]
	buf := make([]byte, reclaimSlot)
	var next uint64
	put := func() *Block {
		next++
		fillBlock(buf, next)
		return s.Put(buf)
	}
	for i := range cur {
		cur[i].Store(put())
	}

	// Without the hold, a reader saw a freed or reused slot within a few
	// hundred steps in most runs.
	steps := 1000
	if testing.Short() {
		steps = 150
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
		stop.Store(true)
	}
	wg.Go(func() {
		for !stop.Load() {
			runtime.GC()
		}
	})
	readers := []struct {
		name string
		read func(b *Block, n int) error
	}{
		{"Bytes", func(b *Block, _ int) error {
			_, err := checkBlock(b.Bytes(), 0)
			return err
		}},
		{"ReadAt, from an offset", func(b *Block, n int) error {
			off := n * 4096 % reclaimSlot
			p := make([]byte, reclaimSlot)
			_, err := checkBlock(p[:b.ReadAt(p, off)], off)
			return err
		}},
		{"View, copied out in pieces", func(b *Block, _ int) error {
			// As a snapshot writes a block: in pieces, with the
			// scheduler (and so the collector) running in between.
			out := make([]byte, 0, reclaimSlot)
			b.View(func(data []byte) {
				for off := 0; off < len(data); off += 4096 {
					out = append(out, data[off:min(off+4096, len(data))]...)
					runtime.Gosched()
				}
			})
			_, err := checkBlock(out, 0)
			return err
		}},
	}
	for _, r := range readers {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				// The reader's only hold on the block is the call.
				if err := r.read(cur[n%keys].Load(), n); err != nil {
					fail(fmt.Errorf("%s: %w", r.name, err))
					return
				}
			}
		})
	}
	for step := 0; step < steps && !stop.Load(); step++ {
		i := step % keys
		old := cur[i].Swap(put())
		s.Release(old)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// Give every slot back, so that the other tests' figures are theirs.
	for i := range cur {
		s.Release(cur[i].Swap(nil))
	}
	settle(t)
}
