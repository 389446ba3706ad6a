package fsops

import (
	"bytes"
	"context"
	"math/rand"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeFile makes name in the root with content through ops and closes it.
func writeFile(t *testing.T, ops *ClientOps, name string, content []byte) uint64 {
	t.Helper()
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, name, syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	for off := 0; off < len(content); off += 128 << 10 {
		_, e := ops.Write(ctx, a.Ino, out.Handle, int64(off), content[off:min(off+128<<10, len(content))])
		require.Zero(t, e)
	}
	require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	return a.Ino
}

// readAt reads n bytes at off through handle.
func readAt(t *testing.T, ops *ClientOps, ino, handle uint64, off int64, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	got, e := ops.Read(context.Background(), ino, handle, off, buf)
	require.Zero(t, e)
	return buf[:got]
}

func open(t *testing.T, ops *ClientOps, ino uint64, flags int) uint64 {
	t.Helper()
	out, e := ops.Open(context.Background(), ino, flags, root)
	require.Zero(t, e)
	return out.Handle
}

// TestDataCacheServesLaterOpens: data one handle read is served to
// another handle, opened after the first was closed, without a read RPC,
// while the change stream is open; a change by another client is seen
// once its event arrives, and a write through the mount at once.
func TestDataCacheServesLaterOpens(t *testing.T) {
	ops, other := newOps(t, Options{DataCache: 64 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ops.Watch(ctx, &recorder{data: map[uint64]int{}, entries: map[string]int{}})
	require.Eventually(t, ops.watching.Load, 10*time.Second, time.Millisecond)

	content := make([]byte, 3<<20+1000)
	rand.New(rand.NewSource(1)).Read(content)
	ino := writeFile(t, ops, "f", content)

	h := open(t, ops, ino, syscall.O_RDONLY)
	var all []byte
	for off := int64(0); off < int64(len(content)); off += 128 << 10 {
		all = append(all, readAt(t, ops, ino, h, off, 128<<10)...)
	}
	require.True(t, bytes.Equal(content, all))
	require.Zero(t, ops.Release(ctx, ino, h))

	h = open(t, ops, ino, syscall.O_RDONLY)
	before := ops.reads.Load()
	rng := rand.New(rand.NewSource(2))
	for range 200 {
		off := rng.Int63n(int64(len(content)))
		want := content[off:min(off+4096, int64(len(content)))]
		require.True(t, bytes.Equal(want, readAt(t, ops, ino, h, off, 4096)), "at %d", off)
	}
	require.Equal(t, before, ops.reads.Load(), "random reads of cached data went to the cluster")
	require.Empty(t, readAt(t, ops, ino, h, int64(len(content)), 4096), "the end of the file, from the cache")

	// Another client's write shows once its event has dropped the windows.
	_, _, err := other.WriteIno(ctx, ino, 2<<20+10, []byte("THEIRS"))
	require.NoError(t, err)
	copy(content[2<<20+10:], "THEIRS")
	require.Eventually(t, func() bool {
		return bytes.Equal(content[2<<20:2<<20+4096], readAt(t, ops, ino, h, 2<<20, 4096))
	}, 10*time.Second, time.Millisecond)

	// A write through the mount is seen by the next read, event or not.
	require.True(t, bytes.Equal(content[1<<20:1<<20+128<<10], readAt(t, ops, ino, h, 1<<20, 128<<10)))
	before = ops.reads.Load()
	readAt(t, ops, ino, h, 1<<20, 4096)
	require.Equal(t, before, ops.reads.Load(), "window 1 was not cached")
	w := open(t, ops, ino, syscall.O_WRONLY)
	_, e := ops.Write(ctx, ino, w, 1<<20+7, []byte("MINE"))
	require.Zero(t, e)
	copy(content[1<<20+7:], "MINE")
	require.True(t, bytes.Equal(content[1<<20:1<<20+4096], readAt(t, ops, ino, h, 1<<20, 4096)))
	require.Zero(t, ops.Release(ctx, ino, w))

	require.Zero(t, ops.Release(ctx, ino, h))
}

// TestDataCacheDroppedByTruncatingOpen: opening with O_TRUNC, or creating
// over the file with it, empties what the mount answers at once, even
// from a window the reading handle fetched itself (no change stream here,
// so nothing else would drop it).
func TestDataCacheDroppedByTruncatingOpen(t *testing.T) {
	ops, _ := newOps(t, Options{DataCache: 64 << 20})
	ctx := context.Background()
	content := bytes.Repeat([]byte("abcdefgh"), 1<<16)
	ino := writeFile(t, ops, "f", content)
	for _, trunc := range []func() uint64{
		func() uint64 { return open(t, ops, ino, syscall.O_RDWR|syscall.O_TRUNC) },
		func() uint64 {
			_, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR|syscall.O_TRUNC, 0o644, root)
			require.Zero(t, e)
			return out.Handle
		},
	} {
		w := open(t, ops, ino, syscall.O_WRONLY)
		_, e := ops.Write(ctx, ino, w, 0, content)
		require.Zero(t, e)
		require.Zero(t, ops.Release(ctx, ino, w))
		h := open(t, ops, ino, syscall.O_RDONLY)
		require.True(t, bytes.Equal(content[:128<<10], readAt(t, ops, ino, h, 0, 128<<10)))
		require.NotEmpty(t, ops.cache.starts(ino))
		tr := trunc()
		require.Empty(t, readAt(t, ops, ino, h, 4096, 4096), "read after O_TRUNC")
		require.Zero(t, ops.Release(ctx, ino, tr))
		require.Zero(t, ops.Release(ctx, ino, h))
	}
}

// TestDataCacheNotSharedWithoutStream: without the change stream, nothing
// tells the mount of other clients' changes, so a handle reads only the
// windows it fetched itself.
func TestDataCacheNotSharedWithoutStream(t *testing.T) {
	for _, size := range []int64{0, 64 << 20} {
		ops, _ := newOps(t, Options{DataCache: size})
		// Shorter than a window, so that no fetch ahead runs meanwhile.
		content := bytes.Repeat([]byte("abcdefgh"), 1<<16)
		ino := writeFile(t, ops, "f", content)
		h := open(t, ops, ino, syscall.O_RDONLY)
		require.Equal(t, content[:128<<10], readAt(t, ops, ino, h, 0, 128<<10))
		before := ops.reads.Load()
		require.Equal(t, content[4096:8192], readAt(t, ops, ino, h, 4096, 4096))
		require.Equal(t, before, ops.reads.Load(), "the handle's own window answers it")
		require.Zero(t, ops.Release(context.Background(), ino, h))

		h = open(t, ops, ino, syscall.O_RDONLY)
		require.Equal(t, content[4096:8192], readAt(t, ops, ino, h, 4096, 4096))
		require.Equal(t, before+1, ops.reads.Load(), "cache %d: another handle's window answered", size)
		require.Equal(t, content[128<<10:256<<10], readAt(t, ops, ino, h, 128<<10, 128<<10))
		require.Equal(t, before+2, ops.reads.Load(), "cache %d: the handle fetched its own window", size)
		require.Zero(t, ops.Release(context.Background(), ino, h))
	}
}

// fetchGate makes window fetches wait for release and fill in data.
func fetchGate(data []byte) (fetch func(*window), release func()) {
	gate := make(chan struct{})
	return func(w *window) {
		<-gate
		w.data = append(make([]byte, 0, raWindow), data...)
	}, func() { close(gate) }
}

// TestDataCacheDropMarksInflightStale: a window still being fetched when
// its inode is dropped is never served, and not kept.
func TestDataCacheDropMarksInflightStale(t *testing.T) {
	c := newDataCache(0)
	fetch, release := fetchGate([]byte("old"))
	w, _ := c.window(7, 0, 1, true, always, fetch)
	c.drop(7)
	release()
	<-w.done
	require.False(t, c.usable(w, 1, true, true))
	require.Nil(t, c.lookup(7, 0))
	require.Zero(t, c.bytes())

	fetch, release = fetchGate([]byte("new"))
	release()
	w2, _ := c.window(7, 0, 1, true, always, fetch)
	<-w2.done
	require.NotSame(t, w, w2)
	require.True(t, c.usable(w2, 1, true, false))
	require.Equal(t, "new", string(w2.data))
	require.Less(t, c.bytes(), int64(64), "a short window keeps only its data")
	c.clear()
	require.False(t, c.usable(w2, 1, true, false))
}

// always is a capability that covers every fetch.
func always() bool { return true }

// TestDataCacheUncoveredFetchAnswersOnlyItsRead: a window fetched while no
// capability covered the file answers the read that fetched it and no
// later one, even once a capability covers the file: another client may
// have written since, and the cluster makes it commit first only for a
// read that reaches it.
func TestDataCacheUncoveredFetchAnswersOnlyItsRead(t *testing.T) {
	c := newDataCache(0)
	fetch, release := fetchGate([]byte("old"))
	release()
	w, mine := c.window(7, 0, 1, true, func() bool { return false }, fetch)
	require.True(t, mine)
	<-w.done
	require.True(t, c.usable(w, 1, true, true), "the read that fetched it")
	require.False(t, c.usable(w, 1, true, false), "a later read of the same handle")
	require.False(t, c.usable(w, 2, true, false), "another handle's")

	fetch, release = fetchGate([]byte("new"))
	release()
	w2, mine := c.window(7, 0, 1, true, always, fetch)
	require.True(t, mine, "fetched again, not found")
	<-w2.done
	require.Equal(t, "new", string(w2.data))
	again, mine := c.window(7, 0, 2, true, always, fetch)
	require.False(t, mine)
	require.Same(t, w2, again)
}

// TestDataCacheEvictsLeastRecentlyUsed: full windows beyond the limit go,
// oldest use first; a window read recently stays.
func TestDataCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := newDataCache(minCacheBytes)
	full := make([]byte, raWindow)
	n := int64(minCacheBytes / raWindow)
	for i := range n {
		fetch, release := fetchGate(full)
		release()
		w, _ := c.window(1, i*raWindow, 1, true, always, fetch)
		<-w.done
	}
	require.Equal(t, int64(minCacheBytes), c.bytes())
	require.NotNil(t, c.lookup(1, 0)) // now the most recent
	fetch, release := fetchGate(full)
	release()
	w, _ := c.window(2, 0, 1, true, always, fetch)
	<-w.done
	require.Equal(t, int64(minCacheBytes), c.bytes())
	require.NotNil(t, c.lookup(1, 0), "recently used, kept")
	require.Nil(t, c.lookup(1, raWindow), "least recently used, evicted")
	require.NotNil(t, c.lookup(2, 0))
}
