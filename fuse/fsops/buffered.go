package fsops

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// Buffered metadata. In a directory this mount holds an exclusive
// capability on, with its complete listing cached, create, mkdir,
// symlink, link, unlink, rmdir and rename are answered at once from the cached
// state and appended to the client's journal (client.Journal), which
// sends them in order, in atomic batches fenced by the capabilities they
// were answered under. The same holds for setattr of an inode held
// exclusively, and for the first bytes written to a file made that way
// (the journal carries them, up to jrFileBytes per file; later writes go
// through write-behind, after the journal, and are acknowledged before
// they commit only under an exclusive capability on the file).
//
// What keeps this correct:
//   - The decision and the append happen under Journal.Admit, and a
//     release of a recalled capability first syncs the journal with
//     admissions stopped, so another session that waits for the recall
//     sees every operation answered before it.
//   - Every command this mount sends otherwise, and every query naming an
//     inode the journal touches, waits for the journal first (the client
//     does this), so nothing overtakes it, and a cache dropped for any
//     reason is refilled from a cluster that holds every operation.
//   - The answer is what the cluster will do: the same checks on the same
//     complete listing, the same attribute rules, and the time of the
//     answer as the command's stamp.
//   - Anything else (an inode with open handles losing a name, a
//     directory moved between directories, a listing not cached, sizes)
//     goes the synchronous way. Fsync, syncfs, fsyncdir and unmount wait
//     for the journal; an operation the cluster refused at commit is
//     reported at the next fsync or close of its file and logged, and the
//     mount then drops what it cached.

// jrFileBytes is how much of a new file's data the journal carries.
const jrFileBytes = 256 << 10

// exclusiveRetry is how long after a refused exclusive grant of a
// directory the mount asks again.
const exclusiveRetry = time.Second

type exclusiveTries struct {
	mu      sync.Mutex
	refused map[uint64]time.Time // guarded by mu
}

// buffering reports whether operations may be buffered at all.
func (o *ClientOps) buffering() bool { return o.jr != nil }

// settleBehind commits what write-behind and attribute-behind hold before
// an operation is journaled: they were acknowledged first, and the
// cluster must never hold the later operation without them.
func (o *ClientOps) settleBehind() {
	o.filesMu.Lock()
	held := len(o.attrs) > 0
	o.filesMu.Unlock()
	if o.unsent.Load() == 0 && !held {
		return
	}
	for ino := range o.dirtyInodes() {
		o.barrier(ino)
	}
}

// fence is the capability an operation relies on for ino, or ok false
// when ino is not held exclusively.
func (o *ClientOps) fence(ino uint64) (ref *pb.CapRef, ok bool) {
	e, ok := o.meta.caps.ExclusiveEpoch(ino)
	if !ok {
		return nil, false
	}
	if e == 0 {
		return nil, true // made by an operation of the journal
	}
	return &pb.CapRef{Ino: ino, Epoch: e}, true
}

// fences collects the capabilities on dirs, or ok false.
func (o *ClientOps) fences(dirs ...uint64) ([]*pb.CapRef, bool) {
	var out []*pb.CapRef
	for _, d := range dirs {
		f, ok := o.fence(d)
		if !ok {
			return nil, false
		}
		if f != nil {
			out = append(out, f)
		}
	}
	return out, true
}

// wantExclusive makes dir buffer-ready when it can be: held exclusively,
// with its listing and attributes cached. It asks the cluster for what is
// missing (one grant, one fill), at most once a second after a refusal.
func (o *ClientOps) wantExclusive(ctx context.Context, dirs ...uint64) {
	if !o.buffering() {
		return
	}
	ctx, cancel := o.bound(ctx)
	defer cancel()
	for _, dir := range dirs {
		if !o.holdExclusive(ctx, dir) {
			continue
		}
		if _, ok := o.meta.listed(dir); !ok {
			o.fillDir(ctx, dir)
		}
		if _, ok := o.meta.attr(dir); !ok {
			o.grantOne(ctx, dir)
			_, _ = o.clusterAttr(ctx, dir) // keeps what it reads
		}
	}
}

// holdForWrite takes an exclusive capability on a file before this mount
// acknowledges writes to it that it has not committed, and reports
// whether it holds one. While it does, another client's read of the file
// recalls it, and the release first commits those writes (releasing), so
// that read sees every byte written before it began; without one, the
// writes must commit before they are answered. A refusal is not asked
// again for a second.
func (o *ClientOps) holdForWrite(ctx context.Context, ino uint64) bool {
	ctx, cancel := o.bound(ctx)
	defer cancel()
	return o.holdExclusive(ctx, ino)
}

// holdExclusive reports whether this mount holds an exclusive capability
// on ino, asking the cluster for one when it does not, at most once a
// second after a refusal.
func (o *ClientOps) holdExclusive(ctx context.Context, ino uint64) bool {
	if _, ok := o.meta.caps.ExclusiveEpoch(ino); ok {
		return true
	}
	o.excl.mu.Lock()
	recent := time.Since(o.excl.refused[ino]) < exclusiveRetry
	o.excl.mu.Unlock()
	if recent {
		return false
	}
	if got, err := o.meta.caps.GrantExclusive(ctx, ino); err == nil && len(got) > 0 {
		if _, ok := o.meta.caps.ExclusiveEpoch(ino); ok {
			return true
		}
	}
	o.excl.mu.Lock()
	if len(o.excl.refused) > 4096 {
		clear(o.excl.refused)
	}
	o.excl.refused[ino] = time.Now()
	o.excl.mu.Unlock()
	return false
}

// collectHeld is collect for a buffering mount: writes are acknowledged
// before they commit only under an exclusive capability on the file, and
// the check and the collect happen under Journal.Admit, so a release of
// the capability (which commits what was collected first) comes either
// before the check or after the collect.
func (o *ClientOps) collectHeld(ctx context.Context, f *openFile, off int64, data []byte) bool {
	if !o.buffering() || f.append {
		return o.collect(f, off, data)
	}
	if !o.holdForWrite(ctx, f.ino) {
		return false
	}
	release := o.jr.Admit()
	defer release()
	if _, ok := o.meta.caps.ExclusiveEpoch(f.ino); !ok {
		return false
	}
	return o.collect(f, off, data)
}

// bufReady returns dir's cached attributes when an operation in it may be
// buffered.
func (o *ClientOps) bufReady(dir uint64) (Attr, bool) {
	if _, ok := o.meta.caps.ExclusiveEpoch(dir); !ok {
		return Attr{}, false
	}
	a, ok := o.meta.attr(dir)
	if !ok {
		return Attr{}, false
	}
	if _, ok := o.meta.listed(dir); !ok {
		return Attr{}, false
	}
	return a, true
}

// newKind describes an inode a buffered create makes.
type newKind struct {
	mode   uint32 // type and permission bits as the cluster gets them
	target string // symlinks
}

// bufCreate answers a create of name in parent (a regular file, a
// directory or a symlink) from the cache and journals it. ok is false when
// it must go to the cluster; e is the answer otherwise.
func (o *ClientOps) bufCreate(ctx context.Context, parent uint64, name string, k newKind, c Caller) (a Attr, ok bool, e syscall.Errno) {
	if !o.buffering() || len(name) > maxNameLen {
		return Attr{}, false, 0
	}
	o.settleBehind()
	release := o.jr.Admit()
	defer release()
	dir, ready := o.bufReady(parent)
	if !ready {
		return Attr{}, false, 0
	}
	fences, _ := o.fences(parent)
	if _, found, ok := o.meta.lookup(parent, name); !ok {
		return Attr{}, false, 0
	} else if found {
		return Attr{}, true, syscall.EEXIST
	}
	ino, gen, err := o.jr.Ino(ctx)
	if err != nil {
		return Attr{}, false, 0
	}
	now := time.Now()
	a = Attr{Ino: ino, Mode: k.mode, Nlink: 1, Uid: c.Uid, Gid: c.Gid, Atime: now, Mtime: now, Ctime: now, Gen: gen}
	if dir.Mode&syscall.S_ISGID != 0 {
		a.Gid = dir.Gid
		if a.IsDir() {
			a.Mode |= syscall.S_ISGID
		}
	}
	var cmd *pb.Command
	switch k.mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		a.Nlink = 2
		cmd = &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: entry(parent, name), Mode: k.mode & 0o7777, Uid: c.Uid, Gid: c.Gid, Ino: ino}}}
	case syscall.S_IFLNK:
		a.Size = uint64(len(k.target))
		cmd = &pb.Command{Op: &pb.Command_Symlink{Symlink: &pb.SymlinkCmd{Loc: entry(parent, name), Target: k.target, Uid: c.Uid, Gid: c.Gid, Ino: ino}}}
	default:
		cmd = &pb.Command{Op: &pb.Command_Mknod{Mknod: &pb.MknodCmd{Loc: entry(parent, name), Mode: k.mode, Uid: c.Uid, Gid: c.Gid, Ino: ino}}}
	}
	o.meta.caps.HoldPending(ino)
	o.meta.local(func(l localEdit) {
		d := l.attr(parent)
		d.Mtime, d.Ctime = now, now
		if a.IsDir() {
			d.Nlink++
		}
		l.list(parent).add(DirEntry{Name: name, Ino: ino, Mode: a.Mode & syscall.S_IFMT})
		l.put(a)
		if a.IsDir() {
			l.newDir(ino, parent)
		}
		if k.target != "" {
			l.target(ino, k.target)
		}
	})
	o.capMiss.add(ino)
	o.jr.Append(client.Buffered{Cmd: stamped(cmd, now), Inos: []uint64{parent, ino}, Fences: fences, Created: ino})
	return a, true, 0
}

// bufRemove answers an unlink (dir false) or rmdir of name in parent.
func (o *ClientOps) bufRemove(parent uint64, name string, dir bool) (ok bool, e syscall.Errno) {
	if !o.buffering() {
		return false, 0
	}
	o.settleBehind()
	release := o.jr.Admit()
	defer release()
	if _, ready := o.bufReady(parent); !ready {
		return false, 0
	}
	fences, _ := o.fences(parent)
	ent, found, ok := o.meta.lookup(parent, name)
	switch {
	case !ok:
		return false, 0
	case !found:
		return true, syscall.ENOENT
	case dir && ent.Mode != syscall.S_IFDIR:
		return true, syscall.ENOTDIR
	case !dir && ent.Mode == syscall.S_IFDIR:
		return true, syscall.EISDIR
	case len(o.openFiles(ent.Ino)) > 0:
		return false, 0 // it must outlive its name for its handles: pinned the cluster's way
	}
	if dir {
		if known, e := o.emptyDir(ent.Ino); !known || e != 0 {
			return known, e
		}
	}
	now := time.Now()
	o.meta.local(func(l localEdit) {
		d := l.attr(parent)
		d.Mtime, d.Ctime = now, now
		if dir && d.Nlink > 2 {
			d.Nlink--
		}
		l.list(parent).remove(name)
		l.drop(ent.Ino) // its link count and ctime changed
	})
	cmd := &pb.RemoveCmd{Loc: entry(parent, name), DirOnly: dir, FileOnly: !dir}
	o.jr.Append(client.Buffered{Cmd: stamped(&pb.Command{Op: &pb.Command_Remove{Remove: cmd}}, now), Inos: []uint64{parent, ent.Ino}, Fences: fences})
	return true, 0
}

// emptyDir decides from dir's cached listing whether it may be removed or
// replaced: known false when the listing is not cached, ENOTEMPTY when it
// has entries.
func (o *ClientOps) emptyDir(dir uint64) (known bool, e syscall.Errno) {
	n, ok := o.meta.listed(dir)
	switch {
	case !ok:
		return false, 0
	case n > 2: // "." and ".."
		return true, syscall.ENOTEMPTY
	}
	return true, 0
}

// bufRename answers a rename from the cached listings of both directories.
// A directory moves only within its directory (moving it elsewhere would
// need its whole ancestry); a target with open handles goes the cluster's
// way.
func (o *ClientOps) bufRename(parent uint64, name string, newParent uint64, newName string) (ok bool, e syscall.Errno) {
	if !o.buffering() || len(newName) > maxNameLen {
		return false, 0
	}
	o.settleBehind()
	release := o.jr.Admit()
	defer release()
	if _, ready := o.bufReady(parent); !ready {
		return false, 0
	}
	if _, ready := o.bufReady(newParent); !ready {
		return false, 0
	}
	fences, _ := o.fences(parent, newParent)
	src, found, ok := o.meta.lookup(parent, name)
	if !ok {
		return false, 0
	}
	if !found {
		return true, syscall.ENOENT
	}
	srcDir := src.Mode == syscall.S_IFDIR
	if srcDir && parent != newParent {
		return false, 0
	}
	dst, hadTarget, ok := o.meta.lookup(newParent, newName)
	if !ok {
		return false, 0
	}
	if hadTarget {
		dstDir := dst.Mode == syscall.S_IFDIR
		switch {
		case dst.Ino == src.Ino:
			return true, 0 // two names of one inode: rename does nothing
		case srcDir && !dstDir:
			return true, syscall.ENOTDIR
		case !srcDir && dstDir:
			return true, syscall.EISDIR
		case len(o.openFiles(dst.Ino)) > 0:
			return false, 0
		}
		if dstDir {
			if known, e := o.emptyDir(dst.Ino); !known || e != 0 {
				return known, e
			}
		}
	}
	now := time.Now()
	o.meta.local(func(l localEdit) {
		for _, d := range []uint64{parent, newParent} {
			a := l.attr(d)
			a.Mtime, a.Ctime = now, now
		}
		if hadTarget && dst.Mode == syscall.S_IFDIR {
			if d := l.attr(newParent); d.Nlink > 2 {
				d.Nlink--
			}
		}
		l.list(parent).remove(name)
		l.list(newParent).add(DirEntry{Name: newName, Ino: src.Ino, Mode: src.Mode})
		l.attr(src.Ino).Ctime = now
		if hadTarget {
			l.drop(dst.Ino)
		}
	})
	inos := []uint64{parent, newParent, src.Ino}
	if hadTarget {
		inos = append(inos, dst.Ino)
	}
	cmd := &pb.RenameCmd{Src: entry(parent, name), Dst: entry(newParent, newName)}
	o.jr.Append(client.Buffered{Cmd: stamped(&pb.Command{Op: &pb.Command_Rename{Rename: cmd}}, now), Inos: inos, Fences: fences})
	return true, 0
}

// bufLink answers a hard link of ino as newName in newParent.
func (o *ClientOps) bufLink(ino, newParent uint64, newName string) (a Attr, ok bool, e syscall.Errno) {
	if !o.buffering() || len(newName) > maxNameLen {
		return Attr{}, false, 0
	}
	o.settleBehind()
	release := o.jr.Admit()
	defer release()
	if _, ready := o.bufReady(newParent); !ready {
		return Attr{}, false, 0
	}
	fences, _ := o.fences(newParent)
	src, cached := o.meta.attr(ino)
	if !cached {
		return Attr{}, false, 0
	}
	if src.IsDir() {
		return Attr{}, true, syscall.EPERM
	}
	if src.Nlink >= maxLinks {
		// The count is the cluster's with this mount's journaled links
		// added, which nobody else can change meanwhile: the cluster would
		// refuse it too. Asking it instead would first commit every
		// journaled link (65,000 here) within this one call's time.
		return Attr{}, true, syscall.EMLINK
	}
	if _, found, ok := o.meta.lookup(newParent, newName); !ok {
		return Attr{}, false, 0
	} else if found {
		return Attr{}, true, syscall.EEXIST
	}
	now := time.Now()
	a = src
	a.Valid = 0
	a.Nlink++
	a.Ctime = now
	o.meta.local(func(l localEdit) {
		d := l.attr(newParent)
		d.Mtime, d.Ctime = now, now
		l.list(newParent).add(DirEntry{Name: newName, Ino: ino, Mode: src.Mode & syscall.S_IFMT})
		l.put(a)
	})
	cmd := &pb.LinkCmd{Src: inode(ino), Dst: entry(newParent, newName)}
	o.jr.Append(client.Buffered{Cmd: stamped(&pb.Command{Op: &pb.Command_Link{Link: cmd}}, now), Inos: []uint64{newParent, ino}, Fences: fences})
	a.Valid = src.Valid
	return a, true, 0
}

// bufSetAttr answers a change of mode, owner or times of an inode held
// exclusively. Sizes go to the cluster (they drop data).
func (o *ClientOps) bufSetAttr(ino uint64, in SetAttrIn) (a Attr, ok bool) {
	if !o.buffering() || in.SetSize || in.Handle != 0 && !isLocal(in.Handle) {
		return Attr{}, false
	}
	o.settleBehind() // collected writes land first, and move mtime before it
	release := o.jr.Admit()
	defer release()
	fence, ok := o.fence(ino)
	if !ok {
		return Attr{}, false
	}
	cur, ok := o.meta.attr(ino)
	if !ok {
		return Attr{}, false
	}
	if !in.SetMode && !in.SetUid && !in.SetGid && !in.SetAtime && !in.SetMtime {
		// Nothing to change (chown to -1, -1): the cluster leaves the
		// change time as it is, so the answer must too.
		return cur, true
	}
	now := time.Now()
	a = cur
	a.Valid = 0
	if in.SetMode {
		a.Mode = a.Mode&syscall.S_IFMT | in.Mode&0o7777
	}
	if in.SetUid {
		a.Uid = in.Uid
	}
	if in.SetGid {
		a.Gid = in.Gid
	}
	switch {
	case in.SetAtime && in.AtimeNow:
		a.Atime = now
	case in.SetAtime:
		a.Atime = in.Atime
	}
	switch {
	case in.SetMtime && in.MtimeNow:
		a.Mtime = now
	case in.SetMtime:
		a.Mtime = in.Mtime
	}
	a.Ctime = now
	o.meta.local(func(l localEdit) { l.put(a) })
	var fences []*pb.CapRef
	if fence != nil {
		fences = []*pb.CapRef{fence}
	}
	cmd := setAttrCmd(ino, in)
	cmd.Handle = 0
	o.jr.Append(client.Buffered{Cmd: stamped(&pb.Command{Op: &pb.Command_SetAttr{SetAttr: cmd}}, now), Inos: []uint64{ino}, Fences: fences})
	a.Valid = cur.Valid
	return a, true
}

// bufWrite journals a write to a file this mount made with a buffered
// create, while the file is small; ok is false when it must go the usual
// way (from then on, for this handle).
func (o *ClientOps) bufWrite(f *openFile, off int64, data []byte) (n int, ok bool) {
	if !f.journaled.Load() {
		return 0, false
	}
	o.settleBehind()
	release := o.jr.Admit()
	defer release()
	fence, held := o.fence(f.ino)
	cur, cached := o.meta.attr(f.ino)
	if f.append {
		off = int64(cur.Size)
	}
	// A write past the end leaves a hole, which the cluster does not
	// store: the blocks it reports are its business.
	if !held || !cached || off > int64(cur.Size) || f.jbytes.Add(int64(len(data))) > jrFileBytes {
		f.journaled.Store(false)
		f.mu.Lock()
		f.jdata = nil
		f.mu.Unlock()
		return 0, false
	}
	now := time.Now()
	a := cur
	a.Valid = 0
	a.Size = max(a.Size, uint64(off)+uint64(len(data)))
	a.Blocks = (a.Size + 511) / 512
	a.Mtime, a.Ctime = now, now
	o.meta.local(func(l localEdit) { l.put(a) })
	var fences []*pb.CapRef
	if fence != nil {
		fences = []*pb.CapRef{fence}
	}
	cmd := &pb.WriteCmd{Loc: inode(f.ino), Offset: off, Data: slices.Clone(data)}
	f.mu.Lock()
	if end := int(off) + len(data); end > len(f.jdata) {
		f.jdata = append(f.jdata, make([]byte, end-len(f.jdata))...)
	}
	copy(f.jdata[off:], data)
	f.mu.Unlock()
	o.jr.Append(client.Buffered{Cmd: stamped(&pb.Command{Op: &pb.Command_Write{Write: cmd}}, now), Inos: []uint64{f.ino}, Fences: fences})
	return len(data), true
}

// syncJournal commits everything buffered and returns the first failure
// recorded for ino (0: none asked).
func (o *ClientOps) syncJournal(ctx context.Context, ino uint64) error {
	if !o.buffering() {
		return nil
	}
	if err := o.jr.SyncMoving(ctx, o.opt.OpTimeout); err != nil {
		return err
	}
	if ino != 0 {
		return o.jr.TakeErr(ino)
	}
	return nil
}

// committedBatch is the journal's OnCommit: inodes made by operations that
// were lost are no longer held, and when anything was lost the caches go,
// so that later calls see what the cluster holds.
func (o *ClientOps) committedBatch(ops []client.Buffered, res []*pb.Result, err error) {
	var lost []uint64
	for i, op := range ops {
		if err == nil && res[i].GetErrno() == 0 {
			// What the mount answered, unless it changed the inode again
			// since (a later change time wins): the blocks stored, and
			// anything the answer could not know.
			o.meta.update(res[i].GetAttr())
			continue
		}
		lost = append(lost, op.Inos...)
		if op.Created != 0 {
			o.meta.caps.DropPending(op.Created)
		}
	}
	if len(lost) == 0 {
		return
	}
	o.meta.forgetAll()
	// The kernel is told in the background: a release may be waiting
	// for this batch with admissions stopped, while the kernel holds a
	// directory's lock for a call waiting to be admitted.
	go func() {
		if inv := o.invalidator(); inv != nil {
			for _, ino := range lost {
				inv.InvalidateData(ino)
			}
		}
		if r, ok := o.invalidator().(Resetter); ok {
			r.InvalidateAll()
		}
	}()
}

// stamped gives cmd the time the mount answered it with, which the cluster
// then sets.
func stamped(cmd *pb.Command, now time.Time) *pb.Command {
	cmd.StampNs = now.UnixNano()
	return cmd
}

// keepJournaled keeps what f's journaled writes made of its new file as
// the file's data cache window, at close: the file reads back from memory,
// as one written through write-behind does (keepWritten).
func (o *ClientOps) keepJournaled(f *openFile) {
	if !f.journaled.Load() || !o.sharedCache() {
		return
	}
	f.mu.Lock()
	data := slices.Clone(f.jdata)
	f.mu.Unlock()
	if len(data) > 0 && len(data) < raWindow {
		if a, ok := o.meta.attr(f.ino); ok && a.Size == uint64(len(data)) {
			o.cache.put(f.ino, 0, data)
		}
	}
}
