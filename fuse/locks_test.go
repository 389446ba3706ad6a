package fuse

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memoryfs/memfs/client"
)

// twoMounts mounts a new 3-node cluster twice, through two nodes, as two
// hosts would.
func twoMounts(t *testing.T) (*MountPoint, *MountPoint) {
	t.Helper()
	addrs := startCluster(t, 3).APIAddrs()
	return mountOn(t, addrs[:1], Options{}), mountOn(t, addrs[1:2], Options{})
}

func flockT(typ int16, start, length int64) *syscall.Flock_t {
	return &syscall.Flock_t{Type: typ, Whence: 0, Start: start, Len: length}
}

func openRW(t *testing.T, p string) *os.File {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// waitsThenGranted checks that the lock call behind done still waits,
// runs release, and checks that the call then returns without error.
func waitsThenGranted(t *testing.T, done <-chan error, release func()) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("the lock was granted while held elsewhere (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not granted the lock once it was released")
	}
}

func async(f func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

// TestLocksAcrossMounts: POSIX record locks and flock locks taken through
// one mount exclude those of another (a mount on another node, as on
// another host); close releases them as POSIX and flock say, and wakes a
// waiter on the other mount.
func TestLocksAcrossMounts(t *testing.T) {
	a, b := twoMounts(t)
	pa, pb := filepath.Join(a.Dir(), "f"), filepath.Join(b.Dir(), "f")
	require.NoError(t, os.WriteFile(pa, []byte("data"), 0o644))
	fa, fb := openRW(t, pa), openRW(t, pb)

	require.NoError(t, syscall.FcntlFlock(fa.Fd(), syscall.F_SETLK, flockT(syscall.F_WRLCK, 0, 10)))
	require.ErrorIs(t, syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, flockT(syscall.F_RDLCK, 5, 1)), syscall.EAGAIN)
	got := flockT(syscall.F_WRLCK, 0, 0)
	require.NoError(t, syscall.FcntlFlock(fb.Fd(), syscall.F_GETLK, got))
	require.Equal(t, int16(syscall.F_WRLCK), got.Type)
	require.Equal(t, [2]int64{0, 10}, [2]int64{got.Start, got.Len})
	// Another range is free; a lock to the end of file takes the rest.
	require.NoError(t, syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, flockT(syscall.F_WRLCK, 10, 0)))
	require.ErrorIs(t, syscall.FcntlFlock(fa.Fd(), syscall.F_SETLK, flockT(syscall.F_RDLCK, 1<<40, 1)), syscall.EAGAIN)
	require.NoError(t, syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, flockT(syscall.F_UNLCK, 10, 0)))

	// POSIX: closing any descriptor of the file releases the process's
	// locks on it, which grants the waiter on the other mount.
	done := async(func() error {
		return syscall.FcntlFlock(fb.Fd(), syscall.F_SETLKW, flockT(syscall.F_WRLCK, 0, 10))
	})
	waitsThenGranted(t, done, func() { require.NoError(t, fa.Close()) })
	require.NoError(t, syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, flockT(syscall.F_UNLCK, 0, 0)))

	// flock: shared with shared, exclusive against both, released by
	// the last close of the open file.
	fa2 := openRW(t, pa)
	require.NoError(t, syscall.Flock(int(fa2.Fd()), syscall.LOCK_SH|syscall.LOCK_NB))
	require.NoError(t, syscall.Flock(int(fb.Fd()), syscall.LOCK_SH|syscall.LOCK_NB))
	require.NoError(t, syscall.Flock(int(fb.Fd()), syscall.LOCK_UN))
	require.NoError(t, syscall.Flock(int(fa2.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	require.ErrorIs(t, syscall.Flock(int(fb.Fd()), syscall.LOCK_SH|syscall.LOCK_NB), syscall.EWOULDBLOCK)
	done = async(func() error { return syscall.Flock(int(fb.Fd()), syscall.LOCK_EX) })
	waitsThenGranted(t, done, func() { require.NoError(t, fa2.Close()) })
	// flock and POSIX locks do not see each other.
	fa3 := openRW(t, pa)
	require.NoError(t, syscall.FcntlFlock(fa3.Fd(), syscall.F_SETLK, flockT(syscall.F_WRLCK, 0, 0)))
}

// TestLockWaitInterrupted: a process waiting for a lock held on another
// mount takes a signal: flock -w sets an alarm and gives up.
func TestLockWaitInterrupted(t *testing.T) {
	requireProgram(t, "flock")
	a, b := twoMounts(t)
	require.NoError(t, os.WriteFile(filepath.Join(a.Dir(), "L"), nil, 0o644))
	fa := openRW(t, filepath.Join(a.Dir(), "L"))
	require.NoError(t, syscall.Flock(int(fa.Fd()), syscall.LOCK_EX))

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "flock", "-w", "1", filepath.Join(b.Dir(), "L"), "true").CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "flock -w 1 should time out: %s", out)
	require.Equal(t, 1, ee.ExitCode(), "%s", out)
	require.NoError(t, ctx.Err(), "the interrupted wait did not end")

	// The abandoned waiter is not granted later: once a lets go, the
	// lock is free for anyone.
	require.NoError(t, syscall.Flock(int(fa.Fd()), syscall.LOCK_UN))
	out, err = exec.CommandContext(ctx, "flock", "-n", filepath.Join(b.Dir(), "L"), "true").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// flock(1) on b has exited, but the kernel sends the RELEASE that
	// ends its lock after the close returned.
	poll(t, 30*time.Second, "a locks again", func() bool {
		return syscall.Flock(int(fa.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
	})
}

// TestFlockCounterAcrossMounts: flock(1) is a mutex between hosts around
// a read-modify-write of a counter file; no increment is lost.
func TestFlockCounterAcrossMounts(t *testing.T) {
	requireProgram(t, "flock")
	a, b := twoMounts(t)
	dirs := []string{a.Dir(), b.Dir()}
	require.NoError(t, os.WriteFile(filepath.Join(dirs[0], "C"), []byte("0\n"), 0o644))
	const rounds = 10
	// The shell changes into the mount after exec, never the forked
	// child before it (see run).
	script := `cd "$1" && for i in $(seq ` + strconv.Itoa(rounds) + `); do flock L sh -c 'n=$(cat C); echo $((n+1)) > C' || exit 1; done`
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(dirs))
	outs := make([][]byte, len(dirs))
	for i, d := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, "sh", "-c", script, "sh", d)
			cmd.WaitDelay = 5 * time.Second
			outs[i], errs[i] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for i := range dirs {
		require.NoError(t, errs[i], "%s", outs[i])
	}
	for _, d := range dirs {
		got, err := os.ReadFile(filepath.Join(d, "C"))
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(rounds*len(dirs)), strings.TrimSpace(string(got)))
	}
}

// TestSQLiteAcrossMounts: two sqlite3 processes on two mounts update one
// database with BEGIN IMMEDIATE transactions; sqlite's POSIX locks keep
// them apart, and no row is lost.
func TestSQLiteAcrossMounts(t *testing.T) {
	requireProgram(t, "sqlite3")
	a, b := twoMounts(t)
	dirs := []string{a.Dir(), b.Dir()}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	sqlite := func(dir, sql string) (string, error) {
		cmd := exec.CommandContext(ctx, "sqlite3", filepath.Join(dir, "db"))
		cmd.Stdin = strings.NewReader(".timeout 60000\n" + sql)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	out, err := sqlite(dirs[0], "CREATE TABLE t(who TEXT, n INTEGER, pad BLOB);\n")
	require.NoError(t, err, out)
	const rows = 15
	var wg sync.WaitGroup
	errs := make([]error, len(dirs))
	outs := make([]string, len(dirs))
	for i, d := range dirs {
		var sql strings.Builder
		for n := range rows {
			sql.WriteString("BEGIN IMMEDIATE;\n")
			// Rows of 3 KiB grow the file at every commit, so a
			// mount that kept a stale size or stale pages would read
			// a database cut short or old.
			sql.WriteString("INSERT INTO t VALUES('" + strconv.Itoa(i) + "', (SELECT count(*) FROM t), randomblob(3000));\n")
			sql.WriteString("COMMIT;\n")
			_ = n
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = sqlite(d, sql.String())
		}()
	}
	wg.Wait()
	for i := range dirs {
		require.NoError(t, errs[i], outs[i])
		require.Empty(t, outs[i])
	}
	for _, d := range dirs {
		// Each insert counted the rows before it under the write lock,
		// so the counts are 0..N-1, each once, if no update was lost.
		out, err := sqlite(d, "SELECT count(*), count(DISTINCT n), max(n) FROM t;\nPRAGMA integrity_check;\n")
		require.NoError(t, err, out)
		require.Equal(t, strconv.Itoa(2*rows)+"|"+strconv.Itoa(2*rows)+"|"+strconv.Itoa(2*rows-1)+"\nok", out)
	}
}

// TestLockHolderCutOff: the locks of a mount cut off from the cluster
// (its host died) go when its session's lease ends, and a process
// waiting on another mount gets them.
func TestLockHolderCutOff(t *testing.T) {
	cl := startCluster(t, 3)
	addrs := cl.APIAddrs()
	g := &cutDialer{}
	a := mountOn(t, addrs[:1], Options{OpTimeout: 2 * time.Second},
		client.WithLease(2*time.Second), client.WithDialer(g.dial), client.WithRetryTimeout(time.Second))
	b := mountOn(t, addrs[1:2], Options{})
	pa, pb := filepath.Join(a.Dir(), "f"), filepath.Join(b.Dir(), "f")
	require.NoError(t, os.WriteFile(pa, []byte("data"), 0o644))
	fa, fb := openRW(t, pa), openRW(t, pb)
	require.NoError(t, syscall.Flock(int(fa.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	require.NoError(t, syscall.FcntlFlock(fa.Fd(), syscall.F_SETLK, flockT(syscall.F_WRLCK, 0, 0)))
	fb2 := openRW(t, pb)

	flocked := async(func() error { return syscall.Flock(int(fb.Fd()), syscall.LOCK_EX) })
	posix := async(func() error {
		return syscall.FcntlFlock(fb2.Fd(), syscall.F_SETLKW, flockT(syscall.F_WRLCK, 0, 0))
	})
	waitsThenGranted(t, flocked, g.cut)
	select {
	case err := <-posix:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the POSIX waiter was not granted the lock after the holder's lease")
	}
}

// cutDialer dials normally until cut, then refuses and closes what it
// dialed: a host gone from the network.
type cutDialer struct {
	mu    sync.Mutex
	off   bool
	conns []net.Conn
}

func (d *cutDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.off {
		return nil, syscall.ECONNREFUSED
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cutDialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.off {
		return
	}
	d.off = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

func requireProgram(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed", name)
	}
}

// TestOFDLocksAcrossMounts: open file description locks (F_OFD_SETLK)
// belong to the open file: closing another descriptor of the same file
// keeps them, and the last close of their own ends them.
func TestOFDLocksAcrossMounts(t *testing.T) {
	a, b := twoMounts(t)
	pa, pb := filepath.Join(a.Dir(), "f"), filepath.Join(b.Dir(), "f")
	require.NoError(t, os.WriteFile(pa, []byte("data"), 0o644))
	fa, other, fb := openRW(t, pa), openRW(t, pa), openRW(t, pb)
	ofd := &unix.Flock_t{Type: unix.F_WRLCK}
	require.NoError(t, unix.FcntlFlock(fa.Fd(), unix.F_OFD_SETLK, ofd))
	require.NoError(t, other.Close())
	require.ErrorIs(t, syscall.FcntlFlock(fb.Fd(), syscall.F_SETLK, flockT(syscall.F_RDLCK, 0, 1)), syscall.EAGAIN)
	done := async(func() error {
		return syscall.FcntlFlock(fb.Fd(), syscall.F_SETLKW, flockT(syscall.F_WRLCK, 0, 0))
	})
	waitsThenGranted(t, done, func() { require.NoError(t, fa.Close()) })
}
