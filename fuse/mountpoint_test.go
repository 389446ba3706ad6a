package fuse

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	bfuse "bazil.org/fuse"
	"bazil.org/fuse/fs"
	"github.com/stretchr/testify/require"
)

// childEnv makes the test binary a helper process that mounts an empty
// directory tree on the path it names and serves it until killed: the way
// to leave a real stale mount behind.
const childEnv = "MEMFS_FUSE_TEST_CHILD_MOUNT"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(serveEmptyDir(dir))
	}
	os.Exit(m.Run())
}

type emptyFS struct{}
type emptyDir struct{}

func (emptyFS) Root() (fs.Node, error) { return emptyDir{}, nil }
func (emptyDir) Attr(_ context.Context, a *bfuse.Attr) error {
	a.Mode = os.ModeDir | 0o755
	return nil
}

func serveEmptyDir(dir string) int {
	c, err := bfuse.Mount(dir, bfuse.FSName("memfs-test-child"))
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	os.Stdout.WriteString("ready\n")
	_ = fs.Serve(c, emptyFS{})
	return 0
}

// requireFUSE skips the test when real mounts cannot be made here.
func requireFUSE(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("FUSE mounts unavailable here: %v", err)
	}
}

// startChildMount mounts an empty tree on dir from a child process and
// returns it once the mount is up.
func startChildMount(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		_ = exec.Command(Fusermount, "-uz", dir).Run()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "child mount did not come up")
	require.Equal(t, "ready\n", line)
	return cmd
}

func TestReadMountInfo(t *testing.T) {
	table := `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:32 / /mnt/with\040space rw,nosuid - fuse.memfs memfs rw,user_id=0
37 22 0:33 / /mnt/back\134slash rw - tmpfs tmp\040fs rw
garbage line
`
	infos, err := ReadMountInfo(strings.NewReader(table))
	require.NoError(t, err)
	require.Equal(t, []MountInfo{
		{Mountpoint: "/", FSType: "ext4", Source: "/dev/sda1"},
		{Mountpoint: "/mnt/with space", FSType: "fuse.memfs", Source: "memfs"},
		{Mountpoint: `/mnt/back\slash`, FSType: "tmpfs", Source: "tmp fs"},
	}, infos)
}

func TestPrepareMountpointRefusals(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))

	_, err := PrepareMountpoint(ctx, file, false)
	require.ErrorIs(t, err, ErrNotDirectory)
	require.Contains(t, err.Error(), file)

	_, err = PrepareMountpoint(ctx, filepath.Join(dir, "missing"), false)
	require.ErrorIs(t, err, os.ErrNotExist)

	// A mount that is not FUSE is refused even with force.
	_, err = PrepareMountpoint(ctx, "/proc", true)
	require.ErrorIs(t, err, ErrAlreadyMounted)

	got, err := PrepareMountpoint(ctx, dir, false)
	require.NoError(t, err)
	real, _ := filepath.EvalSymlinks(dir)
	require.Equal(t, real, got)
}

func TestPrepareMountpointLiveMount(t *testing.T) {
	requireFUSE(t)
	ctx := context.Background()
	dir := t.TempDir()
	startChildMount(t, dir)

	_, err := PrepareMountpoint(ctx, dir, false)
	require.ErrorIs(t, err, ErrAlreadyMounted)
	require.Contains(t, err.Error(), "--force-unmount")

	_, err = PrepareMountpoint(ctx, dir, true)
	require.NoError(t, err)
	_, mounted, err := MountedAt(dir)
	require.NoError(t, err)
	require.False(t, mounted, "force should have detached the live mount")
}

func TestPrepareMountpointClearsStaleMount(t *testing.T) {
	requireFUSE(t)
	ctx := context.Background()
	dir := t.TempDir()
	child := startChildMount(t, dir)
	require.NoError(t, child.Process.Kill())
	_, _ = child.Process.Wait()

	// What a killed mount process leaves: the mount is still in the table
	// and every access fails with ENOTCONN.
	_, err := os.Stat(dir)
	require.True(t, errors.Is(err, syscall.ENOTCONN), "stat of a dead mount: %v", err)
	_, mounted, err := MountedAt(dir)
	require.NoError(t, err)
	require.True(t, mounted)

	got, err := PrepareMountpoint(ctx, dir, false)
	require.NoError(t, err)
	require.Equal(t, dir, got)
	_, mounted, err = MountedAt(dir)
	require.NoError(t, err)
	require.False(t, mounted)
}
