package fuse

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fuse/posixtest"
)

// TestPOSIXAgainstTmpfs runs the POSIX behaviour suite on a mount and on
// tmpfs and compares every result and errno.
func TestPOSIXAgainstTmpfs(t *testing.T) {
	cl := startCluster(t, 3)
	m := mountOn(t, cl.APIAddrs(), Options{})
	var names []string
	if testBinding == "bazil" {
		// bazil.org/fuse answers FUSE_LSEEK with ENOSYS, after which the
		// kernel reports the whole file as data (TestBazilSeeksWithoutHoles).
		names = posixtest.CaseNames(posixtest.LseekCases...)
	}
	posixtest.Compare(t, m.Dir(), posixtest.RefDir(t), 2*time.Minute, names...)
}

// TestMountReportsItself checks the mount table entry and statfs.
func TestMountReportsItself(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	info, ok, err := MountedAt(m.Dir())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "fuse.memfs", info.FSType)
	require.Equal(t, "memfs", info.Source)
	within(t, 10*time.Second, "statfs", func() error {
		var st syscall.Statfs_t
		if err := syscall.Statfs(m.Dir(), &st); err != nil {
			return err
		}
		if st.Bsize == 0 || st.Blocks == 0 || st.Namelen != 255 {
			return fmt.Errorf("statfs: %+v", st)
		}
		return nil
	})
	// A second mount on the same directory is refused while this one
	// lives.
	c := newClient(t, cl.APIAddrs())
	_, err = Mount(context.Background(), c, m.Dir(), Options{})
	require.ErrorIs(t, err, ErrAlreadyMounted)
}

// sourceTar makes a tar of this repository's sources (the tree the tests
// run in) and returns its path.
func sourceTar(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	tarball := filepath.Join(t.TempDir(), "src.tar")
	run(t, root, 2*time.Minute, "tar", "-cf", tarball, "--exclude=./.git", "--exclude=./bin", "--exclude=*.test", ".")
	return tarball
}

// TestPrograms runs real programs on the mount and checks their results
// against the same work done on tmpfs.
func TestPrograms(t *testing.T) {
	cl := startCluster(t, 3)
	m := mountOn(t, cl.APIAddrs(), Options{})
	ref := posixtest.RefDir(t)
	const limit = 3 * time.Minute

	t.Run("git", func(t *testing.T) {
		dir := filepath.Join(m.Dir(), "repo")
		require.NoError(t, os.Mkdir(dir, 0o755))
		run(t, dir, limit, "git", "init", "-q", ".")
		for i := range 20 {
			require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d.txt", i)), bytes.Repeat([]byte{byte('a' + i)}, 1000*i), 0o644))
		}
		run(t, dir, limit, "git", "add", ".")
		run(t, dir, limit, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "first")
		require.NoError(t, os.WriteFile(filepath.Join(dir, "f01.txt"), []byte("changed\n"), 0o644))
		run(t, dir, limit, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "second")
		log := run(t, dir, limit, "git", "log", "--format=%s")
		require.Equal(t, "second\nfirst\n", log)
		require.Empty(t, run(t, dir, limit, "git", "status", "--porcelain"))
		run(t, dir, limit, "git", "fsck", "--strict")
		run(t, dir, limit, "git", "gc", "-q")
		require.Equal(t, "second\nfirst\n", run(t, dir, limit, "git", "log", "--format=%s"))
	})

	tarball := sourceTar(t)
	t.Run("tar", func(t *testing.T) {
		for _, d := range []string{filepath.Join(ref, "src"), filepath.Join(m.Dir(), "src")} {
			require.NoError(t, os.Mkdir(d, 0o755))
			run(t, d, limit, "tar", "-xpf", tarball)
		}
		run(t, "/", limit, "diff", "-r", "--no-dereference", filepath.Join(ref, "src"), filepath.Join(m.Dir(), "src"))
		// The modes and mtimes tar set through descriptors (held by the
		// mount until close, see fsops/attrbehind.go) reached the cluster:
		// another client sees what tmpfs has.
		c := newClient(t, cl.APIAddrs())
		n := 0
		require.NoError(t, filepath.WalkDir(filepath.Join(ref, "src"), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			want, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(ref, p)
			got, err := c.Lstat("/" + rel)
			if err != nil {
				return err
			}
			require.Equal(t, want.Mode(), got.Mode(), rel)
			require.True(t, want.ModTime().Equal(got.ModTime()), "%s: mtime %v, want %v", rel, got.ModTime(), want.ModTime())
			n++
			return nil
		}))
		require.Positive(t, n)
		// Re-reading through tar gives the same archive listing.
		a := run(t, filepath.Join(ref, "src"), limit, "sh", "-c", "tar -cf - . | tar -tvf - | sort")
		b := run(t, filepath.Join(m.Dir(), "src"), limit, "sh", "-c", "tar -cf - . | tar -tvf - | sort")
		require.Equal(t, stripTarDates(a), stripTarDates(b))
	})

	t.Run("cp", func(t *testing.T) {
		run(t, m.Dir(), limit, "cp", "-a", "src", "copy")
		run(t, "/", limit, "diff", "-r", "--no-dereference", filepath.Join(ref, "src"), filepath.Join(m.Dir(), "copy"))
		a := run(t, filepath.Join(m.Dir(), "src"), limit, "sh", "-c", "find . -printf '%p %M %s %U %G %T@\\n' | sort")
		b := run(t, filepath.Join(m.Dir(), "copy"), limit, "sh", "-c", "find . -printf '%p %M %s %U %G %T@\\n' | sort")
		require.Equal(t, a, b, "cp -a keeps modes, sizes, owners and mtimes")
	})

	t.Run("find", func(t *testing.T) {
		q := "find . -name '*.go' -type f | sort; find . -type d | sort; find . -type f -size +8k | sort"
		require.Equal(t,
			run(t, filepath.Join(ref, "src"), limit, "sh", "-c", q),
			run(t, filepath.Join(m.Dir(), "src"), limit, "sh", "-c", q))
	})

	t.Run("du", func(t *testing.T) {
		q := "find . -type f -exec du --apparent-size -b {} + | sort -k2"
		require.Equal(t,
			run(t, filepath.Join(ref, "src"), limit, "sh", "-c", q),
			run(t, filepath.Join(m.Dir(), "src"), limit, "sh", "-c", q))
		out := run(t, m.Dir(), limit, "du", "-sk", "src")
		var kib int
		_, err := fmt.Sscanf(out, "%d", &kib)
		require.NoError(t, err)
		require.Positive(t, kib)
	})

	t.Run("sqlite3", func(t *testing.T) {
		if _, err := exec.LookPath("sqlite3"); err != nil {
			t.Skip("sqlite3 is not installed")
		}
		for _, mode := range []string{"delete", "wal"} {
			db := filepath.Join(m.Dir(), "db-"+mode+".sqlite")
			sql := fmt.Sprintf(`PRAGMA journal_mode=%s;
CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
BEGIN;
WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM n WHERE x < 5000)
INSERT INTO t(v) SELECT printf('row %%d %%s', x, hex(randomblob(20))) FROM n;
COMMIT;
BEGIN; DELETE FROM t WHERE id %% 2 = 0; ROLLBACK;
BEGIN; UPDATE t SET v = 'x' WHERE id <= 10; COMMIT;
SELECT count(*), sum(id), sum(v = 'x') FROM t;
PRAGMA integrity_check;`, mode)
			out := run(t, m.Dir(), limit, "sqlite3", db, sql)
			require.Equal(t, mode+"\n5000|12502500|10\nok\n", out)
		}
	})
}

// stripTarDates drops the date and time columns of `tar -tv` output: the
// directories' mtimes change as the tree is read back. It also drops the
// sticky bit, which bazil.org/fuse never reports to the kernel (see
// package bazilfs).
func stripTarDates(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if len(l) > 9 && (l[9] == 't' || l[9] == 'T') {
			l = l[:9] + map[byte]string{'t': "x", 'T': "-"}[l[9]] + l[10:]
		}
		f := strings.Fields(l)
		if len(f) >= 6 {
			f = append(f[:3], f[5:]...)
		}
		if strings.HasPrefix(l, "d") {
			f[2] = "" // directory sizes are file system specific
		}
		out = append(out, strings.Join(f, " "))
	}
	slices.Sort(out)
	return out
}

// TestTwoMountsSeeEachOther mounts through two different nodes and checks
// that each sees the other's changes promptly, and that O_APPEND writes
// from both never overwrite each other.
func TestTwoMountsSeeEachOther(t *testing.T) {
	cl := startCluster(t, 3)
	addrs := cl.APIAddrs()
	a := mountOn(t, addrs[:1], Options{})
	b := mountOn(t, addrs[1:2], Options{})
	pa, pb := a.Dir(), b.Dir()

	require.NoError(t, os.WriteFile(filepath.Join(pa, "f"), []byte("from a"), 0o644))
	got, err := os.ReadFile(filepath.Join(pb, "f"))
	require.NoError(t, err)
	require.Equal(t, "from a", string(got))

	// Overwrite from b while a has the old content cached.
	require.NoError(t, os.WriteFile(filepath.Join(pb, "f"), []byte("from b"), 0o644))
	poll(t, 10*time.Second, "a sees b's write", func() bool {
		got, err := os.ReadFile(filepath.Join(pa, "f"))
		return err == nil && string(got) == "from b"
	})
	require.NoError(t, os.Mkdir(filepath.Join(pb, "d"), 0o755))
	poll(t, 10*time.Second, "a sees b's mkdir", func() bool {
		ents, err := os.ReadDir(pa)
		return err == nil && len(ents) == 2
	})
	require.NoError(t, os.Remove(filepath.Join(pa, "f")))
	poll(t, 10*time.Second, "b sees a's unlink", func() bool {
		_, err := os.Stat(filepath.Join(pb, "f"))
		return errors.Is(err, os.ErrNotExist)
	})

	// Concurrent appends from both mounts.
	const records, size = 300, 64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, w := range []struct {
		dir string
		tag byte
	}{{pa, 'A'}, {pb, 'B'}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.OpenFile(filepath.Join(w.dir, "log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			for i := range records {
				rec := fmt.Sprintf("%c%06d", w.tag, i)
				rec += strings.Repeat(".", size-len(rec)-1) + "\n"
				if _, err := f.WriteString(rec); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	data, err := os.ReadFile(filepath.Join(pa, "log"))
	require.NoError(t, err)
	require.Len(t, data, 2*records*size, "appends overwrote each other")
	next := map[byte]int{}
	for off := 0; off < len(data); off += size {
		rec := string(data[off : off+size])
		var i int
		_, err := fmt.Sscanf(rec[1:7], "%d", &i)
		require.NoError(t, err, "torn record %q", rec)
		require.Equal(t, next[rec[0]], i, "records of %c out of order", rec[0])
		next[rec[0]]++
	}
	require.Equal(t, map[byte]int{'A': records, 'B': records}, next)
}

// TestChangesPushedToKernel measures how soon a change made through the
// client library is seen through a mount whose kernel caches are kept for
// a whole minute: only the pushed invalidations can make it visible in
// time.
func TestChangesPushedToKernel(t *testing.T) {
	cl := startCluster(t, 3)
	m := mountOn(t, cl.APIAddrs(), Options{AttrTimeout: time.Minute})
	c := newClient(t, cl.APIAddrs())
	ctx := context.Background()
	path := filepath.Join(m.Dir(), "f")
	require.NoError(t, os.WriteFile(path, []byte("version 000"), 0o644))
	attr, err := c.Lookup(ctx, 1, "f")
	require.NoError(t, err)

	var delays []time.Duration
	for i := 1; i <= 20; i++ {
		// Read through the mount so the kernel holds pages and attributes.
		_, err := os.ReadFile(path)
		require.NoError(t, err)
		want := fmt.Sprintf("version %03d", i)
		_, _, err = c.WriteIno(ctx, attr.GetIno(), 0, []byte(want))
		require.NoError(t, err)
		delays = append(delays, poll(t, 10*time.Second, "data change seen", func() bool {
			got, err := os.ReadFile(path)
			return err == nil && string(got) == want
		}))
	}
	slices.Sort(delays)
	t.Logf("data change through the client seen on the mount after: median %v, max %v (n=%d)",
		delays[len(delays)/2], delays[len(delays)-1], len(delays))

	// A name removed elsewhere disappears although the kernel may cache
	// the entry for a minute.
	require.NoError(t, os.WriteFile(filepath.Join(m.Dir(), "gone"), nil, 0o644))
	_, err = os.Stat(filepath.Join(m.Dir(), "gone"))
	require.NoError(t, err)
	_, err = c.Do(ctx, removeCmd(1, "gone"))
	require.NoError(t, err)
	d := poll(t, 10*time.Second, "removal seen", func() bool {
		_, err := os.Stat(filepath.Join(m.Dir(), "gone"))
		return errors.Is(err, os.ErrNotExist)
	})
	t.Logf("unlink through the client seen on the mount after %v", d)

	// A name missing here, which a binding that can caches as missing
	// (gofusefs) for the minute, appears once created elsewhere.
	for range 2 {
		_, err = os.Stat(filepath.Join(m.Dir(), "later"))
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	require.NoError(t, c.WriteFile("/later", []byte("x"), 0o644))
	d = poll(t, 10*time.Second, "creation seen", func() bool {
		_, err := os.Stat(filepath.Join(m.Dir(), "later"))
		return err == nil
	})
	t.Logf("create through the client seen on the mount after %v", d)
}

// TestMountSurvivesLeaderKill keeps writing and reading files through the
// mount while the leader is killed: no error may reach the program.
func TestMountSurvivesLeaderKill(t *testing.T) {
	cl := startCluster(t, 3)
	m := mountOn(t, cl.APIAddrs(), Options{})
	stop := make(chan struct{})
	var written int
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				written = i
				done <- nil
				return
			default:
			}
			p := filepath.Join(m.Dir(), fmt.Sprintf("f%04d", i))
			want := posixtest.Data(uint64(i), 10000+i)
			if err := os.WriteFile(p, want, 0o644); err != nil {
				done <- fmt.Errorf("write %d: %w", i, err)
				return
			}
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, want) {
				done <- fmt.Errorf("read back %d: %v (len %d)", i, err, len(got))
				return
			}
		}
	}()
	countFiles := func() int {
		select {
		case err := <-done:
			require.NoError(t, err, "the writer stopped") // and nil: it must not stop by itself
			t.Fatal("the writer stopped")
		default:
		}
		ents, _ := os.ReadDir(m.Dir())
		return len(ents)
	}
	poll(t, 30*time.Second, "writes under way", func() bool { return countFiles() >= 20 })
	leader := cl.WaitLeader(10 * time.Second)
	cl.Kill(cl.Index(leader))
	cl.WaitLeader(30 * time.Second)
	before := countFiles()
	poll(t, 60*time.Second, "writes continue after the kill", func() bool { return countFiles() >= before+20 })
	close(stop)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(testOpTimeout + 10*time.Second):
		t.Fatal("writer hung")
	}
	for i := 0; i < written; i++ {
		got, err := os.ReadFile(filepath.Join(m.Dir(), fmt.Sprintf("f%04d", i)))
		require.NoError(t, err)
		require.Equal(t, posixtest.Data(uint64(i), 10000+i), got, "file %d", i)
	}
}

// TestClusterGoneFailsWithEIO stops every node: operations must fail with
// EIO after the operation timeout instead of hanging.
func TestClusterGoneFailsWithEIO(t *testing.T) {
	cl := startCluster(t, 3)
	const opTimeout = 3 * time.Second
	// Synchronous: a buffering mount answers from the state its capabilities
	// guarantee while they are trusted, with the cluster gone too, and
	// reports what it lost at fsync (fsops.TestBufferedLossReported).
	m := mountOn(t, cl.APIAddrs(), Options{OpTimeout: opTimeout, Sync: true})
	f, err := os.Create(filepath.Join(m.Dir(), "open"))
	require.NoError(t, err)
	defer f.Close()
	for i := range cl.Size() {
		cl.Kill(i)
	}
	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"stat", func() error { _, err := os.Stat(filepath.Join(m.Dir(), "never-seen")); return err }},
		// A write may be acknowledged before it is committed; fsync
		// reports the failure.
		{"write and fsync", func() error {
			if _, err := f.Write([]byte("x")); err != nil {
				return err
			}
			return f.Sync()
		}},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(m.Dir(), "d"), 0o755) }},
	} {
		start := time.Now()
		var opErr error
		within(t, opTimeout+20*time.Second, tc.name, func() error { opErr = tc.op(); return nil })
		require.ErrorIs(t, opErr, syscall.EIO, tc.name)
		require.GreaterOrEqual(t, time.Since(start), opTimeout/2, "%s failed before trying for long", tc.name)
	}
}

// TestPermissionsAsOtherUser checks, as an unprivileged user through an
// allow_other mount, that the kernel enforces modes (default_permissions)
// and that files are owned by their creator.
func TestPermissionsAsOtherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to switch users")
	}
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{AllowOther: true})
	// The user must be able to reach the mountpoint.
	for d := filepath.Dir(m.Dir()); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	shared := filepath.Join(m.Dir(), "shared")
	require.NoError(t, os.Mkdir(shared, 0o777))
	require.NoError(t, os.Chmod(shared, 0o777))
	rootFile := filepath.Join(shared, "rootfile")
	require.NoError(t, os.WriteFile(rootFile, []byte("root's"), 0o644))

	asUser := func(script string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// cd inside the shell, not cmd.Dir: a chdir between fork and exec
		// would make the FUSE request from a child that Go's vfork-style
		// ForkExec is still waiting on, with syscall.ForkLock held (one
		// CI run hung there, the child in request_wait_answer).
		cmd := exec.CommandContext(ctx, "sh", "-c", `cd "$SHARED" && `+script)
		cmd.Env = append(os.Environ(), "SHARED="+shared)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 4242, Gid: 4343}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := asUser("echo mine > mine && chmod 640 mine && cat rootfile")
	require.NoError(t, err, out)
	require.Equal(t, "root's", out)
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(filepath.Join(shared, "mine"), &st))
	require.Equal(t, []uint32{4242, 4343, 0o640}, []uint32{st.Uid, st.Gid, st.Mode & 0o7777})

	for _, script := range []string{"chmod 666 rootfile", "echo x >> rootfile", "chown 4242 rootfile"} {
		out, err := asUser(script)
		require.Error(t, err, "%s succeeded: %s", script, out)
		require.Regexp(t, "Operation not permitted|Permission denied", out)
	}
	got, err := os.ReadFile(rootFile)
	require.NoError(t, err)
	require.Equal(t, "root's", string(got))
	require.NoError(t, syscall.Stat(rootFile, &st))
	require.Equal(t, uint32(0o644), st.Mode&0o7777)

	// A sticky directory: anyone may create, only owners may remove.
	require.NoError(t, syscall.Chmod(shared, 0o1777))
	out, err = asUser("echo x > own && rm own && mv mine mine2 && mv mine2 mine")
	require.NoError(t, err, out)
	for _, script := range []string{"rm -f rootfile", "mv rootfile elsewhere", "mv mine rootfile"} {
		out, err := asUser(script)
		require.Error(t, err, "%s succeeded in a sticky directory: %s", script, out)
		require.Contains(t, out, "Operation not permitted")
	}
	_, err = os.Stat(rootFile)
	require.NoError(t, err)

	// fs.protected_symlinks: the kernel refuses to follow the user's
	// symlink in a sticky world-writable directory for anyone else, from
	// the owners and modes the mount reports.
	out, err = asUser("ln -s rootfile ulink")
	require.NoError(t, err, out)
	const knob = "/proc/sys/fs/protected_symlinks"
	was, err := os.ReadFile(knob)
	if err != nil {
		return
	}
	if os.WriteFile(knob, []byte("1"), 0) != nil {
		return
	}
	t.Cleanup(func() { _ = os.WriteFile(knob, was, 0) })
	_, err = os.ReadFile(filepath.Join(shared, "ulink"))
	require.ErrorIs(t, err, syscall.EACCES, "root followed another user's symlink in a sticky world-writable directory")
	out, err = asUser("cat ulink")
	require.NoError(t, err, out)
	require.Equal(t, "root's", out, "the symlink's owner follows it")
}

// TestMknod: mknod makes regular files, FIFOs, sockets and devices with
// their type and device number, and a FIFO passes data on this host.
func TestMknod(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	for _, tc := range []struct {
		name string
		mode uint32
		dev  int
	}{
		{"reg", syscall.S_IFREG | 0o640, 0},
		{"fifo", syscall.S_IFIFO | 0o644, 0},
		{"sock", syscall.S_IFSOCK | 0o644, 0},
		{"chr", syscall.S_IFCHR | 0o644, 0x0103},
		{"blk", syscall.S_IFBLK | 0o600, 0x0800},
	} {
		p := filepath.Join(m.Dir(), tc.name)
		var err error
		within(t, time.Minute, "mknod "+tc.name, func() error { err = syscall.Mknod(p, tc.mode, tc.dev); return nil })
		require.NoError(t, err, tc.name)
		var st syscall.Stat_t
		require.NoError(t, syscall.Lstat(p, &st))
		require.Equal(t, tc.mode, st.Mode, tc.name)
		require.EqualValues(t, tc.dev, st.Rdev, tc.name)
		require.Zero(t, st.Size)
		require.ErrorIs(t, syscall.Mknod(p, tc.mode, 0), syscall.EEXIST)
	}
	fifo := filepath.Join(m.Dir(), "fifo")
	rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	require.NoError(t, err)
	defer rd.Close()
	wr, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = wr.Write([]byte("piped"))
	require.NoError(t, err)
	require.NoError(t, wr.Close())
	buf := make([]byte, 16)
	n, err := rd.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "piped", string(buf[:n]))

	// bind(2) of a Unix socket makes its inode through the mount.
	sock := filepath.Join(m.Dir(), "listening")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			_, _ = c.Write([]byte("hello"))
			_ = c.Close()
		}
	}()
	var st syscall.Stat_t
	require.NoError(t, syscall.Lstat(sock, &st))
	require.EqualValues(t, syscall.S_IFSOCK, st.Mode&syscall.S_IFMT)
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	require.NoError(t, c.Close())
}

// TestListingShowsWhatWasWritten lists a directory whose files were
// written elsewhere and one this mount is writing (collected, not yet
// committed): every size the listing's stat reports is current. With the
// go-fuse binding the listing is READDIRPLUS and carries the attributes.
func TestListingShowsWhatWasWritten(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	c := newClient(t, cl.APIAddrs())
	require.NoError(t, c.Mkdir("/d", 0o755))
	want := map[string]int64{}
	for i := range 20 {
		name := fmt.Sprintf("f%02d", i)
		require.NoError(t, c.WriteFile("/d/"+name, make([]byte, i*37), 0o644))
		want[name] = int64(i * 37)
	}
	f, err := os.Create(filepath.Join(m.Dir(), "d", "open"))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Write(make([]byte, 5000))
	require.NoError(t, err)
	want["open"] = 5000

	ents, err := os.ReadDir(filepath.Join(m.Dir(), "d"))
	require.NoError(t, err)
	got := map[string]int64{}
	for _, e := range ents {
		info, err := e.Info()
		require.NoError(t, err)
		got[e.Name()] = info.Size()
	}
	require.Equal(t, want, got)
}
