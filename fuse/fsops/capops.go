package fsops

import (
	"context"
	"log/slog"
	"syscall"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// What the mount does with capabilities beyond the metadata cache
// (metacache.go): read-only opens of a held file commit nothing, and a
// recall drops the caches of the inodes it names, in the mount and in the
// kernel, before the capabilities go back.
//
// A read-only open under a capability gets a local handle (localBit set),
// which the cluster never sees: reads go by inode number, and release
// commits nothing. The cluster keeps an inode only while a name or a
// cluster handle refers to it, so before the file can lose its last name
// (a recall, which may be for an unlink elsewhere, or an unlink or rename
// of this mount) each local handle on it is pinned: a cluster handle is
// opened for it, reads go through that one, and release closes it.

// localBit marks handles opened without the cluster.
const localBit = 1 << 62

func isLocal(handle uint64) bool { return handle&localBit != 0 }

// openLocal opens ino for reading without a commit when its capability
// holds; ok is false when the open must go to the cluster.
func (o *ClientOps) openLocal(ino uint64, flags uint32) (OpenOut, bool) {
	if !o.meta.on() || flags&(oAccMode|syscall.O_TRUNC|syscall.O_APPEND) != syscall.O_RDONLY {
		return OpenOut{}, false
	}
	a, ok := o.meta.attr(ino)
	if !ok || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return OpenOut{}, false
	}
	h := localBit | o.localNext.Add(1)
	o.register(newOpenFile(ino, h, false))
	return OpenOut{Handle: h, KeepCache: true}, true
}

// serverHandle is the client handle a read through kernel handle h goes
// by: h itself, the cluster handle a local handle was pinned with, or 0
// (read by inode).
func (o *ClientOps) serverHandle(h uint64) uint64 {
	if !isLocal(h) {
		return h
	}
	if f := o.file(h); f != nil {
		return f.remote.Load()
	}
	return 0
}

// pin gives every local handle on ino a cluster handle, so that the inode
// outlives its last name for them.
func (o *ClientOps) pin(ctx context.Context, ino uint64) {
	for _, f := range o.openFiles(ino) {
		if !isLocal(f.handle) || f.remote.Load() != 0 {
			continue
		}
		h, _, err := o.c.OpenLoc(ctx, inode(ino), syscall.O_RDONLY, 0, 0, 0, false, false)
		if err != nil {
			slog.Warn("fuse: pinning a file opened under a capability failed; it may vanish if unlinked", "ino", ino, "err", err)
			continue
		}
		if !f.remote.CompareAndSwap(0, h) {
			_ = o.c.CloseHandle(ctx, h)
		}
	}
}

// pinEntry pins the local handles of the inode parent/name names, before
// this mount unlinks or replaces it.
func (o *ClientOps) pinEntry(ctx context.Context, parent uint64, name string) {
	if o.localOpens.Load() == 0 {
		return
	}
	ctx, cancel := o.bound(ctx)
	defer cancel()
	ino := uint64(0)
	if ent, found, ok := o.meta.lookup(parent, name); ok {
		if !found {
			return
		}
		ino = ent.Ino
	} else if pa, err := o.c.Lookup(ctx, parent, name); err == nil {
		ino = pa.GetIno()
	}
	if ino != 0 {
		o.pin(ctx, ino)
	}
}

// recalled is the capability table's OnRecall: the inodes lose what the
// mount and the kernel cached of them, and files opened locally are
// pinned, before the capabilities go back. The kernel is told only of
// inodes it may still answer about by itself (kerneltold.go), and of all
// where it does not check its pages against the attributes.
func (o *ClientOps) recalled(inos []uint64) {
	o.stats.recalls.Add(uint64(len(inos)))
	names := o.meta.forget(inos...)
	ctx, cancel := o.bound(context.Background())
	defer cancel()
	var tell []uint64
	var latest time.Time
	for _, ino := range inos {
		o.dropWindows(ino)
		o.noXattrs.drop(ino)
		o.pin(ctx, ino)
		at, holds := o.told.recall(ino)
		if holds || !o.opt.KernelChecksData {
			tell = append(tell, ino)
			if at.After(latest) {
				latest = at
			}
		}
	}
	if len(tell) > 0 {
		// A GETATTR being answered meanwhile, or answered so lately that
		// the kernel may not have applied it yet, must go first; bounded,
		// as the recall holds up another client.
		o.fetches.wait(tell, recallWaitsForGetattr)
		if d := time.Until(latest.Add(kernelApplies)); d > 0 {
			time.Sleep(d)
		}
	}
	o.invalidateKernel(names, tell)
}

// recallWaitsForGetattr bounds how long a recall waits for GETATTRs of its
// inodes in flight: about a query's round trip on a loaded node.
const recallWaitsForGetattr = 100 * time.Millisecond

// lost is the capability table's OnLost: the session expired and its
// capabilities went without a recall, so nobody waits for a release. What
// the mount cached goes at once; the kernel is told in the background,
// since this runs inside a request whose directory the kernel may hold
// locked, and a notification about it would wait for that request.
func (o *ClientOps) lost(inos []uint64) {
	names := o.meta.forget(inos...)
	for _, ino := range inos {
		o.dropWindows(ino)
		o.noXattrs.drop(ino)
	}
	go o.invalidateKernel(names, inos)
}

// invalidateKernel drops what the kernel cached of inos and the names of
// the directories in names.
func (o *ClientOps) invalidateKernel(names map[uint64][]string, inos []uint64) {
	inv := o.invalidator()
	if inv == nil {
		return
	}
	// The kernel cached names of a held directory for as long as the
	// capability was trusted (Attr.Valid): they go first.
	for dir, ns := range names {
		for _, n := range ns {
			inv.InvalidateEntry(dir, n)
		}
	}
	for _, ino := range inos {
		inv.InvalidateData(ino)
	}
}

// releasing is the capability table's OnRelease: what this mount's
// write-behind and attribute-behind acknowledged for the inodes is
// committed before they go back, so the command that recalled them sees
// every byte written before it began (and the journal goes first, as
// before any command).
func (o *ClientOps) releasing(inos []uint64) {
	for _, ino := range inos {
		if o.dirty(ino) {
			o.barrier(ino)
		}
	}
}

func (o *ClientOps) invalidator() Invalidator {
	if p := o.inv.Load(); p != nil {
		return *p
	}
	return nil
}

// adopt takes the capability a create's result carries and keeps the new
// inode's attributes and its entry in parent's listing.
func (o *ClientOps) adopt(parent uint64, name string, res *pb.Result) {
	a := res.GetAttr()
	if !o.meta.on() || a == nil {
		return
	}
	o.meta.caps.Adopt(a.GetIno(), res.GetEpoch())
	o.meta.edit(parent, func(l *listing) {
		l.add(DirEntry{Name: name, Ino: a.GetIno(), Mode: a.GetMode() & syscall.S_IFMT})
	})
	o.meta.putAttr(a, o.meta.now())
}

// createdHere keeps what a create of this mount (open with O_CREAT,
// mkdir, symlink) did to parent's cached listing: the new entry with its
// capability, or, when it failed or came without one (an existing file
// opened, a directory not held), nothing of parent or of the inode.
func (o *ClientOps) createdHere(parent uint64, name string, res *pb.Result, e syscall.Errno) {
	if e == 0 && res.GetEpoch() != 0 {
		o.adopt(parent, name, res)
		return
	}
	o.meta.forget(parent)
	if a := res.GetAttr(); a != nil {
		o.meta.forgetAttr(a.GetIno())
	}
}

// removedHere keeps what an unlink or rmdir of this mount did to parent's
// cached listing.
func (o *ClientOps) removedHere(parent uint64, name string, e syscall.Errno) {
	if !o.meta.on() {
		return
	}
	ent, found, _ := o.meta.lookupWhile(parent, name, true)
	if e != 0 {
		o.meta.forget(parent)
		return
	}
	o.meta.edit(parent, func(l *listing) { l.remove(name) })
	if found {
		o.meta.forget(ent.Ino) // its link count and ctime changed
	}
}

// renamedHere keeps what a rename of this mount did to the cached
// listings of both directories.
func (o *ClientOps) renamedHere(parent uint64, name string, newParent uint64, newName string, e syscall.Errno) {
	if !o.meta.on() {
		return
	}
	moved, found, _ := o.meta.lookupWhile(parent, name, true)
	replaced, hadTarget, _ := o.meta.lookupWhile(newParent, newName, true)
	if e != 0 || !found {
		o.meta.forget(parent, newParent)
		return
	}
	o.meta.edit(parent, func(l *listing) { l.remove(name) })
	o.meta.edit(newParent, func(l *listing) {
		l.add(DirEntry{Name: newName, Ino: moved.Ino, Mode: moved.Mode})
	})
	o.meta.forget(moved.Ino) // its ctime changed, and a directory's ".."
	if hadTarget {
		o.meta.forget(replaced.Ino)
	}
}
