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

func TestArenaCountsPagesAndFreesUnreachableBlocks(t *testing.T) {
	const cs = 1 << 20 // a slot size no other test uses: the figures are this test's alone
	s, err := NewStore(cs, 0)
	require.NoError(t, err)
	before := Arena()
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
			require.Equal(t, data, b.Data())
			require.Equal(t, before.Resident+tc.pages, Arena().Resident)
			require.Equal(t, before.Slots+1, Arena().Slots)
			s.Release(b)
			require.Equal(t, uint64(0), s.Stats().PhysicalBytes, "the store forgets at once")
			kept := b.Data()
			runtime.GC()
			require.Equal(t, data, kept, "a holder of the block still reads its bytes")
			runtime.KeepAlive(b)
			b = nil
			collectUntil(t, func() bool { return Arena().Resident == before.Resident })
			require.Equal(t, before.Slots, Arena().Slots)
		})
	}
}

func TestArenaUnmapsEmptiedSlabs(t *testing.T) {
	const cs = 2 << 20 // 32 slots per slab; no other test uses this size
	s, err := NewStore(cs, 0)
	require.NoError(t, err)
	before := Arena().Mapped
	var held []*Block
	for i := range 100 { // four slabs
		d := make([]byte, 4096)
		d[0], d[1] = byte(i), byte(i>>8)
		held = append(held, s.Put(d))
	}
	require.Equal(t, before+4*slabBytes, Arena().Mapped)
	for i, b := range held {
		require.Equal(t, byte(i), b.Data()[0], "slots do not overlap")
		s.Release(b)
	}
	held = nil
	collectUntil(t, func() bool { return Arena().Mapped == before+slabBytes })
	b := s.Put([]byte("again"))
	require.Equal(t, before+slabBytes, Arena().Mapped, "the slab kept is reused")
	require.Equal(t, []byte("again"), b.Data())
}

func TestShareOutlivesTheStoreItCameFrom(t *testing.T) {
	old, _ := NewStore(4096, 0)
	data := []byte("shared between two stores")
	a := old.Put(data)
	fresh, _ := NewStore(4096, 0)
	b := fresh.Share(a)
	require.Equal(t, data, b.Data())
	require.Same(t, &a.Data()[0], &b.Data()[0], "shared, not copied")
	require.Same(t, b, fresh.Share(a), "a second share is a reference")
	require.Equal(t, int64(2), fresh.Refs(b))
	old.Release(a)
	a, old = nil, nil
	for i := range 5 {
		runtime.GC()
		fresh.Put(bytes.Repeat([]byte{byte(i)}, 4096)) // would take a freed slot
	}
	require.Equal(t, data, b.Data())
}

func TestNewBlockIsStoredBySharing(t *testing.T) {
	s, _ := NewStore(4096, 0)
	for _, size := range []int{1, 4096, 3 * 4096} { // the last from a store of larger chunks
		data := bytes.Repeat([]byte{byte(size)}, size)
		b := NewBlock(4096, Sum(data), data)
		require.Equal(t, data, b.Data())
		got := s.Share(b)
		require.Same(t, &b.Data()[0], &got.Data()[0], "not copied again")
		require.Equal(t, uint64(1), uint64(s.Refs(got)))
	}
}
