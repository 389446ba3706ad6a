package fsops

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// The metadata cache. With capabilities (Options.Caps), the mount keeps
// the attributes, directory listings and symlink targets it read under a
// capability and answers lookup (of missing names too), getattr, readdir,
// readlink and the xattr calls of an inode with none from them, without a
// round trip, for as long as client.Caps.Held says the capability can be
// trusted. Nothing else may change a held inode: another session's change
// first recalls the capability, and the recall drops what is cached here
// (and in the kernel) before the capability goes back. What this mount
// changes itself is dropped around its own commands (forget), since the
// cluster does not recall a session's capabilities from itself.
//
// A fill (a query made to be kept) notes the cache's clock before it
// asks the cluster; it is kept only if nothing dropped its inode since, so
// an answer that raced a recall or a change of this mount is never kept.
//
// LOCK ORDERING: metaCache.mu is a leaf.

// maxFillEntries bounds the directories filled whole: a larger one is
// answered from the cluster as without capabilities.
const maxFillEntries = 1 << 15

// maxMetaInodes bounds the inodes cached; past it everything is dropped
// and the capabilities given back.
const maxMetaInodes = 1 << 18

type metaEntry struct {
	attr    Attr
	hasAttr bool
	// base: attr is what the cluster last said, and only write-behind
	// commits of this mount have been sent since (writingBase).
	base   bool
	xattrs int32 // xattrs the inode has; -1 unknown
	dir    *listing
	target string // symlinks: the target, when read
}

// listing is a directory's complete list of entries, in the cluster's
// (name) order.
type listing struct {
	parent uint64
	ents   []DirEntry
	byName map[string]int
	// missing holds names answered as missing, which a kernel that
	// caches negative entries may hold: a recall invalidates them too.
	missing map[string]struct{}
}

// maxMissing bounds the missing names remembered per directory.
const maxMissing = 4096

// names is every name the kernel may hold an entry of in this directory.
func (l *listing) names() []string {
	out := make([]string, 0, len(l.ents)+len(l.missing))
	for _, e := range l.ents {
		out = append(out, e.Name)
	}
	for n := range l.missing {
		out = append(out, n)
	}
	return out
}

// add puts ent in the listing (replacing an entry of its name).
func (l *listing) add(ent DirEntry) {
	if i, ok := l.byName[ent.Name]; ok {
		l.ents[i] = ent
		return
	}
	i, _ := slices.BinarySearchFunc(l.ents, ent.Name, func(e DirEntry, name string) int { return strings.Compare(e.Name, name) })
	l.ents = slices.Insert(l.ents, i, ent)
	l.reindex(i)
}

// remove takes name out of the listing.
func (l *listing) remove(name string) {
	i, ok := l.byName[name]
	if !ok {
		return
	}
	delete(l.byName, name)
	l.ents = slices.Delete(l.ents, i, i+1)
	l.reindex(i)
}

func (l *listing) reindex(from int) {
	for j := from; j < len(l.ents); j++ {
		l.byName[l.ents[j].Name] = j
	}
}

type metaCache struct {
	caps *client.Caps

	mu      sync.Mutex
	m       map[uint64]*metaEntry // guarded by mu
	clock   uint64                // guarded by mu: counts drops
	dropped map[uint64]uint64     // guarded by mu: ino → clock of its last drop
	lost    map[uint64]uint64     // guarded by mu: ino → clock of its last forget (a recall, a name change)
	writer  map[uint64]writer     // guarded by mu: ino → who began its latest commits
	// changing counts this mount's commands in flight that change a
	// directory's entries: the cluster may have applied one before its
	// answer comes and the listing is edited, so meanwhile the listing is
	// neither answered from nor filled (changes).
	changing map[uint64]int // guarded by mu
	// overlapped marks directories two of whose changes were in flight
	// at once: their answers may come in another order than the cluster
	// applied them, so the edits cannot be trusted and the listing is
	// dropped when the last ends.
	overlapped map[uint64]bool // guarded by mu
	floor      uint64          // guarded by mu: fills older than this are refused

	fillMu  sync.Mutex
	filling map[uint64]chan struct{} // guarded by fillMu: directory fills in flight
}

func newMetaCache(caps *client.Caps) *metaCache {
	return &metaCache{caps: caps, m: map[uint64]*metaEntry{}, dropped: map[uint64]uint64{}, lost: map[uint64]uint64{},
		writer: map[uint64]writer{}, changing: map[uint64]int{}, overlapped: map[uint64]bool{},
		filling: map[uint64]chan struct{}{}}
}

// on reports whether the cache is in use.
func (c *metaCache) on() bool { return c != nil }

// now returns the clock a fill notes before asking the cluster.
func (c *metaCache) now() uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clock
}

// keepable reports whether a fill begun at start may keep what it read of
// ino. Called with mu held.
func (c *metaCache) keepable(ino, start uint64) bool {
	_, committing := c.writer[ino]
	return start >= c.floor && c.dropped[ino] <= start && c.changing[ino] == 0 && !committing && c.caps.Held(ino)
}

// changes begins a command of this mount that changes the entries of
// dirs. Until the function it returns is called, once the listings were
// edited with the command's outcome, they are not answered from: another
// client may already have seen the change. Fills begun before that call
// are refused.
func (c *metaCache) changes(dirs ...uint64) (done func()) {
	if c == nil {
		return func() {}
	}
	if len(dirs) == 2 && dirs[0] == dirs[1] {
		dirs = dirs[:1] // a rename within one directory is one change of it
	}
	c.mu.Lock()
	for _, d := range dirs {
		if c.changing[d] > 0 {
			c.overlapped[d] = true
		}
		c.changing[d]++
	}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.clock++
		for _, d := range dirs {
			c.dropped[d] = c.clock
			if c.changing[d]--; c.changing[d] > 0 {
				continue
			}
			delete(c.changing, d)
			if c.overlapped[d] {
				delete(c.overlapped, d)
				if e := c.m[d]; e != nil {
					e.dir = nil
				}
			}
		}
	}
}

func (c *metaCache) entryLocked(ino uint64) *metaEntry {
	e := c.m[ino]
	if e == nil {
		e = &metaEntry{xattrs: -1}
		c.m[ino] = e
	}
	return e
}

// putAttr keeps a of a fill begun at start.
func (c *metaCache) putAttr(a *pb.Attr, start uint64) {
	if c == nil || a == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putAttrLocked(a, start)
}

func (c *metaCache) putAttrLocked(a *pb.Attr, start uint64) {
	if !c.keepable(a.GetIno(), start) {
		return
	}
	c.setAttrLocked(a)
}

// setAttrLocked keeps a unless the entry holds newer attributes: a later
// change time, or the same one and a larger size (writes in one log entry
// share its time and only extend the file). A base counts too: commits of
// one handle that overlap may answer in another order than the cluster
// applied them, and one begun meanwhile has dropped the attributes to the
// base, which the older answer must not replace.
func (c *metaCache) setAttrLocked(a *pb.Attr) {
	e := c.entryLocked(a.GetIno())
	if (e.hasAttr || e.base) && (a.GetCtimeNs() < e.attr.Ctime.UnixNano() ||
		a.GetCtimeNs() == e.attr.Ctime.UnixNano() && a.GetSize() < e.attr.Size) {
		return
	}
	e.attr, e.hasAttr = attrOf(a), true
	e.xattrs = -1
	if a.Xattrs != nil {
		e.xattrs = int32(*a.Xattrs)
	}
}

// commit begins a command of this mount that changes ino's attributes:
// fills in flight are refused from now on, and committed keeps the
// command's result.
func (c *metaCache) commit(ino uint64) uint64 { return c.commitBy(ino, 0) }

// writer is the handle whose commits of an inode follow each other
// without another's in between, since clock since, and how many commits
// of other handles (or other commands) are in flight.
type writer struct {
	handle, since uint64
	busy          int // commits of handle in flight
	others        int // commits of others in flight
}

// commitBy is commit for a write-behind commit through handle (0: any
// other command).
func (c *metaCache) commitBy(ino, handle uint64) uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ino]
	base := handle != 0 && e != nil && (e.hasAttr || e.base)
	c.forgetAttrLocked(ino)
	if base {
		e.base = true
	}
	w, ok := c.writer[ino]
	if !ok || w.handle != handle || handle == 0 {
		w.others += w.busy
		w.handle, w.since, w.busy = handle, c.clock, 0
	}
	w.busy++
	c.writer[ino] = w
	return c.clock
}

// writingBase returns the attributes the cluster last gave for ino, which
// this mount holds exclusively, when nothing but write-behind commits of
// one handle of this mount was sent since: what they change (size, times)
// the caller knows better (ClientOps.writtenAttr).
func (c *metaCache) writingBase(ino uint64) (Attr, bool) {
	if c == nil || !c.caps.HeldExclusive(ino) {
		return Attr{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ino]
	if e == nil || !e.hasAttr && !e.base {
		return Attr{}, false
	}
	if w, ok := c.writer[ino]; ok && (w.others > 0 || w.handle == 0) {
		return Attr{}, false
	}
	a := e.attr
	a.Valid = 0
	return a, true
}

// committed keeps the attributes a command on ino begun at start
// (commit) returned (nil: it failed): results of this mount's commands
// that finish out of order are ordered by setAttrLocked's rule. When the
// inode was recalled or renamed since, what is cached of it may have been
// read before the command applied (a fill after the recall), so it is
// dropped instead.
func (c *metaCache) committed(ino uint64, a *pb.Attr, start uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endCommitLocked(ino, start)
	if a != nil && a.GetIno() == ino && start >= c.floor && c.lost[ino] <= start && c.caps.Held(ino) {
		c.setAttrLocked(a)
		return
	}
	c.forgetAttrLocked(ino)
}

// endCommitLocked counts a commit begun at start out of its writer.
func (c *metaCache) endCommitLocked(ino, start uint64) {
	w, ok := c.writer[ino]
	if !ok {
		return
	}
	if start >= w.since && w.busy > 0 {
		w.busy--
	} else if w.others > 0 {
		w.others--
	}
	if w.busy == 0 && w.others == 0 {
		delete(c.writer, ino)
		return
	}
	c.writer[ino] = w
}

// whileUnchanged calls fn, holding the cache's lock, if ino's capability
// holds and no recall or name change dropped it since start: a recall
// that comes later drops whatever fn kept (it forgets under the same
// lock before it drops anything else). fn gets the newest size this
// mount's commits of ino returned so far (0 when none is kept), and
// whether the caller's commit is the only one of the handle in flight.
func (c *metaCache) whileUnchanged(ino, handle, start uint64, fn func(size uint64, alone bool)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.writer[ino]
	if ok && start >= c.floor && c.lost[ino] <= start && c.caps.Held(ino) && w.handle == handle && w.since <= start && w.others == 0 {
		var size uint64
		if e := c.m[ino]; e != nil && e.hasAttr {
			size = e.attr.Size
		}
		fn(size, w.busy == 1)
	}
}

// attr returns ino's cached attributes while its capability holds.
func (c *metaCache) attr(ino uint64) (Attr, bool) {
	if c == nil || !c.caps.Held(ino) {
		return Attr{}, false
	}
	valid := c.caps.TrustedFor()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ino]
	if _, committing := c.writer[ino]; e == nil || !e.hasAttr || valid <= 0 || committing {
		// While a command of this mount changes ino, the cluster may
		// have applied it already: its result (committed) comes first.
		return Attr{}, false
	}
	a := e.attr
	a.Valid = valid
	return a, true
}

// noXattrs reports whether ino is known, under its capability, to have no
// xattrs.
func (c *metaCache) noXattrs(ino uint64) bool {
	if c == nil || !c.caps.Held(ino) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ino]
	return e != nil && e.xattrs == 0
}

// lookup answers name in directory parent from its cached listing: the
// entry, or found false for a name the directory does not have. ok is
// false when the listing is not cached.
func (c *metaCache) lookup(parent uint64, name string) (ent DirEntry, found, ok bool) {
	return c.lookupWhile(parent, name, false)
}

// lookupWhile is lookup that, with changing, also answers while a change
// of this mount to parent is in flight: for the edit that ends it.
func (c *metaCache) lookupWhile(parent uint64, name string, changing bool) (ent DirEntry, found, ok bool) {
	if c == nil || !c.caps.Held(parent) {
		return DirEntry{}, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[parent]
	if e == nil || e.dir == nil || c.changing[parent] > 0 && !changing {
		return DirEntry{}, false, false
	}
	i, found := e.dir.byName[name]
	if !found {
		if len(e.dir.missing) < maxMissing {
			e.dir.missing[name] = struct{}{}
		}
		return DirEntry{}, false, true
	}
	return e.dir.ents[i], true, true
}

// list returns parent's cached listing ("." and ".." first).
func (c *metaCache) list(ino uint64) ([]DirEntry, bool) {
	if c == nil || !c.caps.Held(ino) {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ino]
	if e == nil || e.dir == nil || c.changing[ino] > 0 {
		return nil, false
	}
	out := make([]DirEntry, 0, len(e.dir.ents)+2)
	out = append(out,
		DirEntry{Name: ".", Ino: ino, Mode: syscall.S_IFDIR},
		DirEntry{Name: "..", Ino: e.dir.parent, Mode: syscall.S_IFDIR})
	return append(out, e.dir.ents...), true
}

// listed reports whether ino's listing is cached and how many entries it
// has ("." and ".." included) without copying it, as list would: buffered
// operations ask before each change, and a copy would make every change
// in a directory cost the directory's size.
func (c *metaCache) listed(ino uint64) (n int, ok bool) {
	if c == nil || !c.caps.Held(ino) {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ino]
	if e == nil || e.dir == nil || c.changing[ino] > 0 {
		return 0, false
	}
	return len(e.dir.ents) + 2, true
}

// target returns a symlink's cached target.
func (c *metaCache) target(ino uint64) (string, bool) {
	if c == nil || !c.caps.Held(ino) {
		return "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ino]
	if e == nil || e.target == "" {
		return "", false
	}
	return e.target, true
}

func (c *metaCache) putTarget(ino uint64, target string, start uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keepable(ino, start) && target != "" {
		c.entryLocked(ino).target = target
	}
}

// forget drops what is cached of inos: their attributes, listings and
// targets. It returns the names of the listings dropped, by directory.
func (c *metaCache) forget(inos ...uint64) map[uint64][]string {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clock++
	var names map[uint64][]string
	for _, ino := range inos {
		if e := c.m[ino]; e != nil && e.dir != nil {
			if names == nil {
				names = map[uint64][]string{}
			}
			names[ino] = e.dir.names()
		}
		delete(c.m, ino)
		c.dropped[ino] = c.clock
		c.lost[ino] = c.clock
	}
	if len(c.dropped) > maxMetaInodes {
		clear(c.dropped)
		clear(c.lost)
		clear(c.writer)
		c.floor = c.clock + 1
	}
	return names
}

// forgetAttr drops ino's attributes (and refuses fills in flight) but
// keeps its listing: for a change of this mount's that edits the listing
// itself (edit), or that changes attributes only.
func (c *metaCache) forgetAttr(inos ...uint64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetAttrLocked(inos...)
}

func (c *metaCache) forgetAttrLocked(inos ...uint64) {
	c.clock++
	for _, ino := range inos {
		if e := c.m[ino]; e != nil {
			e.hasAttr, e.base, e.xattrs = false, false, -1
		}
		c.dropped[ino] = c.clock
	}
}

// edit applies a change this mount made to directory dir's listing, when
// it is cached, and drops dir's attributes (its times changed). The
// capability on dir guarantees that nobody else changed the listing, so
// the edited listing is the cluster's.
func (c *metaCache) edit(dir uint64, fn func(l *listing)) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetAttrLocked(dir)
	if e := c.m[dir]; e != nil && e.dir != nil {
		fn(e.dir)
	}
}

// forgetAll drops everything.
func (c *metaCache) forgetAll() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clock++
	clear(c.m)
	clear(c.dropped)
	clear(c.lost)
	clear(c.writer)
	c.floor = c.clock + 1
}

// fillDir reads directory ino whole under capabilities on it and its
// entries, and keeps the listing and the entries' attributes. Concurrent
// fills of one directory wait for the first.
func (o *ClientOps) fillDir(ctx context.Context, ino uint64) {
	c := o.meta
	c.fillMu.Lock()
	if ch, ok := c.filling[ino]; ok {
		c.fillMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		return
	}
	ch := make(chan struct{})
	c.filling[ino] = ch
	c.fillMu.Unlock()
	defer func() {
		c.fillMu.Lock()
		delete(c.filling, ino)
		c.fillMu.Unlock()
		close(ch)
	}()

	start := c.now()
	if _, err := c.caps.Grant(ctx, []uint64{ino}, true); err != nil {
		return // answered from the cluster instead
	}
	// Right after the mount started, the first renewal may not have been
	// seen on the change stream yet.
	c.caps.WaitTrusted(ctx, 100*time.Millisecond)
	des, err := o.c.ReadDirPlusIno(ctx, ino)
	if err != nil || len(des) > maxFillEntries {
		return
	}
	parent, err := o.parentOf(ctx, ino)
	if err != nil {
		return
	}
	l := &listing{parent: parent, ents: make([]DirEntry, 0, len(des)), byName: make(map[string]int, len(des)), missing: map[string]struct{}{}}
	for _, d := range des {
		l.byName[d.GetName()] = len(l.ents)
		l.ents = append(l.ents, DirEntry{Name: d.GetName(), Ino: d.GetIno(), Mode: d.GetMode()})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.keepable(ino, start) {
		return
	}
	c.entryLocked(ino).dir = l
	for _, d := range des {
		if d.GetAttr() != nil {
			c.putAttrLocked(d.GetAttr(), start)
		}
	}
	if len(c.m) > maxMetaInodes {
		go o.meta.shed()
	}
}

// shed drops the whole cache and gives its capabilities back, when it
// outgrew maxMetaInodes.
func (c *metaCache) shed() {
	c.mu.Lock()
	inos := slices.Collect(maps.Keys(c.m))
	c.mu.Unlock()
	c.forgetAll()
	c.caps.Release(inos...)
}

// grantOne asks for a capability on ino alone, for an inode reached
// without its directory's listing (the root, or a handle's inode).
func (o *ClientOps) grantOne(ctx context.Context, ino uint64) {
	if o.meta.on() && !o.meta.caps.Held(ino) {
		_, _ = o.meta.caps.Grant(ctx, []uint64{ino}, false)
	}
}

// localEdit changes the cache for an operation this mount answered
// itself (buffered.go): what it sets is what the cluster will hold once
// the operation commits.
type localEdit struct {
	c *metaCache
}

// attr returns ino's cached attributes to change in place. When they were
// dropped since the operation was decided, the change goes to a copy that
// is thrown away: a later answer comes from the cluster, after the
// journal.
func (l localEdit) attr(ino uint64) *Attr {
	l.c.dropped[ino] = l.c.clock
	if e := l.c.m[ino]; e != nil && e.hasAttr {
		return &e.attr
	}
	return &Attr{}
}

// list returns ino's cached listing, or, as attr, a copy thrown away.
func (l localEdit) list(ino uint64) *listing {
	l.c.dropped[ino] = l.c.clock
	if e := l.c.m[ino]; e != nil && e.dir != nil {
		return e.dir
	}
	return &listing{byName: map[string]int{}, missing: map[string]struct{}{}}
}

// put sets a's inode's attributes.
func (l localEdit) put(a Attr) {
	l.c.dropped[a.Ino] = l.c.clock
	e := l.c.entryLocked(a.Ino)
	if !e.hasAttr {
		e.xattrs = 0 // a new inode
	}
	a.Valid = 0
	e.attr, e.hasAttr = a, true
}

// newDir caches the empty listing of a directory just made in parent.
func (l localEdit) newDir(ino, parent uint64) {
	l.c.entryLocked(ino).dir = &listing{parent: parent, byName: map[string]int{}, missing: map[string]struct{}{}}
}

// target caches a new symlink's target.
func (l localEdit) target(ino uint64, t string) { l.c.entryLocked(ino).target = t }

// drop forgets ino's attributes.
func (l localEdit) drop(ino uint64) { l.c.forgetAttrLocked(ino) }

// local runs fn on the cache under its lock. Fills begun before it are
// refused for the inodes fn touches.
func (c *metaCache) local(fn func(l localEdit)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clock++
	fn(localEdit{c: c})
}

// update keeps a, a committed result of an operation this mount answered
// itself, for an inode whose attributes are cached, unless they are newer
// (setAttrLocked's rule).
func (c *metaCache) update(a *pb.Attr) {
	if c == nil || a == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.m[a.GetIno()]; e != nil && e.hasAttr {
		c.setAttrLocked(a)
	}
}
