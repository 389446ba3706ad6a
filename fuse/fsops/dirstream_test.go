package fsops

import (
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// dirOf is a listing as ReadDir returns it.
func dirOf(names ...string) []DirEntry {
	out := []DirEntry{{Name: ".", Ino: 1}, {Name: "..", Ino: 1}}
	for i, n := range names {
		out = append(out, DirEntry{Name: n, Ino: uint64(10 + i)})
	}
	return out
}

// readStream reads s from off, at most n entries (n < 0: all), listing
// dir when the stream asks, and returns the names and the offset of the
// last one (off when none).
func readStream(t *testing.T, s *DirStream, off uint64, n int, dir []DirEntry) ([]string, uint64) {
	t.Helper()
	var names []string
	last := off
	e := s.Read(off, func() ([]DirEntry, syscall.Errno) { return slices.Clone(dir), 0 }, func(de DirEntry, o uint64) bool {
		if n >= 0 && len(names) == n {
			return false
		}
		names = append(names, de.Name)
		last = o
		return true
	})
	require.Zero(t, e)
	return names, last
}

func TestDirStreamOffsetsSurviveChanges(t *testing.T) {
	before := dirOf("b", "d", "f", "h", "j")
	for _, tc := range []struct {
		name  string
		after []DirEntry // the directory when the stream is read again
		want  []string   // read from the offset telldir gave after "d"
	}{
		{"unchanged", before, []string{"f", "h", "j"}},
		{"added before", dirOf("a", "b", "c", "d", "f", "h", "j"), []string{"f", "h", "j"}},
		{"removed before", dirOf("d", "f", "h", "j"), []string{"f", "h", "j"}},
		{"the entry itself removed", dirOf("b", "f", "h", "j"), []string{"f", "h", "j"}},
		{"added after", dirOf("b", "d", "e", "f", "h", "j", "k"), []string{"e", "f", "h", "j", "k"}},
		{"removed after", dirOf("b", "d", "h"), []string{"h"}},
		{"names before the dots", dirOf(" x", "-y", "b", "d", "f", "h", "j"), []string{"f", "h", "j"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s DirStream
			got, pos := readStream(t, &s, 0, 4, before) // ".", "..", "b", "d": telldir
			require.Equal(t, []string{".", "..", "b", "d"}, got)
			rest, _ := readStream(t, &s, pos, -1, before)
			require.Equal(t, []string{"f", "h", "j"}, rest)
			// rewinddir, a whole listing, then seekdir to pos.
			all, _ := readStream(t, &s, 0, -1, tc.after)
			require.Len(t, all, len(tc.after))
			got, _ = readStream(t, &s, pos, -1, tc.after)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestDirStreamListsAtOffsetZeroAndSeeks checks when the stream reads the
// directory again: at offset 0 and after a seek, not while reads follow
// each other.
func TestDirStreamListsAtOffsetZeroAndSeeks(t *testing.T) {
	var s DirStream
	lists := 0
	dir := dirOf("a", "b", "c", "d")
	read := func(off uint64, n int) ([]string, uint64) {
		var names []string
		last := off
		require.Zero(t, s.Read(off, func() ([]DirEntry, syscall.Errno) { lists++; return slices.Clone(dir), 0 },
			func(de DirEntry, o uint64) bool {
				if len(names) == n {
					return false
				}
				names, last = append(names, de.Name), o
				return true
			}))
		return names, last
	}
	_, p1 := read(0, 3) // . .. a
	_, p2 := read(p1, 1)
	_, _ = read(p2, 1)
	require.Equal(t, 1, lists, "sequential reads use the listing read at offset 0")
	// A program that renames what it reads still comes to the end.
	dir = dirOf("b", "c", "d", "zz-a")
	got, p3 := read(p2, 10)
	require.Equal(t, []string{"c", "d"}, got)
	_, _ = read(p3, 10) // at the end: asked again where the reply ended
	require.Equal(t, 1, lists)
	got, _ = read(p1, 10) // seekdir back: the directory as it is now
	require.Equal(t, 2, lists)
	require.Equal(t, []string{"b", "c", "d", "zz-a"}, got)
	_, _ = read(0, 10)
	require.Equal(t, 3, lists)
	got, _ = read(12345, 10)
	require.Empty(t, got, "an offset the stream never handed out")
}
