package server

import (
	"sync/atomic"
	"testing"
	"time"

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
			c := newLogCache(inner, tc.maxEntries, tc.maxBytes, tc.maxBytes, nil)
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
	c := newLogCache(inner, 8, 1<<20, 1<<20, nil)
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

func TestLogCacheShrinksWhenWritesPause(t *testing.T) {
	inner := raft.NewInmemStore()
	var pauses atomic.Int32
	c := newLogCache(inner, 64, 1000, 250, func() { pauses.Add(1) })
	require.NoError(t, c.StoreLogs(entries(1, 10, 100)))
	require.Equal(t, 1000, cachedBytes(c), "while entries arrive the cache holds up to its full bound")

	stop := c.watch(20 * time.Millisecond)
	defer func() { stop() }()
	require.Eventually(t, func() bool { return cachedBytes(c) == 200 }, 5*time.Second, 5*time.Millisecond,
		"paused, it keeps only what fits in the idle bound")
	require.Eventually(t, func() bool { return pauses.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, inner.DeleteRange(1, 10))
	var l raft.Log
	require.NoError(t, c.GetLog(10, &l), "the newest entries stay")
	require.NoError(t, c.GetLog(9, &l))
	require.ErrorIs(t, c.GetLog(8, &l), raft.ErrLogNotFound)

	// A trickle below the idle bound (ticks) is still a pause: one hook
	// call for it, not one per look.
	for i := uint64(11); i < 20; i++ {
		require.NoError(t, c.StoreLogs(entries(i, i, 10)))
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, int32(1), pauses.Load())

	// Writes again: the full bound, and a new pause after them.
	stop()
	require.NoError(t, c.StoreLogs(entries(20, 27, 100)))
	require.Greater(t, cachedBytes(c), 800, "past the idle bound again")
	stop = c.watch(20 * time.Millisecond)
	require.Eventually(t, func() bool { return pauses.Load() == 2 && cachedBytes(c) <= 250 }, 5*time.Second, 5*time.Millisecond)
}

// cachedBytes reads the cache's byte count under its lock: the idle timer
// may be trimming.
func cachedBytes(c *logCache) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.bytes
}
