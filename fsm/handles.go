package fsm

import (
	"slices"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// open opens (and with O_CREAT creates) a file for a session. Exclusive
// opens exclude each other only: a plain open is never blocked by an
// exclusive holder, like flock(2) locks, which lets readers such as backup
// tools look at a file someone holds.
func (t *tx) open(x *pb.OpenCmd, sess *session) (*pb.Result, error) {
	if sess == nil {
		return nil, errf(syscall.ESTALE, "open needs a session")
	}
	flags := x.Flags
	if flags&oAccMode == oAccMode {
		return nil, errf(syscall.EINVAL, "open flags %#x: bad access mode", flags)
	}
	loc := orEmpty(x.Loc)
	nofollow := loc.Nofollow || flags&oNofollow != 0
	var n *inode
	var create resolved
	if flags&oCreat != 0 {
		r, err := t.resolve(loc, !nofollow && flags&oExcl == 0)
		if err != nil {
			return nil, err
		}
		if r.node != nil {
			if flags&oExcl != 0 {
				return nil, errf(syscall.EEXIST, "%s", locString(loc))
			}
			n = r.node
		} else {
			if err := r.creatable(loc); err != nil {
				return nil, err
			}
			if r.slash {
				return nil, errf(syscall.EISDIR, "create %s", locString(loc))
			}
			if err := checkReserved(sess, x.Ino); err != nil {
				return nil, err
			}
			create = r
		}
	} else {
		r, err := t.resolve(loc, !nofollow)
		if err != nil {
			return nil, err
		}
		if n, err = r.existing(loc); err != nil {
			return nil, err
		}
	}
	if n != nil {
		if err := openable(n, flags, loc); err != nil {
			return nil, err
		}
	}
	queued := false
	if x.Exclusive && n != nil {
		if l := t.lock(n.ino); l != nil && l.holder != 0 {
			if !x.Wait {
				return nil, errf(syscall.EWOULDBLOCK, "%s is open exclusively", locString(loc))
			}
			queued = true
		}
	}
	switch {
	case n == nil:
		if err := t.guard(create.dir.ino); err != nil {
			return nil, err
		}
	case !queued && flags&oTrunc != 0 && n.isReg() && n.size > 0:
		if err := t.guard(n.ino); err != nil {
			return nil, err
		}
	case queued && flags&oTrunc != 0 && n.isReg():
		// It truncates when granted, in whatever command or expiry ends
		// the holder's open, where nothing can wait for a recall: so no
		// session, its own included, may hold a capability on the file
		// meanwhile (grantable refuses them until then).
		if caps := t.capsOf(n.ino); len(caps) > 0 {
			t.recall(caps)
			return nil, errRecall
		}
	}
	cur := t.session(sess.id) // sess may be a batch's stale copy
	if cur == nil {
		return nil, errf(syscall.ESTALE, "session %d ended", sess.id)
	}
	if cur.handles >= maxHandlesPerSession {
		return nil, errf(syscall.EMFILE, "session %d has %d handles open", sess.id, cur.handles)
	}
	// Validated: from here on nothing fails.
	var epoch uint64
	if n == nil {
		n = t.newChild(create.dir, modeReg|x.Mode&modePerm, x.Uid, x.Gid, x.Ino)
		t.addEntry(create.dir, create.name, n)
		epoch = t.capCreated(create.dir, n)
	}
	h := &handle{id: t.nextHandle, session: sess.id, ino: n.ino, flags: flags, excl: x.Exclusive, granted: !queued}
	t.nextHandle++
	t.handles.put(u64key(h.id), h)
	// Through sessMut, not sess: within a batch, sess may be shared with
	// the savepoint a failure goes back to.
	t.sessMut(cur).handles++
	n = t.mutQuiet(n)
	n.opens++
	if h.excl {
		t.enqueue(n.ino, h.id, queued)
	}
	if !queued && flags&oTrunc != 0 && n.isReg() && n.size > 0 {
		n = t.truncateToZero(n)
	}
	return &pb.Result{Attr: n.attr(), Handle: h.id, Queued: queued, Epoch: epoch}, nil
}

// openable checks an existing inode against the open flags.
func openable(n *inode, flags uint32, loc *pb.Loc) error {
	switch {
	case n.isLnk():
		return errf(syscall.ELOOP, "%s is a symlink", locString(loc))
	case n.isSpecial():
		// A FIFO, socket or device is opened by the kernel of a mount,
		// never through the cluster.
		return errf(syscall.ENXIO, "%s is a special file", locString(loc))
	case n.isDir() && (flags&oAccMode != oRdonly || flags&(oTrunc|oCreat) != 0):
		return errf(syscall.EISDIR, "%s", locString(loc))
	case flags&oDirectory != 0 && !n.isDir():
		return errf(syscall.ENOTDIR, "%s", locString(loc))
	}
	return nil
}

// enqueue makes handle id the exclusive holder of ino, or, when queued,
// the last in its line.
func (t *tx) enqueue(ino, id uint64, queued bool) {
	l := &xlock{holder: id}
	if queued {
		old := t.lock(ino)
		l = &xlock{holder: old.holder, queue: append(slices.Clip(old.queue), id)}
	}
	t.locks.put(u64key(ino), l)
}

func (t *tx) closeCmd(x *pb.CloseCmd, sess *session) (*pb.Result, error) {
	h := t.handle(x.Handle)
	if h == nil || sess == nil || h.session != sess.id {
		return nil, errf(syscall.EBADF, "handle %d", x.Handle)
	}
	t.closeHandle(h.id)
	return &pb.Result{}, nil
}

// maxHandlesPerSession bounds a session's open handles (EMFILE past it),
// so that one client cannot grow the replicated state without bound.
const maxHandlesPerSession = 1 << 16

// closeHandle closes a handle, granted or queued: the exclusive open
// passes to the next in line, and an unlinked inode goes with its last
// handle.
func (t *tx) closeHandle(id uint64) {
	h := t.handle(id)
	if h == nil {
		return
	}
	t.handles.del(u64key(id))
	if s := t.session(h.session); s != nil && s.handles > 0 {
		t.sessMut(s).handles--
	}
	if h.excl {
		t.unlock(h)
	}
	n := t.inode(h.ino)
	if n == nil {
		return
	}
	n = t.mutQuiet(n)
	if n.opens > 0 {
		n.opens--
	}
	if n.nlink == 0 && n.opens == 0 {
		t.freeInode(n)
	}
}

// unlock takes handle h out of its inode's exclusive-open state, granting
// the next waiter when h was the holder.
func (t *tx) unlock(h *handle) {
	l := t.lock(h.ino)
	if l == nil {
		return
	}
	var nl xlock
	if l.holder == h.id {
		if len(l.queue) > 0 {
			nl.holder = l.queue[0]
			nl.queue = slices.Clone(l.queue[1:])
			t.grant(nl.holder)
		}
	} else {
		nl.holder = l.holder
		nl.queue = slices.DeleteFunc(slices.Clone(l.queue), func(id uint64) bool { return id == h.id })
	}
	if nl.holder == 0 {
		t.locks.del(u64key(h.ino))
		return
	}
	t.locks.put(u64key(h.ino), &nl)
}

// grant hands a queued exclusive open its file; O_TRUNC takes effect now.
func (t *tx) grant(id uint64) {
	h := t.handle(id)
	if h == nil {
		return
	}
	g := *h
	g.granted = true
	t.handles.put(u64key(id), &g)
	if n := t.inode(h.ino); n != nil && h.flags&oTrunc != 0 && n.isReg() && n.size > 0 {
		t.truncateToZero(n)
	}
}

// handleFor returns the granted handle id of sess for use by a command.
func (t *tx) handleFor(id uint64, sess *session) (*handle, *inode, error) {
	h := t.handle(id)
	if h == nil || sess == nil || h.session != sess.id {
		return nil, nil, errf(syscall.EBADF, "handle %d", id)
	}
	if !h.granted {
		return nil, nil, errf(syscall.EAGAIN, "handle %d is waiting for its exclusive open", id)
	}
	n := t.inode(h.ino)
	if n == nil {
		return nil, nil, errf(syscall.EIO, "handle %d names missing inode %d", id, h.ino)
	}
	return h, n, nil
}
