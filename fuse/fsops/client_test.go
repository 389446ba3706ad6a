package fsops

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/server/servertest"
)

// newOps starts a one-node cluster and returns operations over a client
// of it, plus a second, independent client.
func newOps(t *testing.T, opt Options) (*ClientOps, *client.Client) {
	t.Helper()
	cl := servertest.StartCluster(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, cl.APIAddrs())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	other, err := client.New(ctx, cl.APIAddrs())
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	return New(c, opt), other
}

var root = Caller{}

// TestWriteBehindModel writes sequential runs and random overlapping
// pieces through one handle and checks, against a byte slice doing the
// same, what the mount itself reports before the handle is flushed (size
// and data, through the barrier) and what another client sees after.
func TestWriteBehindModel(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(map[bool]string{false: "write-behind", true: "sync"}[sync], func(t *testing.T) {
			ops, other := newOps(t, Options{SyncWrites: sync})
			ctx := context.Background()
			a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
			require.Zero(t, e)
			var model []byte
			write := func(off int64, data []byte) {
				n, e := ops.Write(ctx, a.Ino, out.Handle, off, data)
				require.Zero(t, e)
				require.Equal(t, len(data), n)
				if end := int(off) + len(data); end > len(model) {
					model = append(model, make([]byte, end-len(model))...)
				}
				copy(model[off:], data)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			chunk := func(n int) []byte {
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				return b
			}
			// A sequential stream of kernel-sized requests...
			for off := int64(0); off < 3<<20+5000; off += 128 << 10 {
				write(off, chunk(128<<10))
			}
			// ...a stream of whole-buffer requests (go-fuse sends 1 MiB)...
			for off, end := int64(len(model)), int64(len(model))+4<<20; off < end; off += writeBuf {
				write(off, chunk(writeBuf))
			}
			// ...then overlapping pieces anywhere, some past the end,
			// some of a whole buffer.
			for i := range 40 {
				n := 1 + rng.IntN(200000)
				if i%5 == 0 {
					n = writeBuf
				}
				write(rng.Int64N(int64(len(model))+100000), chunk(n))
			}
			// The last write grows the file and stays buffered.
			write(int64(len(model)), chunk(5000))
			got, e := ops.GetAttr(ctx, a.Ino)
			require.Zero(t, e)
			require.Equal(t, uint64(len(model)), got.Size, "getattr must include acknowledged writes")
			looked, e := ops.Lookup(ctx, RootIno, "f")
			require.Zero(t, e)
			require.Equal(t, uint64(len(model)), looked.Size, "lookup must include acknowledged writes")
			buf := make([]byte, len(model)+10)
			n, e := ops.Read(ctx, a.Ino, out.Handle, 0, buf)
			require.Zero(t, e)
			require.True(t, bytes.Equal(model, buf[:n]), "read back through the mount")

			require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
			n, err := other.ReadIno(ctx, a.Ino, 0, buf)
			require.NoError(t, err)
			require.True(t, bytes.Equal(model, buf[:n]), "another client after flush")
			require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
		})
	}
}

// TestTruncateAfterBufferedWrites checks that a truncate is not undone by
// a buffered write committed after it.
func TestTruncateAfterBufferedWrites(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_WRONLY, 0o644, root)
	require.Zero(t, e)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 0, bytes.Repeat([]byte("x"), 4096))
	require.Zero(t, e)
	at, e := ops.SetAttr(ctx, a.Ino, SetAttrIn{SetSize: true, Size: 10})
	require.Zero(t, e)
	require.Equal(t, uint64(10), at.Size)
	require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
	st, err := other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.Equal(t, uint64(10), st.GetSize())
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}

// TestAppendHandlesWriteAtTheEnd checks that an O_APPEND handle appends
// whatever offset the kernel sends, even when another client grew the file
// meanwhile.
func TestAppendHandlesWriteAtTheEnd(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "log", syscall.O_WRONLY|syscall.O_APPEND, 0o644, root)
	require.Zero(t, e)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 0, []byte("one "))
	require.Zero(t, e)
	_, _, err := other.WriteIno(ctx, a.Ino, 4, []byte("two "))
	require.NoError(t, err)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 4, []byte("three"))
	require.Zero(t, e)
	require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
	buf := make([]byte, 100)
	n, err := other.ReadIno(ctx, a.Ino, 0, buf)
	require.NoError(t, err)
	require.Equal(t, "one two three", string(buf[:n]))
}

// TestACLXattrsRefused checks that POSIX ACL xattrs are refused (so that
// programs fall back to chmod) and hidden from listings.
func TestACLXattrsRefused(t *testing.T) {
	ops, _ := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_WRONLY, 0o644, root)
	require.Zero(t, e)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	require.Equal(t, syscall.EOPNOTSUPP, ops.SetXattr(ctx, a.Ino, "system.posix_acl_access", []byte{2, 0, 0, 0}, 0))
	_, e = ops.GetXattr(ctx, a.Ino, "system.posix_acl_default")
	require.Equal(t, syscall.EOPNOTSUPP, e)
	require.Zero(t, ops.SetXattr(ctx, a.Ino, "user.x", []byte("1"), 0))
	names, e := ops.ListXattr(ctx, a.Ino)
	require.Zero(t, e)
	require.Equal(t, []string{"user.x"}, names)
	// security.capability misses are cached, and a set clears the cache.
	_, e = ops.GetXattr(ctx, a.Ino, capXattr)
	require.Equal(t, syscall.ENODATA, e)
	require.Zero(t, ops.SetXattr(ctx, a.Ino, capXattr, []byte{1, 2, 3}, 0))
	v, e := ops.GetXattr(ctx, a.Ino, capXattr)
	require.Zero(t, e)
	require.Equal(t, []byte{1, 2, 3}, v)
}

// TestExclusiveCreateKnowsNoCapability checks that a file made with
// O_EXCL is known to have no security.capability, so the kernel's check
// before its first write costs no query: a capability another client sets
// within the cache's lifetime is not seen (the accepted staleness), while
// one set through this mount is.
func TestExclusiveCreateKnowsNoCapability(t *testing.T) {
	ops, c := newOps(t, Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		flags int
		want  syscall.Errno // GetXattr after another client set the capability
	}{
		{"excl", syscall.O_WRONLY | syscall.O_EXCL, syscall.ENODATA},
		{"plain", syscall.O_WRONLY, 0},
	} {
		a, out, e := ops.Create(ctx, RootIno, tc.name, tc.flags, 0o644, root)
		require.Zero(t, e)
		require.NoError(t, c.Setxattr("/"+tc.name, capXattr, []byte{9}, 0))
		_, e = ops.GetXattr(ctx, a.Ino, capXattr)
		require.Equal(t, tc.want, e, tc.name)
		require.Zero(t, ops.SetXattr(ctx, a.Ino, capXattr, []byte{1}, 0))
		v, e := ops.GetXattr(ctx, a.Ino, capXattr)
		require.Zero(t, e)
		require.Equal(t, []byte{1}, v)
		require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	}
}

// TestStickyDirectory checks the restricted deletion flag, which fsops
// enforces because the kernel never sees it.
func TestStickyDirectory(t *testing.T) {
	ops, _ := newOps(t, Options{})
	ctx := context.Background()
	d, e := ops.Mkdir(ctx, RootIno, "tmp", 0o1777, root)
	require.Zero(t, e)
	require.Equal(t, uint32(syscall.S_ISVTX), d.Mode&syscall.S_ISVTX, "the cluster keeps the sticky bit")
	alice, bob := Caller{Uid: 1000, Gid: 1000}, Caller{Uid: 1001, Gid: 1001}
	a, out, e := ops.Create(ctx, d.Ino, "alices", syscall.O_WRONLY, 0o666, alice)
	require.Zero(t, e)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	require.Equal(t, syscall.EPERM, ops.Unlink(ctx, d.Ino, "alices", bob))
	require.Equal(t, syscall.EPERM, ops.Rename(ctx, d.Ino, "alices", d.Ino, "bobs", bob))
	require.Equal(t, syscall.ENOENT, ops.Unlink(ctx, d.Ino, "nobody", bob))
	require.Zero(t, ops.Rename(ctx, d.Ino, "alices", d.Ino, "moved", alice))
	require.Zero(t, ops.Unlink(ctx, d.Ino, "moved", alice))
}

// recorder is an Invalidator that records what it was asked to drop.
type recorder struct {
	mu      sync.Mutex
	data    map[uint64]int
	entries map[string]int
}

func (r *recorder) InvalidateAttr(ino uint64) {}
func (r *recorder) InvalidateData(ino uint64) {
	r.mu.Lock()
	r.data[ino]++
	r.mu.Unlock()
}
func (r *recorder) InvalidateEntry(parent uint64, name string) {
	r.mu.Lock()
	r.entries[name]++
	r.mu.Unlock()
}
func (r *recorder) count(ino uint64, name string) (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.data[ino], r.entries[name]
}

// TestReadWindowsNeverStale reads through readahead windows while the file
// changes through this handle and through another client.
func TestReadWindowsNeverStale(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{data: map[uint64]int{}, entries: map[string]int{}}
	go ops.Watch(ctx, rec)

	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	content := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	for off := 0; off < len(content); off += 128 << 10 {
		_, e := ops.Write(ctx, a.Ino, out.Handle, int64(off), content[off:off+128<<10])
		require.Zero(t, e)
	}
	read := func(off int64) []byte {
		buf := make([]byte, 128<<10)
		n, e := ops.Read(ctx, a.Ino, out.Handle, off, buf)
		require.Zero(t, e)
		return buf[:n]
	}
	require.Equal(t, content[:128<<10], read(0))

	// A write through the handle inside the fetched window.
	_, e = ops.Write(ctx, a.Ino, out.Handle, 200<<10, []byte("MINE"))
	require.Zero(t, e)
	copy(content[200<<10:], "MINE")
	require.Equal(t, content[128<<10:256<<10], read(128<<10))

	// A write by another client, seen once its change event arrives.
	require.Equal(t, content[256<<10:384<<10], read(256<<10))
	_, _, err := other.WriteIno(ctx, a.Ino, 300<<10, []byte("THEIRS"))
	require.NoError(t, err)
	copy(content[300<<10:], "THEIRS")
	deadline := time.Now().Add(10 * time.Second)
	for !bytes.Equal(content[256<<10:384<<10], read(256<<10)) {
		require.True(t, time.Now().Before(deadline), "another client's write never showed through the window")
		time.Sleep(time.Millisecond) // polling interval
	}
	data, _ := rec.count(a.Ino, "")
	require.Positive(t, data, "the change event reached the invalidator")

	// A write by another client into a window fetched ahead (reading
	// window 0 fetched windows 1 and 2), before the reader gets there.
	_, _, err = other.WriteIno(ctx, a.Ino, 2<<20+5000, []byte("AHEAD"))
	require.NoError(t, err)
	copy(content[2<<20+5000:], "AHEAD")
	for !bytes.Equal(content[2<<20:2<<20+128<<10], read(2<<20)) {
		require.True(t, time.Now().Before(deadline), "another client's write never showed through a window fetched ahead")
		time.Sleep(time.Millisecond) // polling interval
	}

	// The whole file, through windows, matches.
	var all []byte
	for off := int64(0); off < int64(len(content)); off += 128 << 10 {
		all = append(all, read(off)...)
	}
	require.True(t, bytes.Equal(content, all))
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}

// TestSequentialDetection: a reader moving forward, with the kernel's
// out-of-order requests, is sequential; jumps are not.
func TestSequentialDetection(t *testing.T) {
	var r raState
	const w = raWindow
	for i, c := range []struct {
		start int64
		want  bool
	}{
		{0, true}, {w, true}, {0, true}, {2 * w, true}, {w, true}, {3 * w, true},
		{10 * w, false}, {11 * w, true}, {2 * w, false}, {3 * w, true},
		{0, false}, {w, true}, {0, true}, {2 * w, true}, // a second pass
	} {
		require.Equal(t, c.want, r.sequential(c.start), "read %d at window %d", i, c.start/w)
	}
	var fresh raState
	require.False(t, fresh.sequential(5*w), "a first read in the middle is a jump")
}

// TestReadaheadDepth: a sequential reader has raAhead windows fetched
// ahead of the one it reads; a large read that jumps fetches only its own.
func TestReadaheadDepth(t *testing.T) {
	ops, _ := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	chunk := bytes.Repeat([]byte{7}, 128<<10)
	for off := int64(0); off < 12*raWindow; off += int64(len(chunk)) {
		_, e := ops.Write(ctx, a.Ino, out.Handle, off, chunk)
		require.Zero(t, e)
	}
	windows := func() []int64 {
		var starts []int64
		for _, off := range ops.cache.starts(a.Ino) {
			starts = append(starts, off/raWindow)
		}
		return starts
	}
	buf := make([]byte, 128<<10)
	_, e = ops.Read(ctx, a.Ino, out.Handle, 0, buf)
	require.Zero(t, e)
	require.Equal(t, []int64{0, 1, 2}, windows())
	_, e = ops.Read(ctx, a.Ino, out.Handle, raWindow, buf)
	require.Zero(t, e)
	require.Equal(t, []int64{0, 1, 2, 3}, windows())

	_, e = ops.Read(ctx, a.Ino, out.Handle, 9*raWindow, buf)
	require.Zero(t, e)
	require.Equal(t, []int64{0, 1, 2, 3, 9}, windows(), "a jump fetches its own window only")
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}

// TestAttrBehind: mode, owner and explicit-time changes to a file open
// here are held until the descriptor is flushed (tar's write, futimens,
// fchown, fchmod, close), answered with the attributes the file will
// have, and committed in order with the data.
func TestAttrBehind(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_WRONLY|syscall.O_EXCL, 0o600, root)
	require.Zero(t, e)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 0, make([]byte, 4608))
	require.Zero(t, e)
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	got, e := ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMtime: true, Mtime: mtime, SetAtime: true, Atime: mtime})
	require.Zero(t, e)
	require.True(t, mtime.Equal(got.Mtime))
	require.Equal(t, uint64(4608), got.Size, "the answer includes the collected write")
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetUid: true, Uid: 42, SetGid: true, Gid: 43})
	require.Zero(t, e)
	got, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMode: true, Mode: 0o644})
	require.Zero(t, e)
	want := func(a Attr) {
		t.Helper()
		require.Equal(t, uint32(syscall.S_IFREG|0o644), a.Mode)
		require.Equal(t, [2]uint32{42, 43}, [2]uint32{a.Uid, a.Gid})
		require.True(t, mtime.Equal(a.Mtime), "mtime %v", a.Mtime)
		require.Equal(t, uint64(4608), a.Size)
	}
	want(got)
	got, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	want(got)

	// Held, not yet committed: the cluster still has the old mode.
	pa, err := other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.Equal(t, uint32(0o600), pa.GetMode()&0o7777)

	// close(2): data and attributes are committed, data first.
	require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
	pa, err = other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	want(attrOf(pa))

	// A write after a held mtime still moves the mtime.
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMtime: true, Mtime: mtime})
	require.Zero(t, e)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 4608, []byte("more"))
	require.Zero(t, e)
	require.Zero(t, ops.Fsync(ctx, a.Ino))
	pa, err = other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.True(t, time.Unix(0, pa.GetMtimeNs()).After(mtime), "the later write set the mtime")
	require.Equal(t, uint64(4612), pa.GetSize())

	// While changes are held, another client's changes are still seen.
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMtime: true, Mtime: mtime})
	require.Zero(t, e)
	_, _, err = other.WriteIno(ctx, a.Ino, 10000, []byte("theirs"))
	require.NoError(t, err)
	got, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.Equal(t, uint64(10006), got.Size)

	// fsync commits held changes.
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMode: true, Mode: 0o640})
	require.Zero(t, e)
	require.Zero(t, ops.Fsync(ctx, a.Ino))
	pa, err = other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.Equal(t, uint32(0o640), pa.GetMode()&0o7777)

	// Set-ID bits are never held.
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMode: true, Mode: 0o4755})
	require.Zero(t, e)
	pa, err = other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.Equal(t, uint32(0o4755), pa.GetMode()&0o7777)
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMode: true, Mode: 0o644})
	require.Zero(t, e)
	pa, err = other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.Equal(t, uint32(0o644), pa.GetMode()&0o7777, "a change to a set-ID file is not held either")

	// The last release commits what is held, without a flush.
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMode: true, Mode: 0o600})
	require.Zero(t, e)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	pa, err = other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.Equal(t, uint32(0o600), pa.GetMode()&0o7777)

	// A file not open here: committed at once.
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMode: true, Mode: 0o604})
	require.Zero(t, e)
	pa, err = other.GetAttr(ctx, a.Ino)
	require.NoError(t, err)
	require.Equal(t, uint32(0o604), pa.GetMode()&0o7777)
}

// TestAttrBehindSeesOthers: while changes are held and the change stream
// is received, the answers reuse the cluster's attributes, until a change
// by another client is announced.
func TestAttrBehindSeesOthers(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{data: map[uint64]int{}, entries: map[string]int{}}
	go ops.Watch(ctx, rec)
	for !ops.watching.Load() {
		time.Sleep(time.Millisecond) // polling interval
	}
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_WRONLY|syscall.O_EXCL, 0o600, root)
	require.Zero(t, e)
	_, e = ops.Write(ctx, a.Ino, out.Handle, 0, []byte("mine"))
	require.Zero(t, e)
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMtime: true, Mtime: mtime})
	require.Zero(t, e)
	got, e := ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.Equal(t, uint64(4), got.Size)

	_, _, err := other.WriteIno(ctx, a.Ino, 100, []byte("theirs"))
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, e = ops.GetAttr(ctx, a.Ino)
		require.Zero(t, e)
		if got.Size == 106 {
			break
		}
		require.True(t, time.Now().Before(deadline), "another client's write never showed in the held answer (size %d)", got.Size)
		time.Sleep(time.Millisecond) // polling interval
	}
	require.True(t, mtime.Equal(got.Mtime), "the held mtime stays")

	// This mount's own link and unlink show at once, before their
	// change events arrive (the link commits what is held; hold again).
	_, e = ops.Link(ctx, a.Ino, RootIno, "g")
	require.Zero(t, e)
	_, e = ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMtime: true, Mtime: mtime})
	require.Zero(t, e)
	got, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.Equal(t, uint32(2), got.Nlink)
	require.Zero(t, ops.Unlink(ctx, RootIno, "g", root))
	require.Zero(t, ops.Unlink(ctx, RootIno, "f", root))
	got, e = ops.GetAttr(ctx, a.Ino)
	require.Zero(t, e)
	require.Equal(t, uint32(0), got.Nlink)
	require.True(t, mtime.Equal(got.Mtime))
}

// TestAttrBehindOwnChanges: this mount's own link, unlink and rename of a
// file with held changes show in the answers at once, without waiting for
// their change events (none arrive here: the stream is marked received
// but not read).
func TestAttrBehindOwnChanges(t *testing.T) {
	ops, _ := newOps(t, Options{})
	ops.watching.Store(true)
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_WRONLY|syscall.O_EXCL, 0o600, root)
	require.Zero(t, e)
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	hold := func() {
		t.Helper()
		_, e := ops.SetAttr(ctx, a.Ino, SetAttrIn{SetMtime: true, Mtime: mtime})
		require.Zero(t, e)
	}
	nlink := func() uint32 {
		t.Helper()
		got, e := ops.GetAttr(ctx, a.Ino)
		require.Zero(t, e)
		require.True(t, mtime.Equal(got.Mtime))
		return got.Nlink
	}
	hold()
	require.Equal(t, uint32(1), nlink())
	_, e = ops.Link(ctx, a.Ino, RootIno, "g")
	require.Zero(t, e)
	hold()
	require.Equal(t, uint32(2), nlink())
	require.Zero(t, ops.Unlink(ctx, RootIno, "g", root))
	require.Equal(t, uint32(1), nlink())
	require.Zero(t, ops.Rename(ctx, RootIno, "f", RootIno, "k", root))
	require.Equal(t, uint32(1), nlink())
	require.Zero(t, ops.Unlink(ctx, RootIno, "k", root))
	require.Equal(t, uint32(0), nlink())
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}

// TestNoXattrsKnown checks that an inode the cluster reported without any
// xattr is answered for without a query: getxattr is ENODATA and
// listxattr empty even after another client set one (the staleness the
// change stream bounds), until a change event names the inode or a
// setxattr through this mount drops what was known. An inode with xattrs
// is always asked about.
func TestNoXattrsKnown(t *testing.T) {
	ops, c := newOps(t, Options{})
	ops.noXattrs.ttl = time.Hour // what is known ends by events and setxattr only
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, c.WriteFile("/plain", []byte("x"), 0o644))
	require.NoError(t, c.WriteFile("/with", []byte("x"), 0o644))
	require.NoError(t, c.Setxattr("/with", "user.a", []byte("1"), 0))
	plain, e := ops.Lookup(ctx, RootIno, "plain")
	require.Zero(t, e)
	with, e := ops.Lookup(ctx, RootIno, "with")
	require.Zero(t, e)

	require.NoError(t, c.Setxattr("/plain", "user.b", []byte("2"), 0))
	_, e = ops.GetXattr(ctx, plain.Ino, "user.b")
	require.Equal(t, syscall.ENODATA, e, "known to have none: not asked")
	names, e := ops.ListXattr(ctx, plain.Ino)
	require.Zero(t, e)
	require.Empty(t, names)
	v, e := ops.GetXattr(ctx, with.Ino, "user.a")
	require.Zero(t, e)
	require.Equal(t, []byte("1"), v)

	// A setxattr through the mount forgets what was known.
	require.Zero(t, ops.SetXattr(ctx, plain.Ino, "user.c", []byte("3"), 0))
	v, e = ops.GetXattr(ctx, plain.Ino, "user.b")
	require.Zero(t, e)
	require.Equal(t, []byte("2"), v)

	// So does a change event naming the inode.
	go ops.Watch(ctx, &recorder{data: map[uint64]int{}, entries: map[string]int{}})
	require.Eventually(t, ops.watching.Load, 10*time.Second, time.Millisecond)
	require.NoError(t, c.WriteFile("/later", []byte("x"), 0o644))
	later, e := ops.Lookup(ctx, RootIno, "later")
	require.Zero(t, e)
	require.NoError(t, c.Setxattr("/later", "user.d", []byte("4"), 0))
	require.Eventually(t, func() bool {
		v, e := ops.GetXattr(ctx, later.Ino, "user.d")
		return e == 0 && string(v) == "4"
	}, 10*time.Second, time.Millisecond, "another client's setxattr seen once its event arrives")
}

// TestConcurrentIOOnOneInode runs several writers, readers and fsyncs
// through separate handles of one file at once, as fio does with several
// jobs on one file: drains on some threads while others start commits.
// Each job writes its own region in sequential runs (so writes are
// collected) and checks what it reads back of it.
func TestConcurrentIOOnOneInode(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "shared", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
	const jobs, region, block = 4, 512 << 10, 4 << 10
	models := make([][]byte, jobs)
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, e := ops.Open(ctx, a.Ino, syscall.O_RDWR, root)
			if e != 0 {
				errs <- e
				return
			}
			rng := rand.New(rand.NewPCG(uint64(j), 7))
			model := make([]byte, region)
			base := int64(j * region)
			buf := make([]byte, block)
			for i := range 400 {
				off := int64(rng.IntN(region/block)) * block
				switch i % 4 {
				case 0, 1: // a short sequential run, collected
					for k := 0; k < 4 && off+block <= region; k, off = k+1, off+block {
						data := bytes.Repeat([]byte{byte(rng.Uint32())}, block)
						if _, e := ops.Write(ctx, a.Ino, o.Handle, base+off, data); e != 0 {
							errs <- e
							return
						}
						copy(model[off:], data)
					}
				case 2:
					n, e := ops.Read(ctx, a.Ino, o.Handle, base+off, buf)
					if e != 0 {
						errs <- e
						return
					}
					if n > 0 && !bytes.Equal(buf[:n], model[off:off+int64(n)]) {
						errs <- fmt.Errorf("job %d read stale data at %d", j, off)
						return
					}
				case 3:
					if i%16 == 3 {
						if e := ops.Fsync(ctx, a.Ino); e != 0 {
							errs <- e
							return
						}
					}
				}
			}
			if e := ops.Flush(ctx, a.Ino, o.Handle); e != 0 {
				errs <- e
				return
			}
			models[j] = model
			if e := ops.Release(ctx, a.Ino, o.Handle); e != 0 {
				errs <- e
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for j, model := range models {
		got := make([]byte, region)
		n, err := other.ReadIno(ctx, a.Ino, int64(j*region), got)
		require.NoError(t, err)
		require.Equal(t, model[:n], got[:n], "job %d", j)
	}
}

// TestConcurrentWritesOfOneHandle sends the pieces of one write through
// one handle all at once, as the kernel does for an O_DIRECT write (128
// KiB each with bazil), and checks that none is lost: another client reads
// every piece of every round after the flush.
func TestConcurrentWritesOfOneHandle(t *testing.T) {
	ops, other := newOps(t, Options{})
	ctx := context.Background()
	a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
	require.Zero(t, e)
	const pieces, piece = 8, 128 << 10
	got := make([]byte, pieces*piece)
	for round := range 40 {
		want := bytes.Repeat([]byte{byte('A' + round%26)}, pieces*piece)
		var wg sync.WaitGroup
		errs := make(chan syscall.Errno, pieces)
		for i := range pieces {
			wg.Add(1)
			go func() {
				defer wg.Done()
				off := i * piece
				if _, e := ops.Write(ctx, a.Ino, out.Handle, int64(off), want[off:off+piece]); e != 0 {
					errs <- e
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			require.Zero(t, e)
		}
		require.Zero(t, ops.Flush(ctx, a.Ino, out.Handle))
		n, err := other.ReadIno(ctx, a.Ino, 0, got)
		require.NoError(t, err)
		require.Equal(t, len(want), n)
		for i := range pieces {
			require.True(t, bytes.Equal(want[i*piece:(i+1)*piece], got[i*piece:(i+1)*piece]),
				"round %d: piece %d lost", round, i)
		}
	}
	require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
}
