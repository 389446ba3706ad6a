package server

import (
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

func entries(lo, hi uint64, size int) []*raft.Log {
	var out []*raft.Log
	for i := lo; i <= hi; i++ {
		out = append(out, &raft.Log{Index: i, Term: 1, Data: make([]byte, size)})
	}
	return out
}

func TestLogCacheBoundsEntriesAndBytes(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		maxEntries, maxBytes int
		n                    uint64
		size                 int
		firstCached          uint64
	}{
		{"by count", 4, 1 << 20, 10, 10, 7},
		{"by bytes", 64, 100, 10, 30, 8},
		{"an entry over the cap is not kept", 64, 10, 3, 30, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner := raft.NewInmemStore()
			c := newLogCache(inner, tc.maxEntries, tc.maxBytes)
			require.NoError(t, c.StoreLogs(entries(1, tc.n, tc.size)))
			require.LessOrEqual(t, c.bytes, tc.maxBytes)
			// Take the entries out of the inner store: what is still found
			// comes from the cache.
			require.NoError(t, inner.DeleteRange(1, tc.n))
			for i := uint64(1); i <= tc.n; i++ {
				var l raft.Log
				err := c.GetLog(i, &l)
				if i >= tc.firstCached {
					require.NoError(t, err, i)
					require.Equal(t, i, l.Index)
				} else {
					require.ErrorIs(t, err, raft.ErrLogNotFound, i)
				}
			}
		})
	}
}

func TestLogCacheRewriteAndDelete(t *testing.T) {
	inner := raft.NewInmemStore()
	c := newLogCache(inner, 8, 1<<20)
	require.NoError(t, c.StoreLogs(entries(1, 3, 10)))
	require.NoError(t, c.StoreLog(&raft.Log{Index: 3, Term: 2, Data: make([]byte, 5)}))
	require.Equal(t, 25, c.bytes)
	var l raft.Log
	require.NoError(t, c.GetLog(3, &l))
	require.Equal(t, uint64(2), l.Term, "the rewritten entry")
	require.NoError(t, c.DeleteRange(2, 3))
	require.Zero(t, c.bytes)
	require.ErrorIs(t, c.GetLog(3, &l), raft.ErrLogNotFound)
	require.NoError(t, c.GetLog(1, &l), "from the store")
}
