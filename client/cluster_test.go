package client_test

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
)

// connect starts a client of cluster c and closes it at the end of the test.
func connect(t *testing.T, c *servertest.Cluster, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cl, err := client.New(ctx, c.APIAddrs(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func TestClientMovesFromForwardingFollowerToLeader(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second).APIAddr()
	cl := connect(t, c)
	follower := ""
	for _, a := range c.APIAddrs() {
		if a != leader {
			follower = a
		}
	}
	// A follower forwards the write and names the leader in its answer;
	// the client's next calls go to the leader.
	cl.BelieveLeader(follower)
	require.Eventually(t, func() bool {
		return cl.WriteFile("/f", []byte("x"), 0o644) == nil && cl.Leader() == leader
	}, 10*time.Second, 10*time.Millisecond)
}

func TestFileAPI(t *testing.T) {
	cl := connect(t, servertest.StartCluster(t, 3))

	require.NoError(t, cl.MkdirAll("/a/b/c", 0o755))
	require.NoError(t, cl.MkdirAll("/a/b", 0o755), "existing directories are fine")
	f, err := cl.Create("/a/b/c/file")
	require.NoError(t, err)
	n, err := f.Write([]byte("hello, "))
	require.NoError(t, err)
	require.Equal(t, 7, n)
	_, err = f.WriteString("world")
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	off, err := f.Seek(0, io.SeekStart)
	require.NoError(t, err)
	require.Zero(t, off)
	got, err := io.ReadAll(f)
	require.NoError(t, err)
	require.Equal(t, "hello, world", string(got))
	_, err = f.WriteAt([]byte("W"), 7)
	require.NoError(t, err)
	buf := make([]byte, 5)
	n, err = f.ReadAt(buf, 7)
	require.NoError(t, err)
	require.Equal(t, "World", string(buf[:n]))
	n, err = f.ReadAt(buf, 10)
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, "ld", string(buf[:n]))
	end, err := f.Seek(-5, io.SeekEnd)
	require.NoError(t, err)
	require.Equal(t, int64(7), end)
	fi, err := f.Stat()
	require.NoError(t, err)
	require.Equal(t, "file", fi.Name())
	require.Equal(t, int64(12), fi.Size())
	require.True(t, fi.Mode().IsRegular())
	require.NoError(t, f.Truncate(5))
	require.NoError(t, f.Close())
	data, err := cl.ReadFile("/a/b/c/file")
	require.NoError(t, err)
	require.Equal(t, "hello", string(data))
	// A small file costs no buffer of a whole message (1 MiB) per read:
	// 16 reads allocate far less than one such buffer each.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 16 {
		_, err = cl.ReadFile("/a/b/c/file")
		require.NoError(t, err)
	}
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8*pb.MaxMessageData), "bytes allocated by 16 reads of 5 bytes")

	// Metadata operations.
	require.NoError(t, cl.Chmod("/a/b/c/file", 0o600))
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	require.NoError(t, cl.Chtimes("/a/b/c/file", time.Time{}, mtime))
	fi, err = cl.Stat("/a/b/c/file")
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o600), fi.Mode())
	require.True(t, mtime.Equal(fi.ModTime()), "%v", fi.ModTime())
	require.NoError(t, cl.Chown("/a/b/c/file", 1234, -1))
	fi, err = cl.Stat("/a/b/c/file")
	require.NoError(t, err)
	require.Equal(t, uint32(1234), fi.Sys().(*pb.Attr).Uid)
	require.NoError(t, cl.Truncate("/a/b/c/file", 2))
	data, err = cl.ReadFile("/a/b/c/file")
	require.NoError(t, err)
	require.Equal(t, "he", string(data))

	// Links.
	require.NoError(t, cl.Symlink("/a/b/c/file", "/a/link"))
	target, err := cl.Readlink("/a/link")
	require.NoError(t, err)
	require.Equal(t, "/a/b/c/file", target)
	fi, err = cl.Lstat("/a/link")
	require.NoError(t, err)
	require.Equal(t, fs.ModeSymlink, fi.Mode().Type())
	fi, err = cl.Stat("/a/link")
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular())
	require.NoError(t, cl.Link("/a/b/c/file", "/a/hard"))
	fi, err = cl.Stat("/a/hard")
	require.NoError(t, err)
	require.Equal(t, uint32(2), fi.Sys().(*pb.Attr).Nlink)

	// Rename and listing.
	require.NoError(t, cl.Rename("/a/hard", "/a/moved"))
	ents, err := cl.ReadDir("/a")
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"b", "link", "moved"}, names)
	require.True(t, ents[0].IsDir())
	require.Equal(t, fs.ModeSymlink, ents[1].Type())
	info, err := ents[2].Info()
	require.NoError(t, err)
	require.Equal(t, int64(2), info.Size())

	// Extended attributes.
	require.NoError(t, cl.Setxattr("/a/moved", "user.k", []byte("v"), 0))
	v, err := cl.Getxattr("/a/moved", "user.k")
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
	xs, err := cl.Listxattr("/a/moved")
	require.NoError(t, err)
	require.Equal(t, []string{"user.k"}, xs)
	require.ErrorIs(t, cl.Setxattr("/a/moved", "user.k", []byte("w"), client.XattrCreate), fs.ErrExist)
	require.NoError(t, cl.Removexattr("/a/moved", "user.k"))

	// Clone shares blocks.
	require.NoError(t, cl.WriteFile("/a/big", bytes.Repeat([]byte("x"), 1<<20), 0o644))
	require.NoError(t, cl.Clone("/a", "/copy"))
	data, err = cl.ReadFile("/copy/big")
	require.NoError(t, err)
	require.Len(t, data, 1<<20)
	u, err := cl.Usage("/")
	require.NoError(t, err)
	require.Less(t, u.PhysicalBytes, u.LogicalBytes)

	// Removal.
	require.ErrorIs(t, cl.Remove("/a"), syscall.ENOTEMPTY)
	require.NoError(t, cl.RemoveAll("/a"))
	require.NoError(t, cl.RemoveAll("/a"), "a missing tree is not an error")
	_, err = cl.Stat("/a")
	require.ErrorIs(t, err, fs.ErrNotExist)

	st, err := cl.Status(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, st.Leader)
	sf, err := cl.Statfs(t.Context())
	require.NoError(t, err)
	require.NotZero(t, sf.Files)
}

func TestErrnoClasses(t *testing.T) {
	cl := connect(t, servertest.StartCluster(t, 3))
	require.NoError(t, cl.WriteFile("/f", []byte("x"), 0o644))
	require.NoError(t, cl.Mkdir("/d", 0o755))
	require.NoError(t, cl.WriteFile("/d/x", nil, 0o644))

	tests := []struct {
		name   string
		err    error
		is     error
		errno  syscall.Errno
		op     string
		inPath string
	}{
		{"stat missing", second(cl.Stat("/nope")), fs.ErrNotExist, syscall.ENOENT, "stat", "/nope"},
		{"mkdir existing", cl.Mkdir("/d", 0o755), fs.ErrExist, syscall.EEXIST, "mkdir", "/d"},
		{"rmdir not empty", cl.Remove("/d"), fs.ErrExist, syscall.ENOTEMPTY, "remove", "/d"},
		{"file as dir", cl.Mkdir("/f/sub", 0o755), nil, syscall.ENOTDIR, "mkdir", "/f/sub"},
		{"open dir for writing", second(cl.OpenFile("/d", os.O_WRONLY, 0)), nil, syscall.EISDIR, "open", "/d"},
		{"create exclusive existing", second(cl.OpenFile("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)), fs.ErrExist, syscall.EEXIST, "open", "/f"},
		{"read missing", second(cl.ReadFile("/nope")), fs.ErrNotExist, syscall.ENOENT, "read", "/nope"},
		{"readdir of a file", second(cl.ReadDir("/f")), nil, syscall.ENOTDIR, "readdir", "/f"},
		{"long name", cl.Mkdir("/"+strings.Repeat("n", 300), 0o755), nil, syscall.ENAMETOOLONG, "mkdir", "/nnn"},
		{"readlink of a file", second(cl.Readlink("/f")), nil, syscall.EINVAL, "readlink", "/f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Error(t, tt.err)
			if tt.is != nil {
				require.ErrorIs(t, tt.err, tt.is)
			}
			require.ErrorIs(t, tt.err, tt.errno)
			require.Equal(t, tt.errno, client.Errno(tt.err))
			var pe *fs.PathError
			require.ErrorAs(t, tt.err, &pe)
			require.Equal(t, tt.op, pe.Op)
			require.True(t, strings.HasPrefix(pe.Path, tt.inPath), pe.Path)
		})
	}
	// Errors that name two paths.
	err := cl.Rename("/nope", "/x")
	require.ErrorIs(t, err, fs.ErrNotExist)
	var le *os.LinkError
	require.ErrorAs(t, err, &le)
	require.Equal(t, "rename /nope /x: no such file or directory", err.Error())
}

func second[T any](_ T, err error) error { return err }

func TestFSAdapter(t *testing.T) {
	cl := connect(t, servertest.StartCluster(t, 3))
	files := map[string]string{
		"top.txt": "top", "dir/a.txt": "alpha", "dir/b.txt": "", "dir/sub/deep.txt": "deep",
		"empty/.keep": "k",
	}
	var want []string
	for name, body := range files {
		require.NoError(t, cl.MkdirAll("/"+dirOf(name), 0o755))
		require.NoError(t, cl.WriteFile("/"+name, []byte(body), 0o644))
		want = append(want, name)
	}
	slices.Sort(want)
	fsys := cl.FS(t.Context())
	require.NoError(t, fstest.TestFS(fsys, want...))

	// A file larger than one message is read through streams. (Not in the
	// tree above: TestFS reads files in tiny pieces, one RPC each.)
	big := bytes.Repeat([]byte("0123456789"), 300_000)
	require.NoError(t, cl.WriteFile("/big.bin", big, 0o644))
	data, err := fs.ReadFile(fsys, "big.bin")
	require.NoError(t, err)
	require.Equal(t, big, data)
	_, err = fsys.Open("/abs")
	require.ErrorIs(t, err, fs.ErrInvalid)
	_, err = fsys.Open("missing")
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func dirOf(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[:i]
	}
	return ""
}

func TestLargeTransfers(t *testing.T) {
	cl := connect(t, servertest.StartCluster(t, 3, servertest.WithEphemeral()))
	// Over the (lowered) stream limit, so split into several streamed
	// commands, and not a multiple of the message size.
	defer client.SetStreamLimit(3 * pb.MaxMessageData)()
	size := 2*3*pb.MaxMessageData + pb.MaxMessageData + 12345
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	f, err := cl.Create("/large")
	require.NoError(t, err)
	n, err := f.Write(data)
	require.NoError(t, err)
	require.Equal(t, size, n)
	buf := make([]byte, size+100)
	n, err = f.ReadAt(buf, 0)
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, size, n)
	require.True(t, bytes.Equal(data, buf[:n]))
	require.NoError(t, f.Close())
	got, err := cl.ReadFile("/large")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
}

func TestFollowerOnlyAddresses(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	var followers []string
	for _, n := range c.Nodes() {
		if n != leader {
			followers = append(followers, n.APIAddr())
		}
	}
	cl, err := client.New(t.Context(), followers)
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.WriteFile("/via-follower", []byte("ok"), 0o644))
	data, err := cl.ReadFile("/via-follower")
	require.NoError(t, err)
	require.Equal(t, "ok", string(data))
	require.Contains(t, cl.Addrs(), leader.APIAddr(), "the client learned the leader's address")
}

func TestExclusiveOpen(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	a, b := connect(t, c), connect(t, c)
	require.NoError(t, a.WriteFile("/lock", nil, 0o644))

	held, err := a.OpenFile("/lock", os.O_RDWR|client.Exclusive, 0)
	require.NoError(t, err)

	// Fail mode: EWOULDBLOCK at once.
	_, err = b.OpenFile("/lock", os.O_RDWR|client.Exclusive, 0)
	require.ErrorIs(t, err, syscall.EWOULDBLOCK)

	// Wait mode with a deadline: gives up, and withdraws from the queue.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = b.OpenFileContext(ctx, "/lock", os.O_RDWR|client.ExclusiveWait, 0)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Wait mode through the file API: blocks until the holder closes.
	got := make(chan error, 1)
	go func() {
		f, err := b.OpenFileContext(t.Context(), "/lock", os.O_RDWR|client.ExclusiveWait, 0)
		if err == nil {
			err = f.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("exclusive open granted while held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, held.Close())
	require.NoError(t, <-got)

	// FIFO: queued opens are granted in the order they queued. The
	// low-level API shows the queue: an open with wait returns queued.
	held, err = a.OpenFile("/lock", os.O_RDWR|client.Exclusive, 0)
	require.NoError(t, err)
	cc := connect(t, c)
	hb := queue(t, b)
	hc := queue(t, cc)
	require.NoError(t, held.Close())
	requireGranted(t, b, hb, true)
	requireGranted(t, cc, hc, false)
	require.NoError(t, b.CloseHandle(t.Context(), hb))
	requireGranted(t, cc, hc, true)
	require.NoError(t, cc.CloseHandle(t.Context(), hc))
}

// queue makes an exclusive open of /lock that waits, and returns its
// handle, which must be queued.
func queue(t *testing.T, cl *client.Client) uint64 {
	t.Helper()
	res, err := cl.Do(t.Context(), &pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{
		Loc: &pb.Loc{Path: "/lock"}, Flags: 2, Exclusive: true, Wait: true,
	}}})
	require.NoError(t, err)
	require.True(t, res.Queued)
	return res.Handle
}

// requireGranted checks whether a queued handle has been granted; when it
// should be, it waits for the grant.
func requireGranted(t *testing.T, cl *client.Client, h uint64, want bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := cl.Query(ctx, &pb.Query{Q: &pb.Query_Handle{Handle: &pb.HandleQuery{Handle: h, Wait: want}}})
	require.NoError(t, err)
	require.Equal(t, want, !res.Queued)
}

// TestMknod: special files through the client library, with their io/fs
// modes and device numbers.
func TestMknod(t *testing.T) {
	cl := servertest.StartCluster(t, 1)
	c := connect(t, cl)
	for _, tc := range []struct {
		name string
		mode fs.FileMode
		dev  uint64
	}{
		{"fifo", fs.ModeNamedPipe | 0o640, 0},
		{"sock", fs.ModeSocket | 0o755, 0},
		{"chr", fs.ModeDevice | fs.ModeCharDevice | 0o666, 0x0103},
		{"blk", fs.ModeDevice | 0o660, 0x0800},
		{"reg", 0o644, 0},
	} {
		p := "/" + tc.name
		require.NoError(t, c.Mknod(p, tc.mode, tc.dev), tc.name)
		fi, err := c.Lstat(p)
		require.NoError(t, err)
		require.Equal(t, tc.mode, fi.Mode(), tc.name)
		require.Equal(t, tc.dev, fi.Sys().(*pb.Attr).GetRdev(), tc.name)
		require.ErrorIs(t, c.Mknod(p, tc.mode, tc.dev), fs.ErrExist)
		if tc.name != "reg" {
			_, err = c.Open(p)
			require.ErrorIs(t, err, syscall.ENXIO, tc.name)
		}
	}
	require.ErrorIs(t, c.Mknod("/d", fs.ModeDir|0o755, 0), syscall.EINVAL)
}
