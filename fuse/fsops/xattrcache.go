package fsops

import (
	"sync"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
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

// noXattrTTL bounds how long an inode the cluster reported without any
// xattr (pb.Attr.xattrs) is answered for without asking: the attribute
// timeout the kernel applies to the rest of its attributes. A change event
// naming the inode ends it sooner, and a setxattr through this mount at
// once.
const noXattrTTL = time.Second

// inoSet remembers inodes for a while: capMiss holds those found without
// security.capability, so that a stream of small writes does not cost a
// query to the cluster each; noXattrs those reported to have no xattr at
// all, so that `ls -l` (which reads security.selinux and the ACLs of every
// name) or `cp -a` costs no query per file.
type inoSet struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[uint64]time.Time // guarded by mu: ino → when it was added
}

func newInoSet(ttl time.Duration) *inoSet {
	return &inoSet{ttl: ttl, m: map[uint64]time.Time{}}
}

func (c *inoSet) has(ino uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[ino]
	if ok && time.Since(t) > c.ttl {
		delete(c.m, ino)
		return false
	}
	return ok
}

func (c *inoSet) add(ino uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) > 1<<16 {
		clear(c.m) // bounded: an entry is only ever an optimisation
	}
	c.m[ino] = time.Now()
}

func (c *inoSet) drop(ino uint64) {
	c.mu.Lock()
	delete(c.m, ino)
	c.mu.Unlock()
}

func (c *inoSet) clear() {
	c.mu.Lock()
	clear(c.m)
	c.mu.Unlock()
}

// seen records what attributes the cluster returned say about xattrs. A
// node that predates the count says nothing.
func (o *ClientOps) seen(a *pb.Attr) {
	if a != nil && a.Xattrs != nil && *a.Xattrs == 0 {
		o.noXattrs.add(a.GetIno())
	}
}

// forgetXattrs drops what this mount remembers of ino's xattrs: they are
// being changed through it. (A change event drops noXattrs only: events
// follow every commit of this mount's own writes, and capMiss exists so
// that those cost no query.)
func (o *ClientOps) forgetXattrs(ino uint64) {
	o.capMiss.drop(ino)
	o.noXattrs.drop(ino)
	o.meta.forgetAttr(ino)
}
