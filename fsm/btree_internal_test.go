package fsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// model is a tab's expected content: sorted keys and their values.
type model struct {
	keys []string
	vals map[string]int
}

func (m *model) put(k string, v int) {
	if _, ok := m.vals[k]; !ok {
		i, _ := slices.BinarySearch(m.keys, k)
		m.keys = slices.Insert(m.keys, i, k)
	}
	m.vals[k] = v
}

func (m *model) del(k string) {
	if i, ok := slices.BinarySearch(m.keys, k); ok {
		m.keys = slices.Delete(m.keys, i, i+1)
		delete(m.vals, k)
	}
}

func (m *model) clone() *model {
	return &model{keys: slices.Clone(m.keys), vals: cloneMap(m.vals)}
}

func cloneMap(m map[string]int) map[string]int {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// checkTree compares t with m through every read the state uses, and
// checks the tree's shape: keys in order, separators bounding their
// subtrees, no node over btMax entries, leaves all at one depth.
func checkTree(t *testing.T, b tab[int], m *model) {
	t.Helper()
	require.Equal(t, len(m.keys), b.len())
	got := []string{}
	b.root().Walk(func(k []byte, v int) bool {
		got = append(got, string(k))
		if w := m.vals[string(k)]; v != w {
			t.Fatalf("walk: value of %x is %d, want %d", k, v, w)
		}
		return false
	})
	require.Equal(t, append([]string{}, m.keys...), got)
	for _, k := range m.keys {
		if v, ok := b.get([]byte(k)); !ok || v != m.vals[k] {
			t.Fatalf("get %x: %d %v, want %d", k, v, ok, m.vals[k])
		}
	}
	if b.top != nil {
		depth := -1
		if err := checkNode(b.top, nil, nil, 0, &depth, true); err != "" {
			t.Fatal(err)
		}
	}
}

func checkNode(n *btNode[int], lo, hi []byte, d int, depth *int, top bool) string {
	switch {
	case len(n.keys) > btMax:
		return fmt.Sprintf("node of %d entries", len(n.keys))
	case !top && len(n.keys) == 0:
		return "empty node"
	}
	if n.leaf() {
		if *depth < 0 {
			*depth = d
		}
		switch {
		case *depth != d:
			return fmt.Sprintf("leaves at depths %d and %d", *depth, d)
		case len(n.vals) != len(n.keys):
			return fmt.Sprintf("%d keys, %d values", len(n.keys), len(n.vals))
		}
		for i, k := range n.keys {
			switch {
			case i > 0 && bytes.Compare(n.keys[i-1], k) >= 0:
				return fmt.Sprintf("key %x after %x", k, n.keys[i-1])
			case lo != nil && bytes.Compare(k, lo) < 0, hi != nil && bytes.Compare(k, hi) >= 0:
				return fmt.Sprintf("key %x outside [%x, %x)", k, lo, hi)
			}
		}
		return ""
	}
	switch {
	case len(n.kids) != len(n.keys):
		return fmt.Sprintf("%d keys, %d children", len(n.keys), len(n.kids))
	case top && len(n.kids) < 2:
		return "top with one child"
	}
	for i, c := range n.kids {
		clo, chi := lo, hi
		if i > 0 {
			clo = n.keys[i]
		}
		if i+1 < len(n.kids) {
			chi = n.keys[i+1]
		}
		if err := checkNode(c, clo, chi, d+1, depth, false); err != "" {
			return err
		}
	}
	return ""
}

// TestTabMatchesModel applies random puts and deletes in transactions of
// random sizes, keeping every committed version, and checks at the end
// that each version still reads as it did when committed: a later
// transaction never changes an earlier version's nodes.
func TestTabMatchesModel(t *testing.T) {
	tests := []struct {
		name   string
		keys   int // distinct keys drawn from
		delPct int
		order  string
	}{
		{"ascending", 2000, 0, "asc"},
		{"descending", 1500, 0, "desc"},
		{"random", 3000, 20, "rand"},
		{"churn", 300, 50, "rand"},
		{"drain", 2000, 90, "rand"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			b := newTab[int]()
			m := &model{vals: map[string]int{}}
			type version struct {
				b tab[int]
				m *model
			}
			var versions []version
			step := 0
			for step < 4*tc.keys {
				for range 1 + rng.IntN(200) {
					var n int
					switch tc.order {
					case "asc":
						n = step
					case "desc":
						n = 4*tc.keys - step
					default:
						n = rng.IntN(tc.keys)
					}
					k := dirKey(uint64(n%7), string(binary.BigEndian.AppendUint32(nil, uint32(n))))
					if rng.IntN(100) < tc.delPct {
						b.del(k)
						m.del(string(k))
					} else {
						b.put(k, step)
						m.put(string(k), step)
					}
					step++
				}
				b.commit()
				versions = append(versions, version{b, m.clone()})
			}
			for _, v := range versions {
				checkTree(t, v.b, v.m)
			}
		})
	}
}

// TestTabIterators checks the seeks the state uses: lower bound, prefix,
// and a walk of a prefix that stops early.
func TestTabIterators(t *testing.T) {
	b := newTab[int]()
	for p := range uint64(5) {
		for i := range 200 {
			b.put(u64key(p*2), 0) // present and overwritten: a directory's own key
			b.put(pairKey(p*2, uint64(i*3)), int(p)*1000+i*3)
		}
	}
	b.commit()
	collect := func(it *btIter[int]) (got []int) {
		for _, v, ok := it.Next(); ok; _, v, ok = it.Next() {
			got = append(got, v)
		}
		return got
	}
	tests := []struct {
		name string
		seek func(it *btIter[int])
		want func() []int
	}{
		{"prefix", func(it *btIter[int]) { it.SeekPrefix(u64key(4)) }, func() (w []int) {
			w = append(w, 0)
			for i := range 200 {
				w = append(w, 2000+i*3)
			}
			return w
		}},
		{"absent prefix", func(it *btIter[int]) { it.SeekPrefix(u64key(3)) }, func() []int { return nil }},
		{"lower bound between keys", func(it *btIter[int]) { it.SeekLowerBound(pairKey(8, 500)) }, func() (w []int) {
			for i := 501; i < 600; i += 3 {
				w = append(w, 4000+i)
			}
			return w
		}},
		{"lower bound past the end", func(it *btIter[int]) { it.SeekLowerBound(u64key(9)) }, func() []int { return nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			it := b.root().Iterator()
			tc.seek(it)
			require.Equal(t, tc.want(), collect(it))
		})
	}
	var walked []int
	b.root().WalkPrefix(u64key(2), func(_ []byte, v int) bool {
		walked = append(walked, v)
		return len(walked) == 3
	})
	require.Equal(t, []int{0, 1000, 1003}, walked)
	require.Len(t, collect(b.root().Iterator()), 5*201)
	empty := newTab[int]()
	require.Empty(t, collect(empty.root().Iterator()))
}

// TestTabWalkWhileChanging deletes every entry from inside a walk of the
// same tab, as a command closing all of a session's handles does: the
// walk sees the tree as it was when it began.
func TestTabWalkWhileChanging(t *testing.T) {
	b := newTab[int]()
	for i := range 1000 {
		b.put(u64key(uint64(i)), i)
	}
	seen := 0
	b.root().Walk(func(k []byte, v int) bool {
		require.Equal(t, seen, v)
		seen++
		b.del(k)
		b.put(u64key(uint64(v+5000)), v)
		return false
	})
	require.Equal(t, 1000, seen)
	require.Equal(t, 1000, b.len())
	_, ok := b.get(u64key(0))
	require.False(t, ok)
}

func TestTabDelPrefix(t *testing.T) {
	b := newTab[int]()
	m := &model{vals: map[string]int{}}
	for p := range uint64(3) {
		for i := range uint64(500) {
			b.put(pairKey(p, i), int(i))
			if p != 1 {
				m.put(string(pairKey(p, i)), int(i))
			}
		}
	}
	b.delPrefix(u64key(1))
	checkTree(t, b, m)
}
