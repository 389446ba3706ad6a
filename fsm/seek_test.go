package fsm_test

import (
	"bytes"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

func seekQ(p string, off int64, hole bool) *pb.Query {
	return &pb.Query{Q: &pb.Query_Seek{Seek: &pb.SeekQuery{Loc: ft.Path(p), Offset: off, Hole: hole}}}
}

// TestSeekDataHole checks SEEK_DATA and SEEK_HOLE answers on a file of
// hole, data, hole, data, hole (the chunk size is cs): data starts where a
// stored chunk does, a hole where one is missing or at the end of file,
// and an offset at or past the end is ENXIO.
func TestSeekDataHole(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	a := bytes.Repeat([]byte{'a'}, cs)
	h.Must(ft.Write("/f", 2*cs, a))
	h.Must(ft.Write("/f", 3*cs, a[:10]))
	h.Must(ft.Write("/f", 6*cs, a))
	h.Must(ft.Write("/f", 7*cs, make([]byte, cs))) // zeros store nothing: a hole
	h.Must(ft.Truncate("/f", 9*cs+5))
	const size = 9*cs + 5
	for _, c := range []struct {
		off  int64
		hole bool
		want int64 // -1: ENXIO
	}{
		{0, false, 2 * cs},
		{0, true, 0},
		{cs + 7, false, 2 * cs},
		{2 * cs, false, 2 * cs},
		{2*cs + 1, false, 2*cs + 1},
		{2*cs + 1, true, 4 * cs}, // the short block of chunk 3 is data to the chunk's end
		{3*cs + 100, true, 4 * cs},
		{4 * cs, false, 6 * cs},
		{6*cs + 3, true, 7 * cs},
		{7 * cs, false, -1},
		{7 * cs, true, 7 * cs},
		{size - 1, true, size - 1},
		{size - 1, false, -1},
		{size, true, -1},
		{size, false, -1},
		{size + 1, true, -1},
		{-1, true, -1},
		{-1, false, -1},
		{pb.MaxFileSize + 5, false, -1},
	} {
		r := h.Q(seekQ("/f", c.off, c.hole))
		if c.want < 0 {
			require.Equal(t, uint32(syscall.ENXIO), r.Errno, "off %d hole %v", c.off, c.hole)
			continue
		}
		require.Zero(t, r.Errno, "off %d hole %v: %s", c.off, c.hole, r.Message)
		require.Equal(t, uint64(c.want), r.N, "off %d hole %v", c.off, c.hole)
		require.Equal(t, uint64(size), r.Attr.Size)
	}
	require.Equal(t, uint32(syscall.EISDIR), h.Q(seekQ("/", 0, false)).Errno)
	require.Equal(t, uint32(syscall.ENOENT), h.Q(seekQ("/missing", 0, false)).Errno)
}

// TestSeekDenseFileEndsAtSize: a file with no hole finds its only hole at
// the end of file, also inside the last chunk.
func TestSeekDenseFileEndsAtSize(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	h.Must(ft.Write("/f", 0, bytes.Repeat([]byte{'b'}, 3*cs+17)))
	r := h.MustQ(seekQ("/f", 5, true))
	require.Equal(t, uint64(3*cs+17), r.N)
	r = h.MustQ(seekQ("/f", 3*cs+16, false))
	require.Equal(t, uint64(3*cs+16), r.N)
}

// TestFileSizeLimit: a write or truncate that would end past
// pb.MaxFileSize is EFBIG and changes nothing; one that ends on it is
// taken, and a hole covers everything before it.
func TestFileSizeLimit(t *testing.T) {
	h := newFile(t, fsm.Config{}, "/f")
	require.Equal(t, uint32(syscall.EFBIG), h.Do(ft.Write("/f", pb.MaxFileSize-1, []byte("ab"))).Errno)
	require.Equal(t, uint32(syscall.EFBIG), h.Do(ft.Truncate("/f", pb.MaxFileSize+1)).Errno)
	require.Zero(t, h.MustQ(ft.Stat("/f")).Attr.Size)
	h.Must(ft.Write("/f", pb.MaxFileSize-2, []byte("ab")))
	require.Equal(t, uint64(pb.MaxFileSize), h.MustQ(ft.Stat("/f")).Attr.Size)
	require.Equal(t, uint64(pb.MaxFileSize-cs), h.MustQ(seekQ("/f", 0, false)).N)
	require.Zero(t, h.MustQ(seekQ("/f", 0, true)).N)
}
