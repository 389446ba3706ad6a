package block

import (
	"bytes"
	"crypto/sha256"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewStoreChunkSize(t *testing.T) {
	for _, tc := range []struct {
		size int
		ok   bool
	}{{4096, true}, {DefaultChunkSize, true}, {16 << 20, true}, {2048, false}, {5000, false}, {32 << 20, false}, {0, false}} {
		_, err := NewStore(tc.size, 0)
		if tc.ok {
			require.NoError(t, err, tc.size)
		} else {
			require.ErrorIs(t, err, syscall.EINVAL, tc.size)
		}
	}
}

func TestPutDedupAndRelease(t *testing.T) {
	s, err := NewStore(4096, 0)
	require.NoError(t, err)
	buf := []byte("hello world")
	a := s.Put(buf)
	buf[0] = 'j' // the store copied new data
	require.Equal(t, []byte("hello world"), a.Bytes())
	require.Equal(t, Sum([]byte("hello world")), a.Hash())
	b := s.Put([]byte("hello world"))
	require.Same(t, a, b, "same content, same block")
	require.Equal(t, int64(2), s.Refs(a))
	require.Equal(t, Stats{Blocks: 1, PhysicalBytes: 11, Refs: 2, RefBytes: 22, SharedBytes: 11}, s.Stats())
	require.InDelta(t, 2.0, s.Stats().DedupRatio(), 1e-9)
	lone := s.Put([]byte("lone"))
	require.Equal(t, uint64(11), s.Stats().SharedBytes, "a block held once is not shared")
	s.Release(lone)

	c, err := s.Ref(a.Hash())
	require.NoError(t, err)
	require.Same(t, a, c)
	_, err = s.Ref(Sum([]byte("other")))
	require.ErrorIs(t, err, syscall.ENOENT)

	s.Release(a)
	s.Release(a)
	require.Equal(t, uint64(0), s.Stats().SharedBytes, "one holder left: no longer shared")
	s.Release(a)
	require.False(t, s.Has(a.Hash()))
	require.Equal(t, Stats{}, s.Stats())
	require.Equal(t, []byte("hello world"), a.Bytes(), "a holder keeps the bytes after the store lets go")
	s.Release(a) // one too many: ignored
	require.Equal(t, Stats{}, s.Stats())
	require.Equal(t, 1.0, s.Stats().DedupRatio())
}

func TestReleaseStaleBlockKeepsNewOne(t *testing.T) {
	s, _ := NewStore(4096, 0)
	old := s.Put([]byte("x"))
	s.Release(old)
	fresh := s.Put([]byte("x"))
	require.NotSame(t, old, fresh)
	s.Release(old) // a stale pointer must not drop the stored block
	require.Same(t, fresh, s.Get(Sum([]byte("x"))))
	require.Equal(t, uint64(1), s.Stats().PhysicalBytes)
}

func TestAdoptAndRefBlock(t *testing.T) {
	s, _ := NewStore(4096, 0)
	buf := []byte("adopted")
	b := s.Adopt(Sum(buf), buf)
	require.Equal(t, buf, b.Bytes())
	again := s.Adopt(Sum(buf), []byte("adopted"))
	require.Same(t, b, again)
	s.RefBlock(b)
	require.Equal(t, int64(3), s.Refs(b))
	n := 0
	s.Each(func(x *Block) { n++; require.Same(t, b, x) })
	require.Equal(t, 1, n)
	require.Equal(t, 0, (*Block)(nil).Len())
}

func TestBudget(t *testing.T) {
	s, _ := NewStore(4096, 100)
	require.True(t, s.Fits(100))
	require.False(t, s.Fits(101))
	s.Put(bytes.Repeat([]byte{1}, 60))
	require.True(t, s.Fits(40))
	require.False(t, s.Fits(41))
	require.True(t, s.FitsChange(50, 10))
	require.False(t, s.FitsChange(51, 10))
	s.SetLimit(10) // lowered below what is stored
	require.True(t, s.FitsChange(5, 5), "a change that does not grow always fits")
	require.False(t, s.Fits(1))
	s.SetLimit(0)
	require.True(t, s.Fits(1<<60))
	require.Equal(t, uint64(0), s.Limit())
}

func TestHashHelpers(t *testing.T) {
	h := Sum([]byte("abc"))
	require.Equal(t, sha256.Sum256([]byte("abc")), [32]byte(h))
	require.Equal(t, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", h.String())
	require.Equal(t, "ba7816bf8f01", h.Short())
	p, err := ParseHash(h[:])
	require.NoError(t, err)
	require.Equal(t, h, p)
	_, err = ParseHash(h[:5])
	require.Error(t, err)
	for _, tc := range []struct {
		data []byte
		zero bool
	}{{nil, true}, {make([]byte, 13), true}, {make([]byte, 4096), true}, {append(make([]byte, 4095), 1), false}, {[]byte{0, 0, 1}, false}, {append(make([]byte, 8), 1, 0), false}} {
		require.Equal(t, tc.zero, IsZero(tc.data), "%v", tc.data)
	}
}
