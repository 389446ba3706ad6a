package fsops

import (
	"sync"
	"time"
)

// capXattr is the xattr the kernel reads before every write(2) to a file
// through FUSE, to know whether the write must drop file capabilities.
const capXattr = "security.capability"

// capMissTTL is how long a file is remembered to have no capabilities.
// A capability another client sets is seen after at most this long (a
// setxattr through this mount is seen at once). Change events do not clear
// the entry: they do not say whether data or an xattr changed, and every
// commit of a file being written would otherwise cost a query again.
const capMissTTL = time.Second

// capMissCache remembers the inodes found without security.capability, so
// that a stream of small writes does not cost a query to the cluster each.
type capMissCache struct {
	mu sync.Mutex
	m  map[uint64]time.Time // guarded by mu: ino → when it was found missing
}

func (c *capMissCache) has(ino uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[ino]
	if ok && time.Since(t) > capMissTTL {
		delete(c.m, ino)
		return false
	}
	return ok
}

func (c *capMissCache) add(ino uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) > 1<<16 {
		clear(c.m) // bounded: an entry is only ever an optimisation
	}
	c.m[ino] = time.Now()
}

func (c *capMissCache) drop(ino uint64) {
	c.mu.Lock()
	delete(c.m, ino)
	c.mu.Unlock()
}
