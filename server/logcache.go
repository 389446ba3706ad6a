package server

import (
	"sync"

	"github.com/hashicorp/raft"
)

// logCache keeps the most recent log entries in memory in front of the log
// store, like raft.LogCache, but bounded in bytes as well as in entries:
// with entries of up to MaxBatchBytes, a cache of a fixed count would hold
// hundreds of MiB of file data on the heap of every node (docs/benchmarks.md,
// "Memory per stored byte"). A miss reads the store.
type logCache struct {
	raft.LogStore
	maxEntries, maxBytes int

	mu    sync.RWMutex
	byIdx map[uint64]*raft.Log
	order []uint64 // indexes, oldest first
	bytes int
}

func newLogCache(store raft.LogStore, maxEntries, maxBytes int) *logCache {
	return &logCache{LogStore: store, maxEntries: maxEntries, maxBytes: maxBytes, byIdx: map[uint64]*raft.Log{}}
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
	}
	for len(c.order) > 0 && (len(c.order) > c.maxEntries || c.bytes > c.maxBytes) {
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
	return nil
}

// DeleteRange empties the cache, as raft.LogCache does: it runs on log
// compaction and on a follower's conflicting suffix, both rare.
func (c *logCache) DeleteRange(lo, hi uint64) error {
	c.mu.Lock()
	c.byIdx, c.order, c.bytes = map[uint64]*raft.Log{}, nil, 0
	c.mu.Unlock()
	return c.LogStore.DeleteRange(lo, hi)
}
