package fuse

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
)

// testOpTimeout bounds each mount operation in tests: a cluster that
// stops answering shows up as EIO well before the test's own limits.
const testOpTimeout = 20 * time.Second

// startCluster starts an in-process cluster of n nodes.
func startCluster(t *testing.T, n int) *servertest.Cluster {
	t.Helper()
	requireFUSE(t)
	return servertest.StartCluster(t, n)
}

// newClient connects a client to addrs, closed at cleanup.
func newClient(t *testing.T, addrs []string, opts ...client.Option) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, addrs, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testBinding is the FUSE binding the tests mount with unless a test
// names one: MEMFS_FUSE_BINDING (scripts/test.sh runs the package once
// per binding), the default (go-fuse) when unset.
var testBinding = os.Getenv("MEMFS_FUSE_BINDING")

// testCaps says whether test mounts hold capabilities, as `memfs mount`
// does by default: MEMFS_FUSE_CAPS=off mounts without.
var testCaps = os.Getenv("MEMFS_FUSE_CAPS") != "off"

// testSync says whether test mounts commit every change before answering
// it (Options.Sync), as `memfs mount --sync`: MEMFS_FUSE_SYNC=on
// (scripts/test.sh runs the package so too).
var testSync = os.Getenv("MEMFS_FUSE_SYNC") == "on"

// mountOn mounts the cluster reachable at addrs on a new directory with its
// own client (made with copts), and unmounts it at cleanup (tearing the
// connection down by force if a hung request keeps it busy).
func mountOn(t *testing.T, addrs []string, opt Options, copts ...client.Option) *MountPoint {
	t.Helper()
	if testCaps {
		copts = append(copts, client.WithCaps())
	}
	c := newClient(t, addrs, copts...)
	if opt.OpTimeout == 0 {
		opt.OpTimeout = testOpTimeout
	}
	if opt.Binding == "" {
		opt.Binding = testBinding
	}
	opt.Sync = opt.Sync || testSync
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Mount(ctx, c, t.TempDir(), opt)
	require.NoError(t, err)
	dev := mountDev(t, m.Dir())
	pollProbe(t, m.Dir())
	t.Cleanup(func() {
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Unmount(uctx); err != nil {
			t.Logf("unmount %s: %v; aborting the connection", m.Dir(), err)
			abortConnection(dev)
			_ = exec.Command(Fusermount, "-uz", m.Dir()).Run()
		}
	})
	return m
}

// pollProbe makes the kernel learn, before the test opens any file with
// package os, that the mount does not support poll. os registers every
// file it opens with epoll; for a FUSE file that is a POLL request, sent
// from a runtime-internal system call that a garbage collection cannot
// wait out, and the server in this same process could not answer it
// during the collection: the test would deadlock. Asked here through an
// ordinary system call (epoll_ctl through syscall.Syscall6), the server
// answers ENOSYS and the kernel never asks again.
func pollProbe(t *testing.T, dir string) {
	t.Helper()
	pollProbeAt(t, filepath.Join(dir, ".poll-probe"), true)
}

// pollProbeAt probes with the file at p: created (read-write) and removed
// after, or, for a mount that may not change anything, an existing file
// opened read-only.
func pollProbeAt(t *testing.T, p string, create bool) {
	t.Helper()
	flags := syscall.O_RDONLY | syscall.O_CLOEXEC
	if create {
		flags = syscall.O_RDWR | syscall.O_CREAT | syscall.O_CLOEXEC
	}
	within(t, 20*time.Second, "poll probe", func() error {
		fd, err := syscall.Open(p, flags, 0o600)
		for err == syscall.EINTR {
			// The mount does not answer interrupted requests with EINTR
			// (bazilfs.uninterrupted); retried anyway, as package os
			// does, so a probe never fails a test on a signal.
			fd, err = syscall.Open(p, flags, 0o600)
		}
		if err != nil {
			return err
		}
		if create {
			defer syscall.Unlink(p)
		}
		defer syscall.Close(fd)
		ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return err
		}
		defer syscall.Close(ep)
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
		// Not syscall.EpollCtl: that is a raw system call, which keeps
		// its P, and a garbage collection then waits for it while the
		// server that must answer the POLL request waits for the
		// collection (a test hung 8 minutes in gcMarkDone).
		_, _, _ = syscall.Syscall6(syscall.SYS_EPOLL_CTL, uintptr(ep), syscall.EPOLL_CTL_ADD, uintptr(fd), uintptr(unsafe.Pointer(&ev)), 0, 0)
		return nil
	})
}

// mountDev is the device number of the mount, which names its connection
// under /sys/fs/fuse/connections.
func mountDev(t *testing.T, dir string) uint64 {
	t.Helper()
	var dev uint64
	within(t, 10*time.Second, "stat mount root", func() error {
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil {
			return err
		}
		dev = st.Dev
		return nil
	})
	return dev
}

// abortConnection ends a FUSE connection from the kernel side, failing
// every request still waiting on it: the last resort against a hung mount.
func abortConnection(dev uint64) {
	if ents, _ := os.ReadDir("/sys/fs/fuse/connections"); len(ents) == 0 {
		_ = exec.Command("mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections").Run()
	}
	minor := (dev & 0xff) | ((dev >> 12) & 0xfff00)
	_ = os.WriteFile(filepath.Join("/sys/fs/fuse/connections", fmt.Sprint(minor), "abort"), []byte("1"), 0o200)
}

// within runs f (system calls on the mount) and fails the test if it does
// not return within d: a hung mount fails the test instead of hanging it.
// The goroutine is left blocked until cleanup tears the mount down.
func within(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v (hung mount?)", what, d)
	}
}

// run runs a program with a time limit and returns its combined output.
func run(t testing.TB, dir string, limit time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	// The shell changes into dir after exec: a chdir onto the mount
	// between fork and exec (cmd.Dir) happens while Go's ForkExec waits
	// with syscall.ForkLock held, and one CI run hung there.
	cmd := exec.CommandContext(ctx, "sh", append([]string{"-c", `cd "$RUN_DIR" && exec "$@"`, "sh", name}, args...)...)
	cmd.Env = append(os.Environ(), "RUN_DIR="+dir, "LC_ALL=C", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v in %s:\n%s", name, args, dir, out)
	return string(out)
}

// poll calls cond until it is true or d passes, and reports how long that
// took.
func poll(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not true within %v", what, d)
		}
		<-tick.C
	}
	return time.Since(start)
}

// removeCmd is the unlink of name in directory parent, as a client
// command.
func removeCmd(parent uint64, name string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{
		Loc: &pb.Loc{Parent: parent, Name: name, Nofollow: true}, FileOnly: true,
	}}}
}
