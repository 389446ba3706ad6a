package fsops

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// newBufOps is newCapOps with buffered metadata; batches leave only when
// synced or recalled (or when full), so that a test sees what is buffered.
func newBufOps(t *testing.T) (*ClientOps, *client.Client, *client.Client) {
	t.Helper()
	ops, c, other := newCapOpsWith(t, Options{Buffered: true, Journal: client.JournalOptions{MaxAge: time.Hour}})
	require.NotNil(t, ops.jr)
	return ops, c, other
}

// TestBufferedTreeAnsweredLocally: in a directory the mount holds
// exclusively, creates, writes of new files, setattrs, mkdir, symlink,
// rename, unlink and rmdir are answered without a call to the cluster,
// and the mount's own view is right meanwhile; another client's read of
// the directory recalls the capability and sees every one of them.
func TestBufferedTreeAnsweredLocally(t *testing.T) {
	ops, c, other := newBufOps(t)
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	// The first change in t takes its exclusive capability and listing.
	_, e = ops.Mkdir(ctx, d.Ino, "warm", 0o755, root)
	require.Zero(t, e)

	before := c.Calls()
	mtime := time.Unix(1_000_000, 0)
	for i := range 20 {
		a, out, e := ops.Create(ctx, d.Ino, fmt.Sprintf("f%d", i), syscall.O_WRONLY|syscall.O_EXCL, 0o644, root)
		require.Zero(t, e)
		n, e := ops.Write(ctx, a.Ino, out.Handle, 0, []byte(fmt.Sprintf("hello %d", i)))
		require.Zero(t, e)
		require.Equal(t, 6+len(fmt.Sprint(i)), n)
		_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMode: true, Mode: 0o600, SetMtime: true, Mtime: mtime})
		require.Zero(t, e)
		require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
		require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	}
	_, _, e = ops.Create(ctx, d.Ino, "f3", syscall.O_WRONLY|syscall.O_EXCL, 0o644, root)
	require.Equal(t, syscall.EEXIST, e)
	sub, e := ops.Mkdir(ctx, d.Ino, "sub", 0o755, root)
	require.Zero(t, e)
	_, e = ops.Symlink(ctx, sub.Ino, "link", "../f0", root)
	require.Zero(t, e)
	require.Zero(t, ops.Rename(ctx, d.Ino, "f0", d.Ino, "g0", root))
	require.Zero(t, ops.Rename(ctx, d.Ino, "f2", d.Ino, "f4", root)) // replaces f4
	require.Zero(t, ops.Unlink(ctx, d.Ino, "f1", root))
	require.Equal(t, syscall.ENOENT, ops.Unlink(ctx, d.Ino, "f1", root))
	require.Equal(t, syscall.ENOTEMPTY, ops.Rmdir(ctx, d.Ino, "sub", root))
	require.Zero(t, ops.Rmdir(ctx, d.Ino, "warm", root))
	f5, e := ops.Lookup(ctx, d.Ino, "f5")
	require.Zero(t, e)
	hard, e := ops.Link(ctx, f5.Ino, sub.Ino, "hard")
	require.Zero(t, e)
	require.EqualValues(t, 2, hard.Nlink)
	_, e = ops.Link(ctx, f5.Ino, sub.Ino, "hard")
	require.Equal(t, syscall.EEXIST, e)

	// The mount's own answers, from its state.
	a, e := ops.Lookup(ctx, d.Ino, "f4")
	require.Zero(t, e)
	require.EqualValues(t, len("hello 2"), a.Size)
	require.EqualValues(t, 0o600, a.Mode&0o7777)
	require.True(t, a.Mtime.Equal(mtime))
	_, e = ops.Lookup(ctx, d.Ino, "f1")
	require.Equal(t, syscall.ENOENT, e)
	ents, e := ops.ReadDir(ctx, d.Ino)
	require.Zero(t, e)
	require.Len(t, ents, 2+17+2) // . .. f3..f19 g0 sub

	after := c.Calls()
	// A reservation of inode numbers may be refilled meanwhile.
	require.LessOrEqual(t, after.Commands-before.Commands, int64(2), "commands sent while buffering")
	require.Zero(t, after.Queries-before.Queries, "queries sent while buffering")
	batches, _, _ := ops.jr.Stats()
	require.Zero(t, batches)

	// A file written here reads back through the mount (the journal goes
	// first: the data cache, which would answer it, needs the change
	// stream this test does not run).
	out, e := ops.Open(ctx, f5.Ino, syscall.O_RDONLY, root)
	require.Zero(t, e)
	buf := make([]byte, 64)
	n, e := ops.Read(ctx, f5.Ino, out.Handle, 0, buf)
	require.Zero(t, e)
	require.Equal(t, "hello 5", string(buf[:n]))
	require.Zero(t, ops.Release(ctx, f5.Ino, out.Handle))

	// Another client: its read recalls t, which sends the journal first.
	infos, err := other.ReadDir("/t")
	require.NoError(t, err)
	var names []string
	for _, fi := range infos {
		names = append(names, fi.Name())
	}
	want := []string{"g0", "sub"}
	for i := 3; i < 20; i++ {
		want = append(want, fmt.Sprintf("f%d", i))
	}
	slices.Sort(want)
	require.Equal(t, want, names)
	data, err := other.ReadFile("/t/f4")
	require.NoError(t, err)
	require.Equal(t, "hello 2", string(data))
	fi, err := other.Lstat("/t/f7")
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode().Perm())
	require.True(t, fi.ModTime().Equal(mtime))
	fi, err = other.Lstat("/t/sub/hard")
	require.NoError(t, err)
	require.EqualValues(t, 7, fi.Size())
	target, err := other.Readlink("/t/sub/link")

	require.NoError(t, err)
	require.Equal(t, "../f0", target)
	_, committed, failed := ops.jr.Stats()
	require.Zero(t, failed)
	require.NotZero(t, committed)

	// After the recall the mount answers from the cluster, and still right.
	a, e = ops.Lookup(ctx, d.Ino, "g0")
	require.Zero(t, e)
	require.EqualValues(t, len("hello 0"), a.Size)
}

// TestBufferedFsyncCommits: fsync returns once everything buffered before
// it is committed, and a new file's times are the ones the mount answered.
func TestBufferedFsyncCommits(t *testing.T) {
	ops, _, other := newBufOps(t)
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	_, e = ops.Mkdir(ctx, d.Ino, "warm", 0o755, root)
	require.Zero(t, e)
	a, out, e := ops.Create(ctx, d.Ino, "f", syscall.O_RDWR|syscall.O_EXCL, 0o644, root)
	require.Zero(t, e)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 0, []byte("data"))
	require.Zero(t, e)
	a, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	batches, _, _ := ops.jr.Stats()
	require.Zero(t, batches)
	require.Zero(t, ops.Fsync(ctx, a.Ino))
	require.False(t, ops.jr.Pending())
	// Read through the mount after the commit: the cluster's bytes.
	buf := make([]byte, 16)
	n, e := ops.Read(ctx, a.Ino, out.Handle, 0, buf)
	require.Zero(t, e)
	require.Equal(t, "data", string(buf[:n]))
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	fi, err := other.Stat("/t/f")
	require.NoError(t, err)
	require.EqualValues(t, 4, fi.Size())
	require.True(t, fi.ModTime().Equal(a.Mtime), "mtime %v, answered %v", fi.ModTime(), a.Mtime)
}

// TestBufferedLossReported: a buffered write the cluster refuses at
// commit (past its memory budget) is lost alone, the operations around it
// are kept, its file's fsync reports the errno, and the mount's later
// answers are the cluster's.
func TestBufferedLossReported(t *testing.T) {
	cl := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, c *server.Config) { c.MemoryLimit = 384 << 10 }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, cl.APIAddrs(), client.WithCaps(), client.WithLease(60*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ops := New(c, Options{Buffered: true, Journal: client.JournalOptions{MaxAge: time.Hour, MaxBytes: 900 << 10}})

	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	chunk := make([]byte, 64<<10)
	inos := map[string]uint64{}
	for i, name := range []string{"a", "b", "c"} {
		a, out, e := ops.Create(ctx, d.Ino, name, syscall.O_WRONLY|syscall.O_EXCL, 0o644, root)
		require.Zero(t, e)
		inos[name] = a.Ino
		for off := 0; off < 192<<10; off += len(chunk) {
			chunk[0] = byte(i) // no two chunks alike: dedup would store them once
			chunk[1] = byte(off >> 16)
			_, e = ops.Write(ctx, a.Ino, out.Handle, int64(off), chunk)
			require.Zero(t, e)
		}
		require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	}
	_, e = ops.Mkdir(ctx, d.Ino, "after", 0o755, root)
	require.Zero(t, e)
	batches, _, _ := ops.jr.Stats()
	require.Zero(t, batches)

	require.Equal(t, syscall.ENOSPC, ops.Fsync(ctx, inos["c"]))
	require.Zero(t, ops.Fsync(ctx, inos["a"]), "reported once, for its own file")
	_, committed, failed := ops.jr.Stats()
	require.NotZero(t, failed)
	require.NotZero(t, committed)
	a, e := ops.Lookup(ctx, d.Ino, "a")
	require.Zero(t, e)
	require.EqualValues(t, 192<<10, a.Size)
	cAttr, e := ops.Lookup(ctx, d.Ino, "c")
	require.Zero(t, e)
	require.Less(t, cAttr.Size, uint64(192<<10), "the refused write is not in the mount's answer")
	_, e = ops.Lookup(ctx, d.Ino, "after")
	require.Zero(t, e, "operations after the refused one are kept")
}

// TestBufferedLinkLimit: a hard link past the cluster's limit of names of
// one inode is refused with EMLINK, as the cluster refuses it, instead of
// being answered and then lost at commit.
func TestBufferedLinkLimit(t *testing.T) {
	ops, _, other := newBufOps(t)
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	a, out, e := ops.Create(ctx, d.Ino, "f", syscall.O_WRONLY|syscall.O_EXCL, 0o644, root)
	require.Zero(t, e)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	for i := 1; i < maxLinks; i++ {
		_, e := ops.Link(ctx, a.Ino, d.Ino, fmt.Sprintf("l%05d", i)) // in order: each lands at the listing's end
		require.Zero(t, e, "link %d", i)
	}
	_, e = ops.Link(ctx, a.Ino, d.Ino, "over")
	require.Equal(t, syscall.EMLINK, e)
	require.Zero(t, ops.Fsync(ctx, d.Ino))
	_, committed, failed := ops.jr.Stats()
	require.Zero(t, failed, "operations lost at commit")
	require.NotZero(t, committed)
	_, err := other.Lstat("/t/over")
	require.ErrorIs(t, err, fs.ErrNotExist)
	a, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.EqualValues(t, maxLinks, a.Nlink)
}

// TestBufferedSyncOfLongJournal: an fsync commits a journal that takes
// longer than one operation's time limit, as long as its batches keep
// committing; the limit is for a cluster that stops answering.
func TestBufferedSyncOfLongJournal(t *testing.T) {
	// Small batches, so that the journal is still seconds long when the
	// creates are done.
	ops, _, other := newCapOpsWith(t, Options{Buffered: true, Journal: client.JournalOptions{MaxAge: time.Hour, MaxOps: 8}})
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	const files = 2000
	for i := range files {
		a, out, e := ops.Create(ctx, d.Ino, fmt.Sprintf("f%05d", i), syscall.O_WRONLY|syscall.O_EXCL, 0o644, root)
		require.Zero(t, e)
		require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	}
	ops.opt.OpTimeout = time.Second
	start := time.Now()
	require.Zero(t, ops.Fsync(ctx, d.Ino))
	t.Logf("committed %d creates in %v", files, time.Since(start))
	_, _, failed := ops.jr.Stats()
	require.Zero(t, failed)
	ents, err := other.ReadDir("/t")
	require.NoError(t, err)
	require.Len(t, ents, files)
}

// TestBufferedSetAttrOfNothing: a setattr that changes nothing (chown
// with owner and group -1) leaves the change time, as the cluster does
// with such a command, so the mount never answers a ctime the cluster
// does not keep.
func TestBufferedSetAttrOfNothing(t *testing.T) {
	ops, _, other := newBufOps(t)
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	a, out, e := ops.Create(ctx, d.Ino, "f", syscall.O_WRONLY|syscall.O_EXCL, 0o644, root)
	require.Zero(t, e)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	before, e := ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	time.Sleep(10 * time.Millisecond)
	got, e := ops.SetAttr(ctx, a.Ino, SetAttrIn{})
	require.Zero(t, e)
	require.True(t, got.Ctime.Equal(before.Ctime), "ctime %v, was %v", got.Ctime, before.Ctime)
	require.Zero(t, ops.Fsync(ctx, a.Ino))
	st, err := other.Lstat("/t/f")
	require.NoError(t, err)
	ctime := time.Unix(0, st.Sys().(*pb.Attr).GetCtimeNs())
	require.True(t, ctime.Equal(got.Ctime), "the cluster's ctime %v, answered %v", ctime, got.Ctime)
}

// TestBufferedCreateTruncatedAfterRecall: a file created by a buffered
// create (opened without the cluster) is still truncated through its
// descriptor after another client's open recalled the capability and the
// file was pinned with a cluster handle.
func TestBufferedCreateTruncatedAfterRecall(t *testing.T) {
	ops, _, other := newBufOps(t)
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	_, e = ops.Mkdir(ctx, d.Ino, "warm", 0o755, root) // takes t exclusively
	require.Zero(t, e)
	a, out, e := ops.Create(ctx, d.Ino, "f", syscall.O_RDWR, 0o444, root)
	require.Zero(t, e)
	require.True(t, isLocal(out.Handle), "the create was not buffered")

	h, _, err := other.OpenLoc(ctx, &pb.Loc{Path: "/t/f"}, syscall.O_RDWR, 0, 0, 0, false, false)
	require.NoError(t, err)
	defer func() { _ = other.CloseHandle(ctx, h) }()

	for _, size := range []uint64{0, 100000} {
		got, e := ops.SetAttr(ctx, a.Ino, SetAttrIn{Handle: out.Handle, SetSize: true, Size: size})
		require.Zero(t, e, "truncate to %d", size)
		require.Equal(t, size, got.Size)
	}
	pa, err := other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.EqualValues(t, 100000, pa.Size)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}

// TestStatOfHeldWritesAnsweredLocally: a stat of a file the mount holds
// exclusively, with writes acknowledged and not yet committed, is answered
// without a call to the cluster, with the size the writes extend the file
// to and an mtime past the one the cluster last gave; another client's
// stat recalls the capability and sees the same size.
func TestStatOfHeldWritesAnsweredLocally(t *testing.T) {
	ops, c, other := newBufOps(t)
	ctx := context.Background()
	a, out, committed := writtenBehind(t, ops)
	big := committed.Size

	n, e := ops.Write(ctx, a.Ino, out.Handle, int64(big), []byte("more"))
	require.Zero(t, e)
	require.Equal(t, 4, n)
	require.True(t, ops.dirty(a.Ino), "the write was acknowledged before its commit")
	before := c.Calls()
	got, e := ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.Equal(t, before, c.Calls(), "the stat went to the cluster")
	require.True(t, ops.dirty(a.Ino), "the stat committed the write")
	require.EqualValues(t, big+4, got.Size)
	require.True(t, got.Mtime.After(committed.Mtime), "mtime %v not past %v", got.Mtime, committed.Mtime)

	st, err := other.Lstat("/t/f")
	require.NoError(t, err)
	require.EqualValues(t, big+4, st.Size())
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}

// TestOlderWriteResultAfterNewerKeepsNewer: two write-behind commits of one
// handle may apply in the cluster in the other order than their answers
// come back. When the newer answer came first and a third commit began
// before the older answer arrived, the older one (a smaller size, an
// earlier change time) must not replace the newer as the base a stat is
// answered from: fsx saw the file shrink to the older size.
func TestOlderWriteResultAfterNewerKeepsNewer(t *testing.T) {
	ops, _, _ := newBufOps(t)
	a, out, cur := writtenBehind(t, ops)
	h := ops.file(out.Handle).handle

	attr := func(size uint64, ctime time.Time) *pb.Attr {
		return &pb.Attr{Ino: a.Ino, Mode: cur.Mode, Nlink: cur.Nlink, Size: size, CtimeNs: ctime.UnixNano(), MtimeNs: ctime.UnixNano()}
	}
	older, newer := cur.Ctime.Add(time.Millisecond), cur.Ctime.Add(2*time.Millisecond)
	first := ops.meta.commitBy(a.Ino, h)  // extends the file; applied second
	second := ops.meta.commitBy(a.Ino, h) // within the file; applied first
	ops.meta.committed(a.Ino, attr(cur.Size+100, newer), first)
	ops.meta.commitBy(a.Ino, h) // a third write is sent
	ops.meta.committed(a.Ino, attr(cur.Size, older), second)
	base, ok := ops.meta.writingBase(a.Ino)
	require.True(t, ok)
	require.EqualValues(t, cur.Size+100, base.Size, "the older answer replaced the newer")
}

// A commit that extends the file and ends while a stat of the file is
// being answered from what this mount wrote must count in the answer:
// either by its range or by the base it left.
func TestCommitEndingDuringStatCounts(t *testing.T) {
	ops, _, _ := newBufOps(t)
	ctx := context.Background()
	a, out, cur := writtenBehind(t, ops)
	f := ops.file(out.Handle)
	// An extending commit in flight, as sendBuffered starts one.
	start := ops.meta.commitBy(a.Ino, f.handle)
	r := f.claim(int64(cur.Size), int64(cur.Size)+100)
	// A write inside the file, collected.
	_, e := ops.Write(ctx, a.Ino, out.Handle, 0, []byte("inside"))
	require.Zero(t, e)
	require.True(t, ops.dirty(a.Ino))

	later := cur.Ctime.Add(time.Millisecond)
	ops.betweenReads = func() {
		ops.betweenReads = nil
		ops.meta.committed(a.Ino, &pb.Attr{Ino: a.Ino, Mode: cur.Mode, Nlink: cur.Nlink, Size: cur.Size + 100,
			CtimeNs: later.UnixNano(), MtimeNs: later.UnixNano()}, start)
		f.release(r)
	}
	got, ok := ops.writtenAttr(a.Ino)
	require.True(t, ok)
	require.EqualValues(t, cur.Size+100, got.Size, "the extending commit counted in neither read")
}

// A buffer being sent waits for an overlapping commit still in flight;
// meanwhile it is in neither the buffer nor the ranges in flight, and a
// stat must still count it.
func TestBufferWaitingForOverlapCounts(t *testing.T) {
	ops, _, _ := newBufOps(t)
	ctx := context.Background()
	a, out, cur := writtenBehind(t, ops)
	f := ops.file(out.Handle)
	// A commit in flight over the file's last bytes, never answered
	// until the end of the test.
	r := f.claim(int64(cur.Size)-100, int64(cur.Size))
	// A write over those bytes that extends the file, collected; the
	// drain that sends it waits for the commit above.
	_, e := ops.Write(ctx, a.Ino, out.Handle, int64(cur.Size)-50, make([]byte, 150))
	require.Zero(t, e)
	drained := make(chan struct{})
	go func() { ops.drain(f); close(drained) }()
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.buf) == 0
	}, 10*time.Second, time.Millisecond, "the drain never took the buffer")
	got, ok := ops.writtenAttr(a.Ino)
	require.True(t, ok)
	require.EqualValues(t, cur.Size+100, got.Size, "the buffer waiting to be sent did not count")
	f.release(r)
	<-drained
}

// writtenBehind makes /t/f open for writing with data past what the
// journal carries for a new file (so written behind), committed; cur is
// its attributes then.
func writtenBehind(t *testing.T, ops *ClientOps) (a Attr, out OpenOut, cur Attr) {
	t.Helper()
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "t", 0o755, root)
	require.Zero(t, e)
	a, out, e = ops.Create(ctx, d.Ino, "f", syscall.O_WRONLY|syscall.O_EXCL, 0o644, root)
	require.Zero(t, e)
	big := make([]byte, jrFileBytes+64<<10)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 0, big)
	require.Zero(t, e)
	require.Zero(t, ops.Fsync(ctx, a.Ino))
	cur, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.EqualValues(t, len(big), cur.Size)
	return a, out, cur
}
