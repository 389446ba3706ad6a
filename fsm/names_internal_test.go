package fsm

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
)

// TestNamesFollowEntries adds and removes names of a few files in a few
// directories at random, several names in one directory and three or
// more in all included, and checks after every step that the parent
// fields and the links index hold the one form the names alone decide:
// no name 0, one name its directory in the parent field and nothing in
// the index, more names manyDirs and their counts by directory in the
// index.
func TestNamesFollowEntries(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	s := newState(1<<16, nil)
	parent := map[uint64]uint64{}           // file -> its parent field
	names := map[uint64]map[uint64]uint32{} // file -> directory -> names
	files := []uint64{100, 101, 102, 103}
	for step := range 20000 {
		ino, dir := files[rng.IntN(len(files))], 2+rng.Uint64N(3)
		if names[ino] == nil {
			names[ino] = map[uint64]uint32{}
		}
		if names[ino][dir] == 0 || rng.IntN(2) == 0 {
			parent[ino] = s.nameAdded(ino, parent[ino], dir)
			names[ino][dir]++
		} else {
			parent[ino] = s.nameRemoved(ino, parent[ino], dir)
			if names[ino][dir]--; names[ino][dir] == 0 {
				delete(names[ino], dir)
			}
		}
		if rng.IntN(10) == 0 {
			s.commit()
		}
		indexed := 0
		for _, f := range files {
			var want, total uint64
			for d, c := range names[f] {
				want, total = d, total+uint64(c)
			}
			if total > 1 {
				want = manyDirs
			}
			require.Equal(t, want, parent[f], "step %d: file %d named %v", step, f, names[f])
			got := map[uint64]uint32{}
			s.namedIn(&inode{ino: f, parent: parent[f]}, func(d uint64) bool {
				got[d]++
				return true
			})
			require.Equal(t, len(names[f]), len(got), "step %d: file %d named %v, namedIn %v", step, f, names[f], got)
			for d := range names[f] {
				require.Contains(t, got, d)
			}
			if want == manyDirs {
				idx := map[uint64]uint32{}
				for d := range names[f] {
					c, ok := s.links.get(pairKey(f, d))
					require.True(t, ok)
					idx[d] = c
				}
				require.True(t, maps.Equal(names[f], idx), "step %d: file %d named %v, index %v", step, f, names[f], idx)
				indexed += len(idx)
			}
		}
		require.Equal(t, indexed, s.links.len(), "step %d: index entries of files with one name or none", step)
	}
}

// TestRestoreDerivesFileParents: versions before names.go wrote a parent
// in a file's inode record (a clone's directory, never updated since),
// and a damaged snapshot may hold anything there; a restore ignores it
// and derives every file's directories from the entries.
func TestRestoreDerivesFileParents(t *testing.T) {
	f, err := New(Config{ChunkSize: 4096})
	require.NoError(t, err)
	cmds := []*pb.Command{
		{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/a"}, Mode: 0o755}}},
		{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/b"}, Mode: 0o755}}},
		{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: &pb.Loc{Path: "/a/one"}, Data: []byte("1"), Create: true}}},
		{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: &pb.Loc{Path: "/b/two"}, Data: []byte("2"), Create: true}}},
		{Op: &pb.Command_Link{Link: &pb.LinkCmd{Src: &pb.Loc{Path: "/b/two"}, Dst: &pb.Loc{Path: "/b/two2"}}}},
		{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: &pb.Loc{Path: "/b/three"}, Data: []byte("3"), Create: true}}},
	}
	for i, r := range f.Apply(1, &pb.Entry{Version: EntryVersion, TimeNs: 1e9, Commands: cmds}) {
		require.Zero(t, r.Errno, "command %d: %s", i, r.Message)
	}
	const a, one, two, three = 2, 4, 5, 6
	var buf bytes.Buffer
	_, err = f.Snapshot().WriteTo(&buf)
	require.NoError(t, err)
	snap := withParents(t, buf.Bytes(), map[uint64]uint64{one: 3, two: a, three: manyDirs})

	g, err := New(Config{ChunkSize: 4096})
	require.NoError(t, err)
	require.NoError(t, g.Restore(bytes.NewReader(snap)))
	require.NoError(t, g.CheckNames())
	for ino, errno := range map[uint64]syscall.Errno{one: 0, two: syscall.EACCES, three: syscall.EACCES} {
		r := g.Query(&pb.Query{Root: "/a", Owner: "o", Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Ino: ino}}}})
		require.Equal(t, errno, syscall.Errno(r.Errno), "inode %d: %s", ino, r.Message)
	}
	buf.Reset()
	_, err = g.Snapshot().WriteTo(&buf)
	require.NoError(t, err)
	require.NotEqual(t, snap, buf.Bytes())
	require.Equal(t, withParents(t, buf.Bytes(), nil), buf.Bytes(), "written back with files' parents 0")
}

// withParents returns snapshot snap with the parent field of the inode
// records of the inodes in parents set as it says, and the checksum made
// anew.
func withParents(t *testing.T, snap []byte, parents map[uint64]uint64) []byte {
	body := snap[:len(snap)-4]
	_, n := binary.Uvarint(body[len(snapMagic):])
	out := bytes.Clone(body[:len(snapMagic)+n])
	rest := body[len(snapMagic)+n:]
	for len(rest) > 0 {
		l, n := binary.Uvarint(rest[1:])
		require.Positive(t, n)
		kind, payload := rest[0], rest[1+n:1+n+int(l)]
		rest = rest[1+n+int(l):]
		if kind == recInode {
			d := &dec{b: payload}
			ino, gen, size, parent := d.uvarint(), d.uvarint(), d.uvarint(), d.uvarint()
			require.NoError(t, d.err)
			if p, ok := parents[ino]; ok {
				parent = p
			}
			var e enc
			payload = append(e.uvarint(ino).uvarint(gen).uvarint(size).uvarint(parent).b, d.b...)
		}
		out = append(append(append(out, kind), binary.AppendUvarint(nil, uint64(len(payload)))...), payload...)
	}
	return binary.LittleEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}
