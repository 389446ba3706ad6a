package fsops

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Attribute-behind. A program that writes a file and then sets its times,
// owner and mode through the open descriptor (tar, cp -a, rsync, unzip:
// write, futimens, fchown, fchmod, close) made every call a Raft commit
// of its own, in series: the collected data, then one commit per SETATTR.
// Instead, while this mount has the file open, a SETATTR that only sets
// the mode, the owner or explicit times is held: it is merged with the
// ones held before it and answered at once with the attributes the file
// will have, and all of them go to the cluster as one command right after
// the file's collected data, at the latest when the descriptor is closed
// (FLUSH) or synced. tar's three calls per file become one commit.
//
// What keeps this correct:
//   - Only while a handle of this mount is open on the inode, so a FLUSH
//     or RELEASE always follows and commits it. fsync and close return
//     only once it is committed (like held writes, a failure is reported
//     there); another mount or client sees the change at the latest when
//     the writer closes the file (close-to-open consistency).
//   - Order is kept: held attributes are committed after the data
//     collected before them (barrier drains data first), and a write that
//     comes after them first commits them, so a later write still moves
//     the mtime past an explicit one.
//   - Never held: size changes, times set to "now" (the cluster's clock
//     decides them), and any change on a file whose mode has or gets the
//     set-user-ID or set-group-ID bit, whose clearing rules the answer
//     would have to predict.
//   - The answer is the cluster's current attributes (a linearizable
//     query, not a commit) with the held changes applied. The queried
//     attributes are reused for the next answers while the change stream
//     is received and names no change of the inode (dropWindows, called
//     for every change event and after every commit of this mount's
//     writes, bumps gen; so do this mount's unlinks, renames and links):
//     tar's three calls and the kernel's GETATTR between them cost one
//     query. GETATTR and LOOKUP of the inode answer the same way while
//     changes are held, as long as an explicit mtime is among them
//     (otherwise the commit of the collected data decides the mtime, and
//     they drain first, as before). ctime is this host's clock until the
//     commit sets the cluster's.
//
// LOCK ORDERING: attrState.mu before ClientOps.filesMu (and what follows
// it in writebehind.go). attrState.mu is held across the commit, so the
// held changes of one inode reach the cluster in order.

// attrState is the held attribute changes of one inode.
type attrState struct {
	mu   sync.Mutex // held across the commit RPC
	held SetAttrIn  // guarded by mu: merged changes not yet committed
	any  bool       // guarded by mu: held is not empty

	gen     atomic.Uint64 // bumped whenever the cluster's attributes may have changed
	view    Attr          // guarded by mu: the cluster's attributes as of viewGen
	viewGen uint64        // guarded by mu
	viewSet bool          // guarded by mu: view is usable if gen is still viewGen
}

func newAttrState() *attrState { return &attrState{} }

func (s *attrState) lock()   { s.mu.Lock() }
func (s *attrState) unlock() { s.mu.Unlock() }

// holdable reports whether in may be held: mode, owner and explicit
// times only, without set-ID bits.
func holdable(in SetAttrIn) bool {
	if in.SetSize || in.Handle != 0 || in.AtimeNow || in.MtimeNow {
		return false
	}
	if in.SetMode && in.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
		return false
	}
	return in.SetMode || in.SetUid || in.SetGid || in.SetAtime || in.SetMtime
}

// merge adds the changes of in to s's held ones; later values win.
func (s *attrState) merge(in SetAttrIn) {
	h := &s.held
	if in.SetMode {
		h.SetMode, h.Mode = true, in.Mode
	}
	if in.SetUid {
		h.SetUid, h.Uid = true, in.Uid
	}
	if in.SetGid {
		h.SetGid, h.Gid = true, in.Gid
	}
	if in.SetAtime {
		h.SetAtime, h.Atime = true, in.Atime
	}
	if in.SetMtime {
		h.SetMtime, h.Mtime = true, in.Mtime
	}
	s.any = true
}

// applyTo returns a with the held changes made.
func (h SetAttrIn) applyTo(a Attr, now time.Time) Attr {
	if h.SetMode {
		a.Mode = a.Mode&syscall.S_IFMT | h.Mode&0o7777
	}
	if h.SetUid {
		a.Uid = h.Uid
	}
	if h.SetGid {
		a.Gid = h.Gid
	}
	if h.SetAtime {
		a.Atime = h.Atime
	}
	if h.SetMtime {
		a.Mtime = h.Mtime
	}
	if now.After(a.Ctime) {
		a.Ctime = now
	}
	return a
}

// attrStateOf returns ino's attribute state, or nil if it has none. With
// create, it makes one, but only while this mount has the inode open
// (nil otherwise).
func (o *ClientOps) attrStateOf(ino uint64, create bool) *attrState {
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	if create && len(o.files[ino]) == 0 {
		return nil
	}
	s := o.attrs[ino]
	if s == nil && create {
		s = newAttrState()
		o.attrs[ino] = s
	}
	return s
}

// current reports whether s is still ino's state with ino open here: the
// last handle may have been released while the caller waited for s.
func (o *ClientOps) current(ino uint64, s *attrState) bool {
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	return o.attrs[ino] == s && len(o.files[ino]) > 0
}

// deferSetAttr holds in if it may be held, and answers with the
// attributes the file will have. ok is false when in must be committed
// now.
func (o *ClientOps) deferSetAttr(ctx context.Context, ino uint64, in SetAttrIn) (a Attr, ok bool, e syscall.Errno) {
	if o.opt.SyncWrites || !holdable(in) {
		return Attr{}, false, 0
	}
	s := o.attrStateOf(ino, true)
	if s == nil {
		return Attr{}, false, 0
	}
	s.lock()
	defer s.unlock()
	if !o.current(ino, s) {
		return Attr{}, false, 0
	}
	end := o.collectedEnd(ino) // before the view: see withHeld
	cur, e := o.viewOf(ctx, ino, s)
	if e != 0 {
		return Attr{}, false, e
	}
	if cur.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 || cur.IsDir() {
		return Attr{}, false, 0
	}
	s.merge(in)
	return withHeld(cur, s.held, end), true, 0
}

// heldAttr answers GETATTR for an inode with held changes that include an
// explicit mtime, without committing them. ok is false when the caller
// must drain and ask the cluster.
func (o *ClientOps) heldAttr(ctx context.Context, ino uint64) (a Attr, ok bool, e syscall.Errno) {
	s := o.attrStateOf(ino, false)
	if s == nil {
		return Attr{}, false, 0
	}
	s.lock()
	defer s.unlock()
	if !s.any || !s.held.SetMtime {
		return Attr{}, false, 0
	}
	end := o.collectedEnd(ino) // before the view: see withHeld
	cur, e := o.viewOf(ctx, ino, s)
	if e != 0 {
		return Attr{}, false, e
	}
	return withHeld(cur, s.held, end), true, 0
}

// withHeld is cur with the held changes applied and the size extended to
// end, the collected writes' (which only ever extend the file). The
// caller reads end before cur: a commit marks the view stale before its
// range goes (sendBuffered), so a commit that ends in between is in one
// of the two. Read the other way round, a commit could end after cur was
// read and before end was, and be in neither: the answer would be a size
// older than a write already acknowledged.
func withHeld(cur Attr, held SetAttrIn, end uint64) Attr {
	a := held.applyTo(cur, time.Now())
	if end > a.Size {
		a.Size = end
	}
	return a
}

// viewOf returns the cluster's attributes of ino: the ones s last got
// if nothing may have changed them since and the change stream is being
// received, else fresh ones. s is locked.
func (o *ClientOps) viewOf(ctx context.Context, ino uint64, s *attrState) (Attr, syscall.Errno) {
	g := s.gen.Load()
	if s.viewSet && s.viewGen == g && o.watching.Load() {
		return s.view, 0
	}
	cur, e := o.clusterAttr(ctx, ino)
	if e != 0 {
		return Attr{}, e
	}
	// g was read before the query: a change that arrived meanwhile makes
	// the next call ask again.
	s.view, s.viewGen, s.viewSet = cur, g, true
	return cur, 0
}

// staleViews drops every reused view of the cluster's attributes, after
// a change through this mount whose inode it does not know (an unlink or
// a rename names an entry): the change event would drop the right one,
// but only once it arrives.
func (o *ClientOps) staleViews() {
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	for _, s := range o.attrs {
		s.gen.Add(1)
	}
}

// clusterAttr asks the cluster for ino's attributes without draining.
func (o *ClientOps) clusterAttr(ctx context.Context, ino uint64) (Attr, syscall.Errno) {
	ctx, cancel := o.bound(ctx)
	defer cancel()
	start := o.meta.now()
	pa, err := o.c.GetAttr(ctx, ino)
	if err != nil {
		return Attr{}, errnoOf("getattr", err)
	}
	o.seen(pa)
	o.meta.putAttr(pa, start)
	return attrOf(pa), 0
}

// hasHeld reports whether ino has held attribute changes.
func (o *ClientOps) hasHeld(ino uint64) bool {
	s := o.attrStateOf(ino, false)
	if s == nil {
		return false
	}
	s.lock()
	defer s.unlock()
	return s.any
}

// commitHeld commits ino's held attribute changes, if any. A failure is
// recorded on every open handle of ino, to be reported by the next
// flush or fsync, and returned.
func (o *ClientOps) commitHeld(ino uint64) error {
	s := o.attrStateOf(ino, false)
	if s == nil {
		return nil
	}
	s.lock()
	defer s.unlock()
	return o.commitLocked(ino, s)
}

// commitLocked is commitHeld with s locked.
func (o *ClientOps) commitLocked(ino uint64, s *attrState) error {
	if !s.any {
		return nil
	}
	held := s.held
	s.held, s.any, s.viewSet = SetAttrIn{}, false, false
	ctx, cancel := o.bound(context.Background())
	defer cancel()
	start := o.meta.commit(ino)
	pa, err := o.c.SetAttr(ctx, setAttrCmd(ino, held))
	o.meta.committed(ino, pa, start)
	if err != nil {
		errnoOf("setattr-behind", err)
		for _, f := range o.openFiles(ino) {
			f.setErr(err)
		}
	}
	return err
}

// retire forgets handle f after committing what is held for its inode;
// the inode's state goes with its last handle. Holding the state's lock
// while doing both keeps a concurrent SETATTR from being held on a state
// nothing will commit any more (it sees the inode closed and commits
// itself).
func (o *ClientOps) retire(f *openFile) {
	s := o.attrStateOf(f.ino, false)
	if s == nil {
		o.unregister(f)
		return
	}
	s.lock()
	defer s.unlock()
	_ = o.commitLocked(f.ino, s) // recorded on the handles; close reported it
	o.unregister(f)
	o.filesMu.Lock()
	if len(o.files[f.ino]) == 0 && o.attrs[f.ino] == s {
		delete(o.attrs, f.ino)
	}
	o.filesMu.Unlock()
}
