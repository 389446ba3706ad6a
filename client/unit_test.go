package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

func TestSeqTrackerAck(t *testing.T) {
	s := newSeqTracker()
	s1, a1 := s.begin()
	s2, a2 := s.begin()
	s3, a3 := s.begin()
	require.Equal(t, []uint64{1, 2, 3}, []uint64{s1, s2, s3})
	require.Equal(t, []uint64{1, 1, 1}, []uint64{a1, a2, a3})
	s.end(s2)
	_, a := s.begin() // 4; 1 still in flight
	require.Equal(t, uint64(1), a)
	s.end(s1)
	_, a = s.begin() // 5; lowest in flight is 3
	require.Equal(t, uint64(3), a)
	s.end(s3)
	s.end(4)
	s.end(5)
	seq, a := s.begin()
	require.Equal(t, uint64(6), seq)
	require.Equal(t, uint64(6), a, "with nothing in flight ack is the command's own seq")
}

func TestJitterBounds(t *testing.T) {
	for n := 1; n < 40; n++ {
		d := jitter(n)
		require.Positive(t, d)
		require.LessOrEqual(t, d, retryMax)
	}
	require.Less(t, jitter(1), 3*retryBase)
}

func TestUnixPath(t *testing.T) {
	for in, want := range map[string]string{
		"unix:///tmp/s": "/tmp/s", "unix:/tmp/s": "/tmp/s", "unix:rel/s": "rel/s",
	} {
		got, ok := unixPath(in)
		require.True(t, ok, in)
		require.Equal(t, want, got, in)
	}
	_, ok := unixPath("127.0.0.1:80")
	require.False(t, ok)
}

func TestErrnoMapping(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	err := c.Remove("/missing")
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorIs(t, err, syscall.ENOENT)
	var pe *fs.PathError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "remove", pe.Op)
	require.Equal(t, "/missing", pe.Path)
	require.Equal(t, "remove /missing: no such file or directory", err.Error())
	require.Equal(t, syscall.ENOENT, Errno(err))

	require.NoError(t, c.Mkdir("/d", 0o755))
	err = c.Mkdir("/d", 0o755)
	require.ErrorIs(t, err, fs.ErrExist)

	for errno, target := range map[syscall.Errno]error{
		syscall.EACCES: fs.ErrPermission, syscall.EPERM: fs.ErrPermission,
		syscall.EEXIST: fs.ErrExist, syscall.ENOTEMPTY: fs.ErrExist, syscall.ENOENT: fs.ErrNotExist,
	} {
		err := pathErr("op", "/p", errnoErr(&pb.Result{Errno: uint32(errno)}))
		require.ErrorIs(t, err, target, errno.Error())
		require.Equal(t, errno, Errno(err))
	}
	require.Equal(t, syscall.EINTR, Errno(context.Canceled))
	require.Equal(t, syscall.EIO, Errno(context.DeadlineExceeded))
	require.Equal(t, syscall.EIO, Errno(errors.New("x")))
	require.Equal(t, syscall.Errno(0), Errno(nil))
}

func TestErrnoTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"nil", nil, 0},
		{"bare errno", syscall.ENOTEMPTY, syscall.ENOTEMPTY},
		{"path error", &fs.PathError{Op: "rmdir", Path: "/d", Err: syscall.ENOTEMPTY}, syscall.ENOTEMPTY},
		{"wrapped twice", fmt.Errorf("rename: %w", &os.LinkError{Op: "rename", Err: syscall.EXDEV}), syscall.EXDEV},
		{"zero errno is not success", syscall.Errno(0), syscall.EIO},
		{"deadline: cluster unreachable", fmt.Errorf("memfs: cluster unavailable: %w", context.DeadlineExceeded), syscall.EIO},
		{"interrupted by the kernel", context.Canceled, syscall.EINTR},
		{"fs sentinel", fs.ErrNotExist, syscall.ENOENT},
		{"fs exist", fs.ErrExist, syscall.EEXIST},
		{"fs permission", fs.ErrPermission, syscall.EACCES},
		{"fs closed", fs.ErrClosed, syscall.EBADF},
		{"anything else", errors.New("boom"), syscall.EIO},
		// An errno beats the context error it travels with.
		{"errno and deadline", errors.Join(context.DeadlineExceeded, syscall.ENOSPC), syscall.ENOSPC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Errno(tc.err))
		})
	}
}

func TestRetrySameSeqAppliesOnce(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	// The first attempt is applied but its reply is lost; the retry must
	// carry the same seq and get the recorded result.
	var lost atomic.Bool
	fc.onAfter(func(_ int, cmd *pb.Command) error {
		if cmd.GetWrite() != nil && lost.CompareAndSwap(false, true) {
			return status.Error(codes.Unavailable, "reply lost")
		}
		return nil
	})
	_, err := c.Do(t.Context(), &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
		Loc: &pb.Loc{Path: "/f"}, Append: true, Data: []byte("once"),
	}}})
	require.NoError(t, err)
	fc.mu.Lock()
	defer fc.mu.Unlock()
	require.Equal(t, []byte("once"), fc.files["/f"])
	writes := 0
	for _, cmd := range fc.applied {
		if cmd.GetWrite().GetLoc().GetPath() == "/f" {
			writes++
		}
	}
	require.Equal(t, 1, writes)
}

func TestFollowsLeaderHint(t *testing.T) {
	fc := newFakeCluster(t, 3)
	fc.setLeader(2)
	// Only a follower's address: the client learns the rest from it.
	c, err := New(t.Context(), fc.addrs()[:1])
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Mkdir("/a", 0o755))
	require.ElementsMatch(t, fc.addrs(), c.Addrs())

	// Leadership moves: the old leader answers UNAVAILABLE with a hint.
	fc.setLeader(1)
	require.NoError(t, c.Mkdir("/b", 0o755))
	require.Equal(t, fc.addrs()[1], c.k.t.pick())
}

func TestForwarderStaysWhileNamedLeaderIsUnreachable(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := lis.Addr().String()
	require.NoError(t, lis.Close())
	// A node that forwarded names a leader the client cannot connect to:
	// the client keeps sending to the node that answered, before its
	// attempt to connect and after the attempt failed.
	c.k.t.served(fc.addrs()[0], []string{gone})
	require.Equal(t, fc.addrs()[0], c.k.t.pick())
	c.k.t.mu.Lock()
	cc := c.k.t.conns[gone]
	c.k.t.mu.Unlock()
	require.Eventually(t, func() bool { return cc.GetState() == connectivity.TransientFailure },
		10*time.Second, 10*time.Millisecond)
	c.k.t.served(fc.addrs()[0], []string{gone})
	require.Equal(t, fc.addrs()[0], c.k.t.pick())
}

func TestRetriesUntilLeaderElected(t *testing.T) {
	fc := newFakeCluster(t, 2)
	c := fc.newClient(t)
	fc.setLeader(-1)
	// Elect a leader once the client has been refused a few times.
	fc.onApply(func(int, *pb.Command) error {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		if fc.attempts > 5 {
			fc.leader = 1
		}
		return nil
	})
	require.NoError(t, c.Mkdir("/x", 0o755))
}

func TestDeadlineEndsRetries(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	fc.setLeader(-1)
	t.Cleanup(func() { fc.setLeader(0) }) // so that Close finds a leader
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Do(ctx, &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/x"}}}})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, syscall.EIO, Errno(err))
}

func TestNotRetried(t *testing.T) {
	for _, code := range []codes.Code{codes.FailedPrecondition, codes.InvalidArgument} {
		t.Run(code.String(), func(t *testing.T) {
			fc := newFakeCluster(t, 1)
			c := fc.newClient(t)
			fc.mu.Lock()
			before := fc.attempts
			fc.applyHook = func(int, *pb.Command) error { return status.Error(code, "no") }
			fc.mu.Unlock()
			err := c.Mkdir("/x", 0o755)
			require.Equal(t, code, status.Code(err), "%v", err)
			fc.mu.Lock()
			defer fc.mu.Unlock()
			require.Equal(t, before+1, fc.attempts)
		})
	}
}

func TestAttemptTimeoutRetries(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t, WithAttemptTimeout(50*time.Millisecond))
	var hung atomic.Bool
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	fc.onApply(func(_ int, cmd *pb.Command) error {
		if cmd.GetMkdir() != nil && hung.CompareAndSwap(false, true) {
			<-never // a node that hangs
		}
		return nil
	})
	require.NoError(t, c.Mkdir("/slow", 0o755))
	require.True(t, hung.Load())
}

func TestAckCoversInFlight(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	release := make(chan struct{})
	var blocked atomic.Bool
	var slow atomic.Uint64
	fc.onApply(func(_ int, cmd *pb.Command) error {
		if cmd.GetMkdir().GetLoc().GetPath() == "/slow" && blocked.CompareAndSwap(false, true) {
			slow.Store(cmd.Seq)
			<-release
		}
		return nil
	})
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, c.Mkdir("/slow", 0o755)) })
	require.Eventually(t, blocked.Load, 5*time.Second, time.Millisecond)
	slowSeq := slow.Load()
	for i := range 5 {
		require.NoError(t, c.Mkdir("/fast"+string(rune('a'+i)), 0o755))
	}
	close(release)
	wg.Wait()
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for _, cmd := range fc.applied {
		if cmd.GetMkdir() != nil && cmd.GetMkdir().GetLoc().GetPath() != "/slow" {
			require.LessOrEqual(t, cmd.Ack, slowSeq, "ack passed a command still in flight")
		}
	}
}

func TestSessionExpiry(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	h, _, err := c.OpenLoc(t.Context(), &pb.Loc{Path: "/f"}, linuxRDWR|linuxCREAT, 0o644, 0, 0, false, false)
	require.NoError(t, err)
	old := c.Session()

	// The cluster forgets the session (its lease ran out).
	fc.mu.Lock()
	delete(fc.sessions, old)
	fc.mu.Unlock()

	// A path command is re-run in a new session.
	require.NoError(t, c.Mkdir("/after", 0o755))
	require.NotEqual(t, old, c.Session())

	// The handle of the old session is gone.
	_, _, err = c.WriteHandle(t.Context(), h, 0, []byte("x"))
	require.ErrorIs(t, err, syscall.ESTALE)
	_, err = c.ReadHandle(t.Context(), h, 0, make([]byte, 1))
	require.ErrorIs(t, err, syscall.ESTALE)
	require.Error(t, c.CloseHandle(t.Context(), h))
	_, _, err = c.WriteHandle(t.Context(), h, 0, []byte("x"))
	require.ErrorIs(t, err, syscall.EBADF, "a closed handle is unknown")
}

func TestSessionExpiryAfterAmbiguousAttempt(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	old := c.Session()
	// The first attempt is lost in a way that may have applied it; by the
	// retry, the session has expired. Re-running it in a new session could
	// apply it twice, so the client must report ESTALE instead.
	var once atomic.Bool
	fc.onApply(func(_ int, cmd *pb.Command) error {
		if cmd.GetMkdir() != nil && once.CompareAndSwap(false, true) {
			fc.mu.Lock()
			delete(fc.sessions, old)
			fc.mu.Unlock()
			return status.Error(codes.Unavailable, "lost")
		}
		return nil
	})
	err := c.Mkdir("/x", 0o755)
	require.ErrorIs(t, err, syscall.ESTALE)
	require.NotEqual(t, old, c.Session(), "a new session is opened for later commands")
	require.NoError(t, c.Mkdir("/y", 0o755))
}

func TestStreamedWriteAndRead(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), (5*pb.MaxMessageData+12345)/16)
	n, _, err := c.k.write(t.Context(), &pb.WriteCmd{Loc: &pb.Loc{Path: "/big"}}, data, 0)
	require.NoError(t, err)
	require.Equal(t, len(data), n)
	fc.mu.Lock()
	require.Equal(t, data, fc.files["/big"])
	fc.mu.Unlock()

	// The fake caps one stream at 3 MiB and breaks the first one after its
	// first frame: the client resumes where it stopped.
	fc.onRead(func(attempt int) bool { return attempt == 1 })
	got, err := c.ReadFile("/big")
	require.NoError(t, err)
	require.Equal(t, data, got)

	buf := make([]byte, len(data)+10)
	n, err = c.k.read(t.Context(), &pb.ReadQuery{Loc: &pb.Loc{Path: "/big"}}, buf)
	require.NoError(t, err)
	require.Equal(t, len(data), n)
}

func TestFileAppendOffsets(t *testing.T) {
	fc := newFakeCluster(t, 1)
	c := fc.newClient(t)
	f, err := c.OpenFile("/f", os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	require.NoError(t, err)
	_, err = f.Write([]byte("abc"))
	require.NoError(t, err)
	_, err = f.Write([]byte("de"))
	require.NoError(t, err)
	off, err := f.Seek(0, 1)
	require.NoError(t, err)
	require.Equal(t, int64(5), off)
	_, err = f.WriteAt([]byte("x"), 0)
	require.Error(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
	require.ErrorIs(t, f.Close(), fs.ErrClosed)
	_, err = f.Write([]byte("x"))
	require.ErrorIs(t, err, fs.ErrClosed)
	fc.mu.Lock()
	defer fc.mu.Unlock()
	require.Equal(t, []byte("abcde"), fc.files["handle"])
	for _, cmd := range fc.applied {
		if w := cmd.GetWrite(); w != nil {
			require.True(t, w.Append, "O_APPEND writes ask the node to append")
		}
	}
}

func TestLinuxFlags(t *testing.T) {
	require.Equal(t, uint32(0), linuxFlags(os.O_RDONLY))
	require.Equal(t, uint32(0x1|0x40|0x200), linuxFlags(os.O_WRONLY|os.O_CREATE|os.O_TRUNC))
	require.Equal(t, uint32(0x2|0x80|0x400), linuxFlags(os.O_RDWR|os.O_EXCL|os.O_APPEND|Exclusive))
}

func TestFileMode(t *testing.T) {
	require.Equal(t, fs.ModeDir|0o755, FileMode(sIFDIR|0o755))
	require.Equal(t, fs.ModeSymlink|0o777, FileMode(sIFLNK|0o777))
	require.Equal(t, fs.FileMode(0o644)|fs.ModeSetuid|fs.ModeSticky, FileMode(sIFREG|0o644|sISUID|sISVTX))
	require.Equal(t, uint32(0o644|sISGID), modeBits(0o644|fs.ModeSetgid))
}
