package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// logCache keeps the most recent log entries in memory in front of the log
// store, like raft.LogCache, but bounded in bytes as well as in entries:
// with entries of up to MaxBatchBytes, a cache of a fixed count would hold
// hundreds of MiB of file data on the heap of every node (docs/benchmarks.md,
// "Memory per stored byte"). A miss reads the store.
//
// The leader's replication and every node's state machine read an entry
// soon after it is stored, so the cache earns its bytes only while writes
// flow: then it holds up to maxBytes. Over a logCacheIdleAfter in which
// less than idleBytes arrived (ticks and the odd small command), it keeps
// only idleBytes, and runs onPause once for the pause: a node that has
// stopped writing does not go on holding its last writes twice.
type logCache struct {
	raft.LogStore
	maxEntries, maxBytes, idleBytes int
	onPause                         func()
	arrived                         atomic.Int64 // bytes stored since the last look

	mu    sync.RWMutex
	byIdx map[uint64]*raft.Log
	order []uint64 // indexes, oldest first
	bytes int
}

// logCacheIdleAfter is the window over which a log cache judges whether
// writes have paused.
const logCacheIdleAfter = 2 * time.Second

func newLogCache(store raft.LogStore, maxEntries, maxBytes, idleBytes int, onPause func()) *logCache {
	return &logCache{LogStore: store, maxEntries: maxEntries, maxBytes: maxBytes, idleBytes: min(idleBytes, maxBytes),
		onPause: onPause, byIdx: map[uint64]*raft.Log{}}
}

// watch looks every window whether writes have paused, until stop (which
// may be called more than once).
func (c *logCache) watch(window time.Duration) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(window)
		defer t.Stop()
		paused := false
		for {
			select {
			case <-t.C:
			case <-done:
				return
			}
			if c.arrived.Swap(0) >= int64(c.idleBytes) {
				paused = false
				continue
			}
			c.mu.Lock()
			c.evictLocked(c.idleBytes)
			c.mu.Unlock()
			if !paused && c.onPause != nil {
				c.onPause()
			}
			paused = true
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-exited
	}
}

func (c *logCache) GetLog(idx uint64, out *raft.Log) error {
	c.mu.RLock()
	l := c.byIdx[idx]
	c.mu.RUnlock()
	if l != nil {
		*out = *l
		return nil
	}
	return c.LogStore.GetLog(idx, out)
}

func (c *logCache) StoreLog(l *raft.Log) error { return c.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores logs, then caches them: a failed write caches nothing.
func (c *logCache) StoreLogs(logs []*raft.Log) error {
	if err := c.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range logs {
		if old := c.byIdx[l.Index]; old != nil {
			c.bytes -= len(old.Data) // rewritten: the old copy leaves with its index below
		} else {
			c.order = append(c.order, l.Index)
		}
		c.byIdx[l.Index] = l
		c.bytes += len(l.Data)
		c.arrived.Add(int64(len(l.Data)))
	}
	c.evictLocked(c.maxBytes)
	return nil
}

// evictLocked drops the oldest entries until at most maxEntries and
// maxBytes remain.
func (c *logCache) evictLocked(maxBytes int) {
	for len(c.order) > 0 && (len(c.order) > c.maxEntries || c.bytes > maxBytes) {
		idx := c.order[0]
		c.order = c.order[1:]
		if l := c.byIdx[idx]; l != nil {
			c.bytes -= len(l.Data)
			delete(c.byIdx, idx)
		}
	}
	if cap(c.order) > 4*c.maxEntries { // order's backing array only grows at its end
		c.order = append([]uint64(nil), c.order...)
	}
}

// DeleteRange empties the cache, as raft.LogCache does: it runs on log
// compaction and on a follower's conflicting suffix, both rare.
func (c *logCache) DeleteRange(lo, hi uint64) error {
	c.mu.Lock()
	c.byIdx, c.order, c.bytes = map[uint64]*raft.Log{}, nil, 0
	c.mu.Unlock()
	return c.LogStore.DeleteRange(lo, hi)
}
