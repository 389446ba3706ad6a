package fsops

import (
	"slices"
	"strings"
	"sync"
	"syscall"
)

// DirStream is one open directory as the kernel reads it, for a binding
// to serve READDIR from: the offsets it hands out (what telldir returns
// and seekdir takes) stay valid for the life of the handle, across
// changes to the directory and fresh listings.
//
// An offset names an entry, not a position in a listing: the first time
// the stream serves a name it gives it the next number of the handle, and
// a read at that offset continues after that name in the stream's order
// ("." and ".." first, then by name, the cluster's order). An index into
// the listing would shift as entries come and go, and a later listing
// (after rewinddir) would then repeat or skip entries that did not
// change.
//
// The listing is read anew at offset 0 (opendir, rewinddir) and when the
// kernel asks for an offset other than where the previous reply began or
// one of the entries it carried, which is a seekdir: the reader then sees
// the directory as it is. Reads that follow each other are served from
// the listing already read, so a program that renames the entries it
// reads (each new name sorting later) still comes to the end.
type DirStream struct {
	mu    sync.Mutex
	ents  []DirEntry        // guarded by mu: the listing served, in stream order
	off   map[string]uint64 // guarded by mu: the offset handed out for each name
	name  map[uint64]string // guarded by mu: and the name of each offset
	from  uint64            // guarded by mu: the offset the last reply began after
	sent  []uint64          // guarded by mu: the offsets of the entries it carried
	ended bool              // guarded by mu: a listing was read (ents may be empty)
}

// The offsets of "." and ".."; other names count from firstDirOff.
const (
	dotOff      = 1
	dotDotOff   = 2
	firstDirOff = 3
)

// dirRank orders "." and ".." before every other name, which may sort
// lower ("-x", " x").
func dirRank(name string) int {
	switch name {
	case ".":
		return 0
	case "..":
		return 1
	}
	return 2
}

func compareDirNames(a, b string) int {
	if ra, rb := dirRank(a), dirRank(b); ra != rb {
		return ra - rb
	}
	return strings.Compare(a, b)
}

// Read calls emit with the entries that follow offset off, each with its
// offset, until emit returns false (the reply is full) or the listing
// ends. list reads the directory (Ops.ReadDir or ReadDirPlus) when the
// stream needs a fresh listing.
func (s *DirStream) Read(off uint64, list func() ([]DirEntry, syscall.Errno), emit func(DirEntry, uint64) bool) syscall.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off == nil {
		s.off = map[string]uint64{".": dotOff, "..": dotDotOff}
		s.name = map[uint64]string{dotOff: ".", dotDotOff: ".."}
	}
	after := ""
	if off != 0 {
		n, ok := s.name[off]
		if !ok {
			// Not an offset of this stream's: nothing follows it.
			s.from, s.sent = off, nil
			return 0
		}
		after = n
	}
	if off == 0 || !s.ended || off != s.from && !slices.Contains(s.sent, off) {
		ents, e := list()
		if e != 0 {
			return e
		}
		slices.SortStableFunc(ents, func(a, b DirEntry) int { return compareDirNames(a.Name, b.Name) })
		s.ents, s.ended = ents, true
	}
	i := 0
	if off != 0 {
		i, _ = slices.BinarySearchFunc(s.ents, after, func(e DirEntry, name string) int { return compareDirNames(e.Name, name) })
		if i < len(s.ents) && s.ents[i].Name == after {
			i++
		}
	}
	s.from, s.sent = off, s.sent[:0]
	for ; i < len(s.ents); i++ {
		de := s.ents[i]
		o := s.offsetLocked(de.Name)
		if !emit(de, o) {
			break
		}
		s.sent = append(s.sent, o)
	}
	return 0
}

func (s *DirStream) offsetLocked(name string) uint64 {
	if o, ok := s.off[name]; ok {
		return o
	}
	o := uint64(firstDirOff + len(s.off) - 2)
	s.off[name] = o
	s.name[o] = name
	return o
}
