package block

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// collectUntil runs the collector until cond holds: slots go back when a
// cleanup runs, which is after a collection finds them unreachable.
func collectUntil(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, func() bool { runtime.GC(); return cond() }, 10*time.Second, 10*time.Millisecond)
}

// settle collects until the arena's figures hold still over three
// collections in a row: blocks other tests dropped are reclaimed, so that
// a test's figures are its own.
func settle(t *testing.T) ArenaStats {
	t.Helper()
	last, still := Arena(), 0
	require.Eventually(t, func() bool {
		runtime.GC()
		now := Arena()
		if now == last {
			still++
		} else {
			last, still = now, 0
		}
		return still >= 3
	}, 10*time.Second, 10*time.Millisecond)
	return last
}

func TestArenaCountsPagesAndFreesUnreachableBlocks(t *testing.T) {
	const cs = 1 << 20 // a slot size no other test uses: the figures are this test's alone
	s, err := NewStore(cs, 0)
	require.NoError(t, err)
	before := settle(t)
	for _, tc := range []struct {
		name  string
		size  int
		pages uint64
	}{
		{"one byte takes a page", 1, 4096},
		{"a page", 4096, 4096},
		{"a page and a byte", 4097, 8192},
		{"a whole chunk", cs, cs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Repeat([]byte{byte(tc.size)}, tc.size)
			b := s.Put(data)
			require.Equal(t, data, b.Bytes())
			require.Equal(t, before.Resident+tc.pages, Arena().Resident)
			require.Equal(t, before.Slots+1, Arena().Slots)
			s.Release(b)
			require.Equal(t, uint64(0), s.Stats().PhysicalBytes, "the store forgets at once")
			runtime.GC()
			require.Equal(t, data, b.Bytes(), "a holder of the block still reads its bytes")
			b = nil
			collectUntil(t, func() bool { return Arena().Resident == before.Resident })
			require.Equal(t, before.Slots, Arena().Slots)
		})
	}
}

// mappedSlabs counts the slabs a's arena has mapped.
func mappedSlabs(a *arena) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, s := range a.slabs {
		if s != nil {
			n++
		}
	}
	return n
}

func TestArenaUnmapsEmptiedSlabs(t *testing.T) {
	const cs = 2 << 20 // 32 slots per slab; no other test uses this size
	s, err := NewStore(cs, 0)
	require.NoError(t, err)
	a := arenaFor(cs)
	settle(t)
	var held []*Block
	for i := range 100 { // four slabs
		d := make([]byte, 4096)
		d[0], d[1] = byte(i), byte(i>>8)
		held = append(held, s.Put(d))
	}
	require.Equal(t, 4, mappedSlabs(a))
	for i, b := range held {
		require.Equal(t, byte(i), b.Bytes()[0], "slots do not overlap")
		s.Release(b)
	}
	held = nil
	collectUntil(t, func() bool { return mappedSlabs(a) == 1 })
	mapped := Arena().Mapped
	b := s.Put([]byte("again"))
	require.Equal(t, mapped, Arena().Mapped, "the slab kept is reused")
	require.Equal(t, []byte("again"), b.Bytes())
}

func TestShareOutlivesTheStoreItCameFrom(t *testing.T) {
	old, _ := NewStore(4096, 0)
	data := []byte("shared between two stores")
	a := old.Put(data)
	fresh, _ := NewStore(4096, 0)
	b := fresh.Share(a)
	require.Equal(t, data, b.Bytes())
	require.Same(t, &a.data[0], &b.data[0], "shared, not copied")
	require.Same(t, b, fresh.Share(a), "a second share is a reference")
	require.Equal(t, int64(2), fresh.Refs(b))
	old.Release(a)
	a, old = nil, nil
	for i := range 5 {
		runtime.GC()
		fresh.Put(bytes.Repeat([]byte{byte(i)}, 4096)) // would take a freed slot
	}
	require.Equal(t, data, b.Bytes())
}

func TestNewBlockIsStoredBySharing(t *testing.T) {
	s, _ := NewStore(4096, 0)
	for _, size := range []int{1, 4096, 3 * 4096} { // the last from a store of larger chunks
		data := bytes.Repeat([]byte{byte(size)}, size)
		b := NewBlock(4096, Sum(data), data)
		require.Equal(t, data, b.Bytes())
		got := s.Share(b)
		require.Same(t, &b.data[0], &got.data[0], "not copied again")
		require.Equal(t, uint64(1), uint64(s.Refs(got)))
	}
}
