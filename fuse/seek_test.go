package fuse

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
)

// TestFileSizeLimitThroughMount: the kernel lets a FUSE mount's files grow
// to 2^63-1, so the mount itself answers as the kernel does at a local
// file system's limit: a write that starts at pb.MaxFileSize or past it is
// EFBIG, one that crosses it is cut short there, and a truncate past it is
// EFBIG, each when the call returns, never later at close or fsync.
func TestFileSizeLimitThroughMount(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	fd, err := syscall.Open(filepath.Join(m.Dir(), "f"), syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
	require.NoError(t, err)
	defer syscall.Close(fd)
	_, err = syscall.Pwrite(fd, []byte("start"), 0)
	require.NoError(t, err)
	for _, off := range []int64{pb.MaxFileSize, pb.MaxFileSize + 1, 1 << 51, 1 << 62} {
		_, err = syscall.Pwrite(fd, []byte("xy"), off)
		require.ErrorIs(t, err, syscall.EFBIG, "write at %d", off)
	}
	n, err := syscall.Pwrite(fd, []byte("abcd"), pb.MaxFileSize-2)
	require.NoError(t, err)
	require.Equal(t, 2, n, "a write crossing the limit is cut short at it")
	require.ErrorIs(t, syscall.Ftruncate(fd, pb.MaxFileSize+1), syscall.EFBIG)
	require.NoError(t, syscall.Fsync(fd))
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(fd, &st))
	require.Equal(t, int64(pb.MaxFileSize), st.Size)
	buf := make([]byte, 4)
	n, err = syscall.Pread(fd, buf, pb.MaxFileSize-2)
	require.NoError(t, err)
	require.Equal(t, "ab", string(buf[:n]))
	require.NoError(t, syscall.Ftruncate(fd, pb.MaxFileSize))
}

// TestBazilSeeksWithoutHoles records what bazil.org/fuse gives SEEK_DATA
// and SEEK_HOLE: it has no request for FUSE_LSEEK and answers ENOSYS, so
// the kernel treats the whole file as data (docs/fuse.md, "Limits").
func TestBazilSeeksWithoutHoles(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{Binding: "bazil"})
	fd, err := syscall.Open(filepath.Join(m.Dir(), "f"), syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
	require.NoError(t, err)
	defer syscall.Close(fd)
	_, err = syscall.Pwrite(fd, []byte("end"), 4<<20)
	require.NoError(t, err)
	pos, err := syscall.Seek(fd, 5, seekData)
	require.NoError(t, err)
	require.Equal(t, int64(5), pos)
	pos, err = syscall.Seek(fd, 5, seekHole)
	require.NoError(t, err)
	require.Equal(t, int64(4<<20+3), pos)
	_, err = syscall.Seek(fd, 4<<20+3, seekData)
	require.ErrorIs(t, err, syscall.ENXIO)
}

// lseek(2)'s whence values for data and holes (Linux).
const (
	seekData = 3
	seekHole = 4
)

// TestStickyBitShown: stat shows S_ISVTX on a directory and a file, after
// chmod and through a second mount that never saw them (a fresh lookup),
// through either binding (bazil.org/fuse drops the bit from its own
// replies; the bazil binding answers GETATTR of a sticky inode itself).
func TestStickyBitShown(t *testing.T) {
	cl := startCluster(t, 1)
	m := mountOn(t, cl.APIAddrs(), Options{})
	d, f := filepath.Join(m.Dir(), "d"), filepath.Join(m.Dir(), "d", "f")
	require.NoError(t, syscall.Mkdir(d, 0o755))
	require.NoError(t, syscall.Chmod(d, 0o1777))
	fd, err := syscall.Open(f, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_CLOEXEC, 0o644)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd))
	require.NoError(t, syscall.Chmod(f, 0o1644))
	mode := func(p string) uint32 {
		var st syscall.Stat_t
		require.NoError(t, syscall.Lstat(p, &st))
		return st.Mode & 0o7777
	}
	require.Equal(t, uint32(0o1777), mode(d))
	require.Equal(t, uint32(0o1644), mode(f))
	other := mountOn(t, cl.APIAddrs(), Options{})
	require.Equal(t, uint32(0o1777), mode(filepath.Join(other.Dir(), "d")))
	require.Equal(t, uint32(0o1644), mode(filepath.Join(other.Dir(), "d", "f")))
	require.NoError(t, syscall.Chmod(f, 0o644))
	require.Equal(t, uint32(0o644), mode(f))
	require.NoError(t, syscall.Chmod(d, 0o755))
	require.Equal(t, uint32(0o755), mode(d))
}
