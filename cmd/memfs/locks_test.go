package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/server/servertest"
)

// startMount runs `memfs mount --daemon` on a new directory with extra
// flags and returns the directory and the mount's pid, killed and
// detached at cleanup.
func startMount(t *testing.T, bin, cluster string, flags ...string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	lazyUnmountAtCleanup(t, dir)
	args := append(append([]string{"mount", "--daemon"}, flags...), dir)
	out, stderr, code := memfsCmd(t, bin, cluster, args...)
	require.Zero(t, code, stderr)
	pid := daemonPID(t, out)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return dir, pid
}

// flockHeld reports whether `flock -n` finds the lock on p taken.
func flockHeld(t *testing.T, p string) bool {
	t.Helper()
	err := exec.Command("flock", "-n", p, "true").Run()
	if ee := (*exec.ExitError)(nil); err != nil && !errors.As(err, &ee) {
		require.NoError(t, err)
	}
	return err != nil
}

// TestLockHolderMountKilled: a flock(1) holds a lock through one mount
// process, which is killed with SIGKILL (its host died); a flock(1)
// waiting through another mount gets the lock once the dead mount's
// session lease ends. With --local-locks the two mounts do not exclude
// each other at all.
func TestLockHolderMountKilled(t *testing.T) {
	requireFUSE(t)
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock is not installed")
	}
	bin := memfsBinary(t)
	cl := servertest.StartCluster(t, 3)
	cluster := strings.Join(cl.APIAddrs(), ",")
	a, pid := startMount(t, bin, cluster, "--lease", "2s")
	b, _ := startMount(t, bin, cluster)
	require.NoError(t, os.WriteFile(filepath.Join(a, "L"), nil, 0o644))

	holder := exec.Command("flock", filepath.Join(a, "L"), "sleep", "600")
	require.NoError(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	waitFor(t, 30*time.Second, "the holder takes the lock", func() bool { return flockHeld(t, filepath.Join(b, "L")) })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waiter := exec.CommandContext(ctx, "flock", "-w", "90", filepath.Join(b, "L"), "true")
	require.NoError(t, waiter.Start())
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	start := time.Now()
	require.NoError(t, waiter.Wait(), "the waiter did not get the lock of the killed mount")
	t.Logf("waiter got the lock %v after the holder's mount was killed (lease 2s)", time.Since(start).Round(time.Millisecond))

	// Host-local locks: a third mount's holder does not keep b out.
	c, _ := startMount(t, bin, cluster, "--local-locks")
	d, _ := startMount(t, bin, cluster, "--local-locks")
	local := exec.Command("flock", filepath.Join(c, "L"), "sleep", "600")
	require.NoError(t, local.Start())
	t.Cleanup(func() { _ = local.Process.Kill(); _ = local.Wait() })
	waitFor(t, 30*time.Second, "the local holder takes the lock", func() bool { return flockHeld(t, filepath.Join(c, "L")) })
	require.False(t, flockHeld(t, filepath.Join(d, "L")), "--local-locks mounts excluded each other")
}
