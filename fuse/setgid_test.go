package fuse

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fuse/posixtest"
)

// asFSUser runs fn on a thread of its own whose file system identity is
// uid and gid (which drops the file capabilities, CAP_FSETID among them),
// with umask of its own; the thread ends with fn.
func asFSUser(t *testing.T, uid, gid int, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := syscall.Unshare(syscall.CLONE_FS); err != nil {
			done <- fmt.Errorf("unshare: %w", err)
			return
		}
		syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(gid), 0, 0)
		syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(uid), 0, 0)
		fn()
		done <- nil
	}()
	require.NoError(t, <-done)
}

// setgidCreates makes, in dir (a set-group-ID directory of group 4321),
// files and a directory as user 4242 outside that group and as a member,
// with and without a umask that takes group-execute away, and lists each
// one's mode and group.
func setgidCreates(t *testing.T, dir string) []string {
	require.NoError(t, os.Chown(dir, 0, 4321))
	require.NoError(t, syscall.Chmod(dir, 0o2777))
	var out []string
	create := func(name string, mode uint32, mkdir bool) {
		p := filepath.Join(dir, name)
		var err error
		if mkdir {
			err = syscall.Mkdir(p, mode)
		} else {
			var fd int
			if fd, err = syscall.Open(p, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY|syscall.O_CLOEXEC, mode); err == nil {
				syscall.Close(fd)
			}
		}
		var st syscall.Stat_t
		if err == nil {
			err = syscall.Lstat(p, &st)
		}
		out = append(out, fmt.Sprintf("%s: %#o gid=%d err=%v", name, st.Mode&0o7777, st.Gid, err))
	}
	asFSUser(t, 4242, 4343, func() {
		syscall.Umask(0)
		create("outsider", 0o2755, false)
		create("outsider-dir", 0o755, true)
		syscall.Umask(0o010)
		create("outsider-umask", 0o2775, false)
		create("outsider-umask-dir", 0o2775, true)
	})
	asFSUser(t, 4242, 4321, func() {
		syscall.Umask(0)
		create("member", 0o2755, false)
		syscall.Umask(0o010)
		create("member-umask", 0o2775, false)
	})
	return out
}

// TestSetgidCreatesAsOtherUser: in a set-group-ID directory, what a user
// outside its group creates takes the group, a new directory the bit too,
// and a new file does not keep S_ISGID (the kernel strips it, also when a
// umask takes group-execute away); a member keeps it. Compared with tmpfs.
func TestSetgidCreatesAsOtherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to switch users")
	}
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	refDir := posixtest.RefDir(t)
	// The user must be able to reach both directories.
	for _, top := range []string{refDir, m.Dir()} {
		for d := top; d != "/" && d != os.TempDir() && d != "/dev/shm"; d = filepath.Dir(d) {
			require.NoError(t, os.Chmod(d, 0o755))
		}
	}
	ref := filepath.Join(refDir, "sg")
	mnt := filepath.Join(m.Dir(), "sg")
	require.NoError(t, os.Mkdir(ref, 0o755))
	require.NoError(t, os.Mkdir(mnt, 0o755))
	want := setgidCreates(t, ref)
	require.Equal(t, want, setgidCreates(t, mnt))
	require.Contains(t, want, "outsider: 0755 gid=4321 err=<nil>")
	require.Contains(t, want, "outsider-dir: 02755 gid=4321 err=<nil>")
	require.Contains(t, want, "member: 02755 gid=4321 err=<nil>")
}
