package region

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// Hash names a chunk's content: the SHA-256 of its bytes, as the cluster
// names blocks. The zero Hash stands for a hole (a chunk of zeros).
type Hash [sha256.Size]byte

// sum hashes a chunk's bytes; zeros are a hole, as the cluster stores them.
func sum(b []byte) Hash {
	if isZero(b) {
		return Hash{}
	}
	return sha256.Sum256(b)
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// Cache holds chunks by hash beyond one region: chunks another region of
// the process, or an earlier run, already has are not fetched again. Get
// copies the chunk into dst (a chunk-sized buffer) and reports whether it
// had it; it must check what it copies against the hash.
type Cache interface {
	Get(h Hash, dst []byte) bool
	Put(h Hash, data []byte)
}

// MemCache keeps up to max bytes of chunks in memory, dropping the
// oldest first.
func MemCache(max int64) Cache { return &memCache{max: max, m: map[Hash][]byte{}} }

type memCache struct {
	mu    sync.Mutex
	max   int64
	size  int64
	m     map[Hash][]byte
	order []Hash
}

func (c *memCache) Get(h Hash, dst []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[h]
	if ok {
		clear(dst[copy(dst, b):])
	}
	return ok
}

func (c *memCache) Put(h Hash, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[h]; ok || int64(len(data)) > c.max {
		return
	}
	for c.size+int64(len(data)) > c.max && len(c.order) > 0 {
		old := c.order[0]
		c.order = c.order[1:]
		c.size -= int64(len(c.m[old]))
		delete(c.m, old)
	}
	c.m[h] = slices.Clone(data)
	c.order = append(c.order, h)
	c.size += int64(len(data))
}

// DirCache keeps chunks as files named by their hash in dir, for later
// runs. A file whose content does not match its name is ignored.
func DirCache(dir string) (Cache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("region cache: %w", err)
	}
	return dirCache(dir), nil
}

type dirCache string

func (d dirCache) name(h Hash) string { return filepath.Join(string(d), hex.EncodeToString(h[:])) }

func (d dirCache) Get(h Hash, dst []byte) bool {
	b, err := os.ReadFile(d.name(h))
	if err != nil || len(b) > len(dst) || sha256.Sum256(b) != h {
		return false
	}
	clear(dst[copy(dst, b):])
	return true
}

func (d dirCache) Put(h Hash, data []byte) {
	name := d.name(h)
	if _, err := os.Stat(name); err == nil {
		return
	}
	tmp, err := os.CreateTemp(string(d), ".chunk-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr != nil || cerr != nil {
		_ = os.Remove(tmp.Name())
		return
	}
	_ = os.Rename(tmp.Name(), name) // a cache: a failure costs a fetch later
}

func sortStable(s []int, less func(x, y int) bool) {
	slices.SortStableFunc(s, func(x, y int) int {
		switch {
		case less(x, y):
			return -1
		case less(y, x):
			return 1
		}
		return 0
	})
}
