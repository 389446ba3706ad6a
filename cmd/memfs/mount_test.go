package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fuse"
	"github.com/memoryfs/memfs/server/servertest"
)

func requireFUSE(t *testing.T) {
	t.Helper()
	if err := fuse.Available(); err != nil {
		t.Skipf("FUSE mounts unavailable here: %v", err)
	}
}

// mounted reports whether a memfs FUSE mount is on dir.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	m, ok, err := fuse.MountedAt(dir)
	require.NoError(t, err)
	return ok && m.FSType == "fuse.memfs"
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for the condition
	}
}

// memfsCmd runs the binary with a time limit and returns stdout, stderr
// and the exit code.
func memfsCmd(t *testing.T, bin, cluster string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--cluster", cluster}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out.String(), errOut.String(), code
}

// lazyUnmountAtCleanup detaches whatever is left on dir when the test
// ends.
func lazyUnmountAtCleanup(t *testing.T, dir string) {
	t.Cleanup(func() { _ = exec.Command(fuse.Fusermount, "-uz", dir).Run() })
}

// daemonPID reads the pid `memfs mount --daemon` printed.
func daemonPID(t *testing.T, out string) int {
	t.Helper()
	var pid int
	i := strings.Index(out, "(pid ")
	require.GreaterOrEqual(t, i, 0, out)
	_, err := fmt.Sscanf(out[i:], "(pid %d)", &pid)
	require.NoError(t, err)
	return pid
}

func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestMountCommandRefusals(t *testing.T) {
	requireFUSE(t)
	bin := memfsBinary(t)
	cl := servertest.StartCluster(t, 1)
	cluster := strings.Join(cl.APIAddrs(), ",")
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))

	_, stderr, code := memfsCmd(t, bin, cluster, "mount", file)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "not a directory")

	_, stderr, code = memfsCmd(t, bin, cluster, "mount", filepath.Join(dir, "missing"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no such file or directory")

	_, _, code = memfsCmd(t, bin, cluster, "mount")
	require.Equal(t, 2, code, "no mountpoint is a usage error")

	_, stderr, code = memfsCmd(t, bin, cluster, "mount", "--binding", "libfuse", dir)
	require.Equal(t, 2, code, "an unknown binding is a usage error")
	require.Contains(t, stderr, `--binding "libfuse": want bazil or gofuse`)
}

// TestMountCommandForeground mounts in the foreground, uses the mount,
// refuses a second mount on the same directory, and unmounts on SIGTERM.
func TestMountCommandForeground(t *testing.T) {
	requireFUSE(t)
	bin := memfsBinary(t)
	cl := servertest.StartCluster(t, 3)
	cluster := strings.Join(cl.APIAddrs(), ",")
	dir := t.TempDir()
	lazyUnmountAtCleanup(t, dir)

	metrics := freePorts(t, 1)[0]
	cmd := exec.Command(bin, "--cluster", cluster, "mount", "--metrics-addr", metrics, dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitFor(t, 30*time.Second, "mount appears", func() bool { return mounted(t, dir) })

	require.NoError(t, os.WriteFile(filepath.Join(dir, "hello"), []byte("through the mount"), 0o644))
	got, _, code := memfsCmd(t, bin, cluster, "cat", "/hello")
	require.Zero(t, code)
	require.Equal(t, "through the mount", got)
	// --metrics-addr serves the mount's own metrics.
	resp, err := http.Get("http://" + metrics + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Regexp(t, `memfs_mount_ops_total\{op="write"\} [1-9]`, string(body))
	require.Contains(t, string(body), "memfs_mount_journal_depth")

	_, stderr, code := memfsCmd(t, bin, cluster, "mount", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "already mounted")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		require.NoError(t, err, out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("memfs mount did not exit on SIGTERM:\n%s", out.String())
	}
	require.False(t, mounted(t, dir), "SIGTERM must unmount")
}

// TestMountCommandDaemonAndStale detaches a mount, kills it with SIGKILL,
// and checks that the next `memfs mount` clears the stale mountpoint, with
// each FUSE binding.
func TestMountCommandDaemonAndStale(t *testing.T) {
	requireFUSE(t)
	bin := memfsBinary(t)
	cl := servertest.StartCluster(t, 3)
	cluster := strings.Join(cl.APIAddrs(), ",")
	for _, binding := range []string{fuse.BindingBazil, fuse.BindingGoFuse} {
		t.Run(binding, func(t *testing.T) { daemonAndStale(t, bin, cluster, binding) })
	}
}

func daemonAndStale(t *testing.T, bin, cluster, binding string) {
	dir := t.TempDir()
	lazyUnmountAtCleanup(t, dir)
	name := filepath.Join("/", binding)

	out, stderr, code := memfsCmd(t, bin, cluster, "mount", "--daemon", "--binding", binding, dir)
	require.Zero(t, code, stderr)
	require.True(t, mounted(t, dir), "--daemon returns once the mount is ready")
	pid := daemonPID(t, out)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	// Synced: a mount acknowledges changes before they are committed,
	// and what it had not committed dies with it.
	writeSynced(t, filepath.Join(dir, name), "1")

	// A killed mount process leaves a dead mount behind.
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	waitFor(t, 10*time.Second, "daemon dies", func() bool { return processGone(pid) })
	_, err := os.Stat(dir)
	require.ErrorIs(t, err, syscall.ENOTCONN)

	out, stderr, code = memfsCmd(t, bin, cluster, "mount", "--daemon", "--binding", binding, dir)
	require.Zero(t, code, stderr)
	pid = daemonPID(t, out)
	got, err := os.ReadFile(filepath.Join(dir, name))
	require.NoError(t, err)
	require.Equal(t, "1", string(got))

	// An unmount from outside ends the daemon.
	require.NoError(t, exec.Command(fuse.Fusermount, "-u", dir).Run())
	waitFor(t, 30*time.Second, "daemon exits after fusermount3 -u", func() bool { return processGone(pid) })
	require.False(t, mounted(t, dir))
}

// TestUpMount checks `memfs up --mount DIR`: the README's first command
// gives a working mount, on a directory it makes, gone when up stops.
func TestUpMount(t *testing.T) {
	requireFUSE(t)
	bin := memfsBinary(t)
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	lazyUnmountAtCleanup(t, mnt)
	p := startUpWith(t, bin, filepath.Join(dir, "data"), freeBasePort(t, 3), true, []string{"--mount", mnt})
	waitFor(t, 90*time.Second, "up mounts the cluster", func() bool { return strings.Contains(p.out.String(), "Mounted the cluster on") })
	require.True(t, mounted(t, mnt))

	require.NoError(t, os.WriteFile(filepath.Join(mnt, "readme"), []byte("hi"), 0o644))
	got, _, code := memfsCmd(t, bin, p.cluster, append(upTLSFlags(filepath.Join(dir, "data")), "cat", "/readme")...)
	require.Zero(t, code)
	require.Equal(t, "hi", got)

	p.stop(t)
	require.False(t, mounted(t, mnt), "stopping up unmounts")
	// The mount's log lines went to its log file, not into up's output.
	require.NotContains(t, p.out.String(), "GC headroom tuned")
	log, err := os.ReadFile(filepath.Join(dir, "data", "mount.log"))
	require.NoError(t, err)
	require.Contains(t, string(log), "GC headroom tuned")
}

// writeSynced writes content to a new file p and fsyncs it.
func writeSynced(t *testing.T, p, content string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	_, err = f.WriteString(content)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}
