package fsm

import (
	"fmt"
	"maps"
	"slices"
)

// CapHolders returns, for the published state, the sessions holding a
// capability on an inode that are still in force at log time now (their
// session not expired, the capability not due for revocation).
func (f *FSM) CapHolders(now int64) func(ino uint64) []uint64 {
	s := f.cur.Load()
	return func(ino uint64) []uint64 {
		var out []uint64
		for _, c := range s.capsOf(ino) {
			sess := s.session(c.session)
			if sess == nil || sess.expires <= now || (c.revokeAt != 0 && c.revokeAt <= now) {
				continue
			}
			out = append(out, c.session)
		}
		slices.Sort(out)
		return out
	}
}

// CapCount is the number of capabilities held.
func (f *FSM) CapCount() uint64 { return f.cur.Load().ncaps }

// CheckNames compares where the published state says each file is named
// (its parent field and the links index, names.go) with the directory
// entries, which are what a restore derives them from.
func (f *FSM) CheckNames() error {
	s := f.cur.Load()
	want := map[uint64]map[uint64]uint32{} // file -> directory -> names
	s.dirents.root().Walk(func(k []byte, d dent) bool {
		if d.typ != modeDir {
			if want[d.ino] == nil {
				want[d.ino] = map[uint64]uint32{}
			}
			want[d.ino][be.Uint64(k)]++
		}
		return false
	})
	indexed := 0
	var err error
	s.inodes.root().Walk(func(_ []byte, n *inode) bool {
		if n.isDir() {
			return false
		}
		dirs, total := want[n.ino], uint32(0)
		var parent uint64
		for d, c := range dirs {
			total += c
			parent = d
		}
		if total > 1 {
			parent = manyDirs
		}
		got := map[uint64]uint32{}
		it := s.links.root().Iterator()
		it.SeekPrefix(u64key(n.ino))
		for k, c, ok := it.Next(); ok; k, c, ok = it.Next() {
			got[be.Uint64(k[8:])] = c
		}
		indexed += len(got)
		switch {
		case n.parent != parent:
			err = fmt.Errorf("file %d: parent field %d, want %d (names %v)", n.ino, n.parent, parent, dirs)
		case parent == manyDirs && !maps.Equal(got, dirs):
			err = fmt.Errorf("file %d: index %v, names %v", n.ino, got, dirs)
		case parent != manyDirs && len(got) > 0:
			err = fmt.Errorf("file %d with parent field %d is in the index: %v", n.ino, parent, got)
		}
		return err != nil
	})
	if err == nil && indexed != s.links.len() {
		err = fmt.Errorf("links index has %d entries, %d of live files", s.links.len(), indexed)
	}
	return err
}
