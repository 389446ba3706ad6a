package fsops

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
)

// newCapOps is newOps with a client that holds capabilities (and a lease
// long enough that no keepalive falls inside a test's counting).
func newCapOps(t *testing.T) (*ClientOps, *client.Client, *client.Client) {
	t.Helper()
	return newCapOpsWith(t, Options{})
}

// newCapOpsWith is newCapOps with opt.
func newCapOpsWith(t *testing.T, opt Options) (*ClientOps, *client.Client, *client.Client) {
	t.Helper()
	cl := servertest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, cl.APIAddrs(), client.WithCaps(), client.WithLease(60*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	other, err := client.New(ctx, cl.APIAddrs())
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	return New(c, opt), c, other
}

// TestCapsAnswerLocally: once a directory was read under capabilities,
// lookups (of missing names too), stats, listings and read-only opens
// and releases of its files cost no call to the cluster; another
// client's change is seen as soon as its call returns.
func TestCapsAnswerLocally(t *testing.T) {
	ops, c, other := newCapOps(t)
	ctx := context.Background()
	require.NoError(t, other.MkdirAll("/d", 0o755))
	for i := range 5 {
		require.NoError(t, other.WriteFile(fmt.Sprintf("/d/f%d", i), []byte("hello"), 0o644))
	}

	round := func() (d Attr) {
		d, e := ops.Lookup(ctx, RootIno, "d")
		require.Zero(t, e)
		_, e = ops.Lookup(ctx, d.Ino, "missing")
		require.Equal(t, syscall.ENOENT, e)
		ents, e := ops.ReadDirPlus(ctx, d.Ino)
		require.Zero(t, e)
		require.Len(t, ents, 7)
		for _, ent := range ents[2:] {
			require.NotNil(t, ent.Attr, ent.Name)
			a, e := ops.GetAttr(ctx, ent.Ino)
			require.Zero(t, e)
			require.EqualValues(t, 5, a.Size)
			out, e := ops.Open(ctx, ent.Ino, syscall.O_RDONLY, root)
			require.Zero(t, e)
			require.Zero(t, ops.Flush(ctx, ent.Ino, out.Handle))
			require.Zero(t, ops.Release(ctx, ent.Ino, out.Handle))
		}
		return d
	}
	round()
	before := c.Calls()
	d := round()
	require.Equal(t, before, c.Calls(), "the second round asked the cluster")

	// Another client's write is seen when its call returns: the write
	// waited for this mount to give the capability back.
	f0, e := ops.Lookup(ctx, d.Ino, "f0")
	require.Zero(t, e)
	require.NoError(t, other.WriteFile("/d/f0", []byte("hello, world"), 0o644))
	a, e := ops.GetAttr(ctx, f0.Ino)
	require.Zero(t, e)
	require.EqualValues(t, 12, a.Size)
	require.NoError(t, other.WriteFile("/d/new", nil, 0o644))
	_, e = ops.Lookup(ctx, d.Ino, "new")
	require.Zero(t, e)

	// A file opened here without the cluster stays readable when another
	// client unlinks it.
	f1, e := ops.Lookup(ctx, d.Ino, "f1")
	require.Zero(t, e)
	out, e := ops.Open(ctx, f1.Ino, syscall.O_RDONLY, root)
	require.Zero(t, e)
	require.True(t, isLocal(out.Handle))
	require.NoError(t, other.Remove("/d/f1"))
	_, e = ops.Lookup(ctx, d.Ino, "f1")
	require.Equal(t, syscall.ENOENT, e)
	buf := make([]byte, 16)
	n, e := ops.Read(ctx, f1.Ino, out.Handle, 0, buf)
	require.Zero(t, e)
	require.Equal(t, "hello", string(buf[:n]))
	require.Zero(t, ops.Release(ctx, f1.Ino, out.Handle))
}

// TestCapsOwnChanges: what this mount changes itself (creates, renames,
// unlinks, writes) is answered at once from the cache, as the cluster has
// it.
func TestCapsOwnChanges(t *testing.T) {
	ops, c, other := newCapOps(t)
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "d", 0o755, root)
	require.Zero(t, e)
	_, e = ops.Lookup(ctx, d.Ino, "a") // fills the listing
	require.Equal(t, syscall.ENOENT, e)
	a, out, e := ops.Create(ctx, d.Ino, "a", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 0, []byte("abc"))
	require.Zero(t, e)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	before := c.Calls()
	got, e := ops.Lookup(ctx, d.Ino, "a")
	require.Zero(t, e)
	require.EqualValues(t, 3, got.Size)
	got, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.EqualValues(t, 3, got.Size)
	require.Equal(t, before, c.Calls(), "the attributes of this mount's own write were asked for")
	require.Zero(t, ops.Rename(ctx, d.Ino, "a", d.Ino, "b", root))
	_, e = ops.Lookup(ctx, d.Ino, "a")
	require.Equal(t, syscall.ENOENT, e)
	_, e = ops.Lookup(ctx, d.Ino, "b")
	require.Zero(t, e)
	sub, e := ops.Mkdir(ctx, d.Ino, "sub", 0o755, root)
	require.Zero(t, e)
	require.Zero(t, ops.Rename(ctx, d.Ino, "b", sub.Ino, "c", root))
	ents, e := ops.ReadDir(ctx, sub.Ino)
	require.Zero(t, e)
	require.Equal(t, []string{".", "..", "c"}, names(ents))
	require.Equal(t, d.Ino, ents[1].Ino)
	require.Zero(t, ops.Unlink(ctx, sub.Ino, "c", root))
	ents, e = ops.ReadDir(ctx, sub.Ino)
	require.Zero(t, e)
	require.Equal(t, []string{".", ".."}, names(ents))
	ents, e = ops.ReadDir(ctx, d.Ino)
	require.Zero(t, e)
	require.Equal(t, []string{".", "..", "sub"}, names(ents))
	// The cluster agrees.
	des, err := other.ReadDirIno(ctx, d.Ino)
	require.NoError(t, err)
	require.Len(t, des, 1)
}

func names(ents []DirEntry) []string {
	out := make([]string, len(ents))
	for i, e := range ents {
		out[i] = e.Name
	}
	return out
}

// newCachedFile makes ops with a shared data cache, as while the change
// stream is read, and creates f in its root, whose listing it holds.
func newCachedFile(t *testing.T) (*ClientOps, *client.Client, Attr, OpenOut) {
	t.Helper()
	ops, _, other := newCapOps(t)
	ops.opt.DataCache = 64 << 20
	ops.watching.Store(true)
	ctx := context.Background()
	_, e := ops.Lookup(ctx, RootIno, "f") // fills the root's listing
	require.Equal(t, syscall.ENOENT, e)
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	return ops, other, a, out
}

// TestCapsKeepWrittenData: what a single writer committed reads back from
// the mount's memory, and another client's change to it is seen.
func TestCapsKeepWrittenData(t *testing.T) {
	ops, other, a, out := newCachedFile(t)
	ctx := context.Background()
	data := make([]byte, 3*raWindow+1000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for off := 0; off < len(data); off += 128 << 10 {
		_, e := ops.Write(ctx, a.Ino, out.Handle, int64(off), data[off:min(off+128<<10, len(data))])
		require.Zero(t, e)
		if end := off + 128<<10; end%raWindow == 0 {
			// The window's commit finishes before the next write: that
			// write must leave the window it does not touch.
			require.Eventually(t, func() bool {
				return slices.Contains(ops.cache.starts(a.Ino), int64(end-raWindow))
			}, 10*time.Second, time.Millisecond)
		}
	}
	require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	require.Equal(t, []int64{0, raWindow, 2 * raWindow, 3 * raWindow}, ops.cache.starts(a.Ino))

	in, e := ops.Open(ctx, a.Ino, syscall.O_RDONLY, root)
	require.Zero(t, e)
	reads := ops.reads.Load()
	buf := make([]byte, 128<<10)
	for off := 0; off < len(data); off += len(buf) {
		n, e := ops.Read(ctx, a.Ino, in.Handle, int64(off), buf)
		require.Zero(t, e)
		require.Equal(t, data[off:off+n], buf[:n], "at %d", off)
	}
	require.Equal(t, reads, ops.reads.Load(), "read from the cluster")

	// Another client's write recalls the capability, which drops the
	// windows: the next read sees it.
	_, _, err := other.WriteIno(ctx, a.Ino, 10, []byte("changed"))
	require.NoError(t, err)
	n, e := ops.Read(ctx, a.Ino, in.Handle, 0, buf)
	require.Zero(t, e)
	require.Equal(t, "changed", string(buf[10:17]))
	require.Greater(t, n, 17)
	require.Zero(t, ops.Release(ctx, a.Ino, in.Handle))
}

// TestShortWindowWaitsForLaterCommits: the end of the file one commit
// wrote is not kept as a window while another commit of the handle is in
// flight: that one may have been applied after it and extended the file,
// and the short window would answer its bytes with the end of the file.
func TestShortWindowWaitsForLaterCommits(t *testing.T) {
	ops, _, a, out := newCachedFile(t)
	ctx := context.Background()
	_, e := ops.Write(ctx, a.Ino, out.Handle, 0, []byte("x"))
	require.Zero(t, e)
	require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
	f := ops.file(out.Handle)
	require.NotNil(t, f)

	tail := bytes.Repeat([]byte("t"), 100)
	first := ops.meta.commitBy(a.Ino, out.Handle)
	later := ops.meta.commitBy(a.Ino, out.Handle)
	ops.keepWritten(f, raWindow, tail, &pb.Attr{Ino: a.Ino, Size: raWindow + 100}, first)
	require.NotContains(t, ops.cache.starts(a.Ino), int64(raWindow), "kept beside a later commit")

	ops.meta.committed(a.Ino, nil, later)
	ops.keepWritten(f, raWindow, tail, &pb.Attr{Ino: a.Ino, Size: raWindow + 100}, first)
	require.Contains(t, ops.cache.starts(a.Ino), int64(raWindow), "alone, the end of the file is kept")
	ops.meta.committed(a.Ino, nil, first)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}

// TestOverlappingChangesDropListing: two changes of this mount to one
// directory in flight at once may be answered in another order than the
// cluster applied them, so the listing is not kept past them; one change
// at a time edits it in place.
func TestOverlappingChangesDropListing(t *testing.T) {
	ops, _, _ := newCapOps(t)
	ctx := context.Background()
	_, e := ops.Lookup(ctx, RootIno, "x") // fills the root's listing
	require.Equal(t, syscall.ENOENT, e)
	_, ok := ops.meta.list(RootIno)
	require.True(t, ok)

	done := ops.meta.changes(RootIno)
	_, ok = ops.meta.list(RootIno)
	require.False(t, ok, "answered while a change is in flight")
	done()
	_, ok = ops.meta.list(RootIno)
	require.True(t, ok, "one change at a time keeps the listing")

	done = ops.meta.changes(RootIno, RootIno) // a rename within the directory
	done()
	_, ok = ops.meta.list(RootIno)
	require.True(t, ok, "a rename within one directory is one change")

	first := ops.meta.changes(RootIno)
	second := ops.meta.changes(RootIno)
	first()
	_, ok = ops.meta.list(RootIno)
	require.False(t, ok)
	second()
	_, ok = ops.meta.list(RootIno)
	require.False(t, ok, "overlapping changes leave the listing to be read again")
}

// TestRecallWaitsForGetattrInFlight: a recall's kernel notification waits
// for a GETATTR of its inodes being answered (an invalidation reaching the
// kernel meanwhile would make it drop the answer), and no longer than its
// bound.
func TestRecallWaitsForGetattrInFlight(t *testing.T) {
	var s fetchSet
	s.wait([]uint64{7}, time.Hour) // nothing in flight: at once

	end := s.begin(7)
	other := s.begin(8)
	done := make(chan struct{})
	go func() {
		s.wait([]uint64{7}, time.Hour)
		close(done)
	}()
	other() // another inode's answer does not end the wait
	select {
	case <-done:
		t.Fatal("the wait ended while a GETATTR of its inode was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	end()
	require.Eventually(t, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond)

	defer s.begin(9)()
	start := time.Now()
	s.wait([]uint64{9}, 20*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "the bound")
}
