package fsops

import (
	"container/list"
	"sort"
	"sync"
)

// The data cache. File data the mount has fetched stays in memory, in the
// aligned windows readahead fetches, so that a later read of the same bytes,
// through any handle and after the file was closed and opened again, is
// answered without a round trip to the cluster. It is the mount's own page
// cache, beside the kernel's, and it lives by the same rule: it may only
// serve data other handles did not fetch themselves while the change stream
// is open (Options.DataCache > 0 and ClientOps.watching), because only the
// stream's events tell it that another client changed a file. Each event,
// and each commit of a write or truncate through this mount, drops the
// inode's windows (dropWindows); a fetch that was in flight then is marked
// stale and never served. When the stream closes or restarts, everything is
// dropped.
//
// A handle may always read the windows it fetched itself: that is
// readahead, as it was before windows outlived their handle.
//
// The cache holds at most its limit in bytes of window data, least
// recently used first out. Fetches that are still in flight count a full
// window.

// minCacheBytes is the room readahead needs even with the cache off:
// raMaxAlive windows for a few sequential readers at once.
const minCacheBytes = 4 * raMaxAlive * raWindow

// window is one fetched (or being fetched) aligned range of a file.
type window struct {
	ino  uint64
	off  int64
	by   uint64        // the handle whose read started the fetch
	held bool          // the fetch began under a capability (or none are used)
	done chan struct{} // closed once data and err are set
	data []byte        // shorter than raWindow at the end of the file
	err  error

	stale bool          // guarded by dataCache.mu: dropped while fetched or kept
	elem  *list.Element // guarded by dataCache.mu: nil once out of the cache
	cost  int64         // guarded by dataCache.mu: bytes counted against the limit
}

// short reports whether w is fetched and holds less than a whole window:
// the end of the file.
func (w *window) short() bool {
	select {
	case <-w.done:
		return w.err == nil && len(w.data) < raWindow
	default:
		return false
	}
}

// dataCache is the mount-wide set of windows; safe for concurrent use.
type dataCache struct {
	mu    sync.Mutex
	limit int64
	used  int64                        // guarded by mu
	lru   list.List                    // guarded by mu: *window, most recent first
	inos  map[uint64]map[int64]*window // guarded by mu
}

func newDataCache(limit int64) *dataCache {
	return &dataCache{limit: max(limit, minCacheBytes), inos: map[uint64]map[int64]*window{}}
}

// lookup returns the window of ino at off and marks it recently used, or
// nil.
func (c *dataCache) lookup(ino uint64, off int64) *window {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.inos[ino][off]
	if w != nil {
		c.lru.MoveToFront(w.elem)
	}
	return w
}

// window returns ino's window at off for handle by; when there is none
// that by may read (see usable) it adds one and calls fetch(w) in a new
// goroutine, which must set w.data and w.err, and reports that it did.
// held, called under the cache's lock once the window can be found and
// dropped, says whether ino's capability covers the fetch: a recall after
// it drops the window, and one before it left held false.
func (c *dataCache) window(ino uint64, off int64, by uint64, shared bool, held func() bool, fetch func(w *window)) (*window, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.inos[ino][off]; w != nil {
		if w.held && (shared || w.by == by) {
			c.lru.MoveToFront(w.elem)
			return w, false
		}
		c.removeLocked(w) // one this handle may not read
	}
	w := &window{ino: ino, off: off, by: by, done: make(chan struct{}), cost: raWindow}
	if c.inos[ino] == nil {
		c.inos[ino] = map[int64]*window{}
	}
	c.inos[ino][off] = w
	w.elem = c.lru.PushFront(w)
	w.held = held()
	c.used += w.cost
	c.evictLocked()
	go func() {
		fetch(w)
		c.settle(w)
		close(w.done)
	}()
	return w, true
}

// settle trims a fetched window to its data and counts what it keeps.
func (c *dataCache) settle(w *window) {
	if w.err == nil && cap(w.data) > 2*len(w.data) {
		// Short (the end of a file): do not keep a whole window's buffer.
		w.data = append([]byte(nil), w.data...)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.elem == nil {
		return
	}
	if w.err != nil {
		c.removeLocked(w)
		return
	}
	c.used += int64(cap(w.data)) - w.cost
	w.cost = int64(cap(w.data))
	c.evictLocked()
}

// usable reports whether w may answer a read through handle: it is not
// stale, its fetch succeeded, and it is the read's own (mine), or it was
// fetched under a capability and it is that handle's own or shared windows
// may be served. A window fetched without a capability answers only the
// read that fetched it: another client may have written since, and only a
// read that goes to the cluster makes it commit first.
func (c *dataCache) usable(w *window, handle uint64, shared, mine bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !w.stale && w.err == nil && (mine || w.held && (shared || w.by == handle))
}

// drop forgets ino's windows; those still being fetched are never served.
func (c *dataCache) drop(ino uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.inos[ino] {
		c.removeLocked(w)
		w.stale = true
	}
}

// dropRange forgets ino's windows that a write of [off, end) made stale:
// those it overlaps, and those that held less than a window (the end of
// the file, or still being fetched) before end, into which the write may
// have extended the file.
func (c *dataCache) dropRange(ino uint64, off, end int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.inos[ino] {
		overlaps := w.off < end && off < w.off+raWindow
		var held int64 // 0 while being fetched
		select {
		case <-w.done:
			held = int64(len(w.data))
		default:
		}
		if overlaps || held < raWindow && w.off+held < end {
			c.removeLocked(w)
			w.stale = true
		}
	}
}

// put keeps data as ino's window at off (aligned), fetched already: what
// this mount itself just committed there. Only shared use may read it.
func (c *dataCache) put(ino uint64, off int64, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.inos[ino][off]; old != nil {
		c.removeLocked(old)
		old.stale = true
	}
	w := &window{ino: ino, off: off, held: true, done: make(chan struct{}), data: data, cost: int64(len(data))}
	close(w.done)
	if c.inos[ino] == nil {
		c.inos[ino] = map[int64]*window{}
	}
	c.inos[ino][off] = w
	w.elem = c.lru.PushFront(w)
	c.used += w.cost
	c.evictLocked()
}

// clear drops every window.
func (c *dataCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ws := range c.inos {
		for _, w := range ws {
			c.removeLocked(w)
			w.stale = true
		}
	}
}

// bytes is the window data held (in flight counted whole).
func (c *dataCache) bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// starts lists the window offsets held for ino, in order (tests).
func (c *dataCache) starts(ino uint64) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s []int64
	for off := range c.inos[ino] {
		s = append(s, off)
	}
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// evictLocked removes least recently used windows until the cache is
// within its limit. A reader already holding an evicted window still
// reads it; it is only no longer found.
func (c *dataCache) evictLocked() {
	for c.used > c.limit && c.lru.Len() > 1 {
		c.removeLocked(c.lru.Back().Value.(*window))
	}
}

func (c *dataCache) removeLocked(w *window) {
	if w.elem == nil {
		return
	}
	c.lru.Remove(w.elem)
	w.elem = nil
	c.used -= w.cost
	ws := c.inos[w.ino]
	delete(ws, w.off)
	if len(ws) == 0 {
		delete(c.inos, w.ino)
	}
}
