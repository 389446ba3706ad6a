package fsm

import (
	"bytes"
	"slices"
	"sync/atomic"
)

// The state's tables are persistent B+trees: a published tree is never
// changed, and a change copies the nodes on the path to the key. A
// transaction changes the nodes it has already copied in place, so a
// command that creates a thousand files in one directory copies each leaf
// once, not once per file. Nodes hold up to btMax entries, so a key costs
// its share of a node instead of nodes of its own; that is what keeps an
// empty file's metadata small.
const (
	btMax = 32
	btMin = btMax / 4 // fewer entries and a node is merged with a neighbour
)

// btNode is a leaf (kids nil: keys and vals are the entries, ascending)
// or an inner node (vals nil). In an inner node keys[i], for i >= 1, is
// at most every key under kids[i] and more than every key under kids[i-1];
// keys[0] is not used to route.
type btNode[T any] struct {
	// owner is the transaction that created the node and may still change
	// it in place; a node of a committed transaction is never changed,
	// since transaction numbers are not reused.
	owner uint64
	keys  [][]byte
	vals  []T
	kids  []*btNode[T]
}

func (n *btNode[T]) leaf() bool { return n.kids == nil }

// lastTxn numbers transactions across all trees, so that no transaction
// can mistake another's nodes for its own (a savepoint's copy of a tree
// and the tree it continues as, say). The numbers never reach the state's
// content.
var lastTxn atomic.Uint64

// tab is one persistent tree: keys are byte strings in bytewise order.
// The published state holds tabs with no transaction open; Apply works on
// a copy whose tabs open one at their first change. A tab keeps the key
// slices it is given: callers pass ones they no longer change.
type tab[T any] struct {
	top   *btNode[T]
	n     int
	owner uint64 // the open transaction; 0: none
}

func newTab[T any]() tab[T] { return tab[T]{} }

func (b *tab[T]) len() int { return b.n }

// commit ends the transaction: the nodes it made are final from here on.
func (b *tab[T]) commit() { b.owner = 0 }

// root returns the tree as it is now. It commits first, so that changes
// made while a caller walks it (a walk that closes handles, say) copy
// nodes instead of changing the ones being walked.
func (b *tab[T]) root() btree[T] {
	if b.owner != 0 { // never written in a published state, which others read
		b.commit()
	}
	return btree[T]{b.top}
}

// childIndex is the child of inner node n whose subtree holds k.
func (n *btNode[T]) childIndex(k []byte) int {
	return upperBound(n.keys[1:], k) // the number of keys[1:] <= k
}

func (n *btNode[T]) find(k []byte) (int, bool) {
	i := lowerBound(n.keys, k)
	return i, i < len(n.keys) && bytes.Equal(n.keys[i], k)
}

// lowerBound and upperBound are binary searches written out rather than
// slices.BinarySearchFunc, through which the key escapes: every lookup
// by a key on the stack would allocate.

// lowerBound is the index of the first of keys at or above k.
func lowerBound(keys [][]byte, k []byte) int {
	lo, hi := 0, len(keys)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if bytes.Compare(keys[m], k) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// upperBound is the index of the first of keys above k.
func upperBound(keys [][]byte, k []byte) int {
	lo, hi := 0, len(keys)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if bytes.Compare(keys[m], k) <= 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func (b *tab[T]) get(k []byte) (T, bool) {
	n := b.top
	if n == nil {
		var zero T
		return zero, false
	}
	for !n.leaf() {
		n = n.kids[n.childIndex(k)]
	}
	if i, ok := n.find(k); ok {
		return n.vals[i], true
	}
	var zero T
	return zero, false
}

// mut returns n if the open transaction may change it, else a copy that
// it may, with room for one more entry.
func (b *tab[T]) mut(n *btNode[T]) *btNode[T] {
	if b.owner == 0 {
		b.owner = lastTxn.Add(1)
	}
	if n.owner == b.owner {
		return n
	}
	c := &btNode[T]{owner: b.owner, keys: grow(n.keys)}
	if n.leaf() {
		c.vals = grow(n.vals)
	} else {
		c.kids = grow(n.kids)
	}
	return c
}

func grow[E any](s []E) []E {
	return append(make([]E, 0, min(len(s)+1, btMax+1)), s...)
}

func (b *tab[T]) put(k []byte, v T) {
	if b.top == nil {
		b.top = b.mut(&btNode[T]{keys: [][]byte{}, vals: []T{}})
	}
	top := b.mut(b.top)
	right, added := b.insert(top, k, v)
	if right != nil {
		top = &btNode[T]{owner: b.owner, keys: [][]byte{top.keys[0], right.keys[0]}, kids: []*btNode[T]{top, right}}
	}
	b.top = top
	if added {
		b.n++
	}
}

// insert puts k in the subtree of n, which the transaction may change,
// and returns the new right half if n split.
func (b *tab[T]) insert(n *btNode[T], k []byte, v T) (right *btNode[T], added bool) {
	var i int
	if n.leaf() {
		var found bool
		if i, found = n.find(k); found {
			n.vals[i] = v
			return nil, false
		}
		n.keys = slices.Insert(n.keys, i, k)
		n.vals = slices.Insert(n.vals, i, v)
		added = true
	} else {
		i = n.childIndex(k)
		c := b.mut(n.kids[i])
		n.kids[i] = c
		var r *btNode[T]
		if r, added = b.insert(c, k, v); r == nil {
			return nil, added
		}
		i++
		n.keys = slices.Insert(n.keys, i, r.keys[0])
		n.kids = slices.Insert(n.kids, i, r)
	}
	if len(n.keys) <= btMax {
		return nil, added
	}
	// Keys mostly come in ascending order (inode numbers, a restore):
	// then the left half stays full instead of half empty.
	at := len(n.keys) / 2
	if i == len(n.keys)-1 {
		at = btMax
	}
	right = &btNode[T]{owner: b.owner, keys: slices.Clone(n.keys[at:])}
	clear(n.keys[at:])
	n.keys = n.keys[:at]
	if n.leaf() {
		right.vals = slices.Clone(n.vals[at:])
		clear(n.vals[at:])
		n.vals = n.vals[:at]
	} else {
		right.kids = slices.Clone(n.kids[at:])
		clear(n.kids[at:])
		n.kids = n.kids[:at]
	}
	return right, added
}

func (b *tab[T]) del(k []byte) {
	if _, ok := b.get(k); !ok {
		return // nothing copied for a key that is not there
	}
	top := b.mut(b.top)
	b.remove(top, k)
	b.n--
	switch {
	case len(top.keys) == 0:
		top = nil
	case !top.leaf() && len(top.kids) == 1:
		top = top.kids[0]
	}
	b.top = top
}

// remove deletes k, which is present, from the subtree of n, which the
// transaction may change.
func (b *tab[T]) remove(n *btNode[T], k []byte) {
	if n.leaf() {
		i, _ := n.find(k)
		n.keys = slices.Delete(n.keys, i, i+1)
		n.vals = slices.Delete(n.vals, i, i+1)
		return
	}
	i := n.childIndex(k)
	c := b.mut(n.kids[i])
	n.kids[i] = c
	b.remove(c, k)
	if len(c.keys) < btMin && len(n.kids) > 1 {
		b.rebalance(n, max(i, 1))
	}
}

// rebalance merges kids[i-1] and kids[i] of n, or shares their entries
// evenly if they do not fit in one node.
func (b *tab[T]) rebalance(n *btNode[T], i int) {
	l, r := n.kids[i-1], n.kids[i]
	keys := make([][]byte, 0, len(l.keys)+len(r.keys))
	keys = append(keys, l.keys...)
	if l.leaf() {
		keys = append(keys, r.keys...)
	} else {
		// r's keys[0] does not route; the separator in n does.
		keys = append(append(keys, n.keys[i]), r.keys[1:]...)
	}
	vals := slices.Concat(l.vals, r.vals)
	kids := slices.Concat(l.kids, r.kids)
	if len(keys) <= btMax {
		n.kids[i-1] = &btNode[T]{owner: b.owner, keys: keys, vals: vals, kids: kids}
		n.keys = slices.Delete(n.keys, i, i+1)
		n.kids = slices.Delete(n.kids, i, i+1)
		return
	}
	at := len(keys) / 2
	nl := &btNode[T]{owner: b.owner, keys: slices.Clone(keys[:at])}
	nr := &btNode[T]{owner: b.owner, keys: keys[at:]}
	if l.leaf() {
		nl.vals, nr.vals = slices.Clone(vals[:at]), vals[at:]
	} else {
		nl.kids, nr.kids = slices.Clone(kids[:at]), kids[at:]
	}
	n.kids[i-1], n.kids[i] = nl, nr
	n.keys[i] = keys[at]
}

// delPrefix deletes every key starting with p.
func (b *tab[T]) delPrefix(p []byte) {
	var keys [][]byte
	it := b.root().Iterator()
	it.SeekPrefix(p)
	for k, _, ok := it.Next(); ok; k, _, ok = it.Next() {
		keys = append(keys, k)
	}
	for _, k := range keys {
		b.del(k)
	}
}

// btree is one version of a tab's tree, to read.
type btree[T any] struct{ top *btNode[T] }

// Walk calls fn for every entry in key order until fn returns true. The
// key is the tree's: fn must not change it.
func (t btree[T]) Walk(fn func(k []byte, v T) bool) {
	if t.top != nil {
		t.top.walk(fn)
	}
}

func (n *btNode[T]) walk(fn func(k []byte, v T) bool) bool {
	if n.leaf() {
		for i, k := range n.keys {
			if fn(k, n.vals[i]) {
				return true
			}
		}
		return false
	}
	for _, c := range n.kids {
		if c.walk(fn) {
			return true
		}
	}
	return false
}

// WalkPrefix is Walk over the keys starting with p.
func (t btree[T]) WalkPrefix(p []byte, fn func(k []byte, v T) bool) {
	it := t.Iterator()
	it.SeekPrefix(p)
	for k, v, ok := it.Next(); ok; k, v, ok = it.Next() {
		if fn(k, v) {
			return
		}
	}
}

// Iterator returns an iterator at the tree's first key.
func (t btree[T]) Iterator() *btIter[T] { return &btIter[T]{top: t.top} }

// btIter walks a tree in key order from where it was sought.
type btIter[T any] struct {
	top    *btNode[T]
	path   []btPos[T] // from the top to the leaf of the next entry
	prefix []byte     // stop at the first key without it
	sought bool
}

type btPos[T any] struct {
	n *btNode[T]
	i int
}

// SeekLowerBound moves to the first key at or above k.
func (it *btIter[T]) SeekLowerBound(k []byte) {
	it.sought, it.prefix, it.path = true, nil, it.path[:0]
	n := it.top
	if n == nil {
		return
	}
	for !n.leaf() {
		i := n.childIndex(k)
		it.path = append(it.path, btPos[T]{n, i})
		n = n.kids[i]
	}
	i, _ := n.find(k)
	it.path = append(it.path, btPos[T]{n, i})
}

// SeekPrefix moves to the first key starting with p and ends the
// iteration at the first key that does not.
func (it *btIter[T]) SeekPrefix(p []byte) {
	it.SeekLowerBound(p)
	it.prefix = p
}

// Next returns the next entry; ok is false when there is none.
func (it *btIter[T]) Next() (k []byte, v T, ok bool) {
	if !it.sought {
		it.SeekLowerBound(nil)
	}
	for len(it.path) > 0 {
		top := &it.path[len(it.path)-1]
		if top.n.leaf() {
			if top.i < len(top.n.keys) {
				k, v = top.n.keys[top.i], top.n.vals[top.i]
				top.i++
				if it.prefix != nil && !bytes.HasPrefix(k, it.prefix) {
					it.path = it.path[:0]
					break
				}
				return k, v, true
			}
			it.path = it.path[:len(it.path)-1]
			continue
		}
		// An inner node: its child top.i is done; go down the next one.
		top.i++
		if top.i >= len(top.n.kids) {
			it.path = it.path[:len(it.path)-1]
			continue
		}
		for n := top.n.kids[top.i]; ; n = n.kids[0] {
			it.path = append(it.path, btPos[T]{n, 0})
			if n.leaf() {
				break
			}
		}
	}
	var zero T
	return nil, zero, false
}
