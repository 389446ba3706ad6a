package fsops

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// DefaultOpTimeout is how long an operation waits for the cluster before
// it fails with EIO.
const DefaultOpTimeout = 30 * time.Second

// Options tune ClientOps.
type Options struct {
	// OpTimeout bounds every operation (DefaultOpTimeout when 0).
	OpTimeout time.Duration
	// WritebackCache says the kernel caches writes and sends them later
	// at offsets it chose: it may read through a write-only descriptor and
	// it places O_APPEND writes itself, so write-only opens are served
	// read-write and O_APPEND is not passed to the cluster. Appends from
	// two mounts can then overwrite each other.
	WritebackCache bool
	// KernelChecksData says the kernel drops a file's pages itself when
	// the attributes it gets show a change (FUSE_AUTO_INVAL_DATA, which
	// go-fuse asks for and bazil.org/fuse cannot): with capabilities,
	// change events then need not reach the kernel (watch.go, skipHeld).
	KernelChecksData bool
	// SyncWrites commits every write before acknowledging it, instead of
	// collecting sequential writes (see write-behind in writebehind.go).
	SyncWrites bool
	// DataCache is how many bytes of file data the mount keeps to answer
	// later reads through any handle while the change stream is open
	// (datacache.go); 0 keeps only what readahead needs, for the handle
	// that fetched it.
	DataCache int64
	// Relatime records the reads the mount serves as accesses, which
	// move atime under the relatime rule (atime.go); off, atime moves
	// only when set explicitly (noatime).
	Relatime bool
	// Buffered answers metadata changes in directories the mount holds
	// exclusively at once and commits them in batches (buffered.go);
	// it needs a client made WithCaps. Journal bounds the batches.
	Buffered bool
	Journal  client.JournalOptions
}

// ClientOps implements Ops over a MemoryFS client.
type ClientOps struct {
	c   *client.Client
	opt Options
	// watching is true while change events from the cluster are being
	// applied to the kernel cache (see Watch); only then may an open keep
	// the file's cached pages.
	watching atomic.Bool

	capMiss  *inoSet
	noXattrs *inoSet
	cache    *dataCache
	acc      *accessor
	reads    atomic.Int64 // read RPCs sent to the cluster (tests)
	// betweenReads, when set (tests), runs between the two reads an
	// answer of the written size makes (writtenAttr).
	betweenReads func()

	// With capabilities (the client was made WithCaps): the metadata
	// cache (nil without), the kernel's invalidator for recalls, and
	// the handles opened without the cluster (capops.go).
	meta       *metaCache
	inv        atomic.Pointer[Invalidator]
	localNext  atomic.Uint64
	localOpens atomic.Int64

	fetches fetchSet   // GETATTRs being answered (watch.go)
	told    kernelTold // what the kernel may answer about by itself

	filesMu  sync.Mutex
	files    map[uint64]map[uint64]*openFile // guarded by filesMu: ino → handle → file
	byHandle map[uint64]*openFile            // guarded by filesMu
	attrs    map[uint64]*attrState           // guarded by filesMu: held attribute changes (attrbehind.go)

	// With Options.Buffered: the journal of operations answered here
	// and not yet committed (buffered.go), nil without.
	jr     *client.Journal
	excl   exclusiveTries
	unsent atomic.Int64 // bytes acknowledged by write-behind, all handles, not yet committed

	locks lockOwners // who took file locks through this mount (locks.go)

	stats struct { // counters for Stats
		metaHits, metaMisses, windowReads, recalls atomic.Uint64
	}
}

var _ Ops = (*ClientOps)(nil)

// New returns the operations over c. The caller keeps ownership of c.
func New(c *client.Client, opt Options) *ClientOps {
	if opt.OpTimeout <= 0 {
		opt.OpTimeout = DefaultOpTimeout
	}
	o := &ClientOps{
		c: c, opt: opt,
		capMiss:  newInoSet(capMissTTL),
		noXattrs: newInoSet(noXattrTTL),
		cache:    newDataCache(opt.DataCache),
		acc:      newAccessor(),
		files:    map[uint64]map[uint64]*openFile{},
		byHandle: map[uint64]*openFile{},
		attrs:    map[uint64]*attrState{},
	}
	o.excl.refused = map[uint64]time.Time{}
	if caps := c.Caps(); caps != nil {
		o.meta = newMetaCache(caps)
		caps.OnRecall(o.recalled)
		caps.OnLost(o.lost)
		caps.OnRelease(o.releasing)
		if opt.Buffered {
			if jr, err := c.StartJournal(opt.Journal); err == nil {
				o.jr = jr
				jr.OnCommit(o.committedBatch)
			}
		}
	}
	return o
}

// maxNameLen is the longest name the cluster takes (NAME_MAX).
const maxNameLen = 255

// maxLinks is the most names the cluster gives one inode (fsm).
const maxLinks = 65000

// Open-flag bits the cluster understands (Linux values).
const (
	oAccMode = syscall.O_ACCMODE
	oPassed  = oAccMode | syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC | syscall.O_APPEND
)

// bound applies the operation time limit.
func (o *ClientOps) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, o.opt.OpTimeout)
}

// attrOf converts the cluster's attributes.
func attrOf(a *pb.Attr) Attr {
	return Attr{
		Ino: a.GetIno(), Mode: a.GetMode(), Nlink: a.GetNlink(), Uid: a.GetUid(), Gid: a.GetGid(),
		Size: a.GetSize(), Blocks: a.GetBlocks(),
		Atime: time.Unix(0, a.GetAtimeNs()), Mtime: time.Unix(0, a.GetMtimeNs()), Ctime: time.Unix(0, a.GetCtimeNs()),
		Gen: a.GetGeneration(), Rdev: uint32(a.GetRdev()),
	}
}

func entry(parent uint64, name string) *pb.Loc {
	return &pb.Loc{Parent: parent, Name: name, Nofollow: true}
}

func inode(ino uint64) *pb.Loc { return &pb.Loc{Ino: ino, Nofollow: true} }

// errNoAttr is a command result without the attributes it should carry.
var errNoAttr = errors.New("fsops: the cluster returned no attributes")

// Lookup implements Ops.
func (o *ClientOps) Lookup(ctx context.Context, parent uint64, name string) (a Attr, e syscall.Errno) {
	if len(name) > maxNameLen {
		// What the cluster answers, also where a cached listing would
		// say "absent".
		return Attr{}, syscall.ENAMETOOLONG
	}
	ctx, cancel := o.bound(ctx)
	defer cancel()
	if o.meta.on() {
		if a, e, ok := o.cachedLookup(ctx, parent, name); ok {
			o.stats.metaHits.Add(1)
			return a, e
		}
	}
	o.stats.metaMisses.Add(1)
	start := o.meta.now()
	pa, err := o.c.Lookup(ctx, parent, name)
	if err != nil {
		return Attr{}, errnoOf("lookup", err)
	}
	o.seen(pa)
	o.meta.putAttr(pa, start)
	if o.dirty(pa.GetIno()) {
		// The size may predate writes already acknowledged.
		return o.GetAttr(ctx, pa.GetIno())
	}
	return attrOf(pa), 0
}

// GetAttr implements Ops.
func (o *ClientOps) GetAttr(ctx context.Context, ino uint64) (a Attr, e syscall.Errno) {
	defer o.fetches.begin(ino)()
	if a, ok, e := o.heldAttr(ctx, ino); ok || e != 0 {
		return a, e
	}
	if a, ok := o.meta.attr(ino); ok && !o.dirty(ino) {
		o.stats.metaHits.Add(1)
		return a, 0
	}
	if a, ok := o.writtenAttr(ino); ok {
		o.stats.metaHits.Add(1)
		return a, 0
	}
	o.stats.metaMisses.Add(1)
	o.barrier(ino)
	if o.meta.on() {
		// One bound for the grant and the query together.
		ctx, cancel := o.bound(ctx)
		defer cancel()
		o.grantOne(ctx, ino)
		return o.clusterAttr(ctx, ino)
	}
	return o.clusterAttr(ctx, ino)
}

// cachedLookup answers a lookup from parent's cached listing, filling it
// first if need be; ok is false when the cluster must answer.
func (o *ClientOps) cachedLookup(ctx context.Context, parent uint64, name string) (Attr, syscall.Errno, bool) {
	ent, found, ok := o.meta.lookup(parent, name)
	if !ok {
		o.fillDir(ctx, parent)
		if ent, found, ok = o.meta.lookup(parent, name); !ok {
			return Attr{}, 0, false
		}
	}
	if !found {
		return Attr{}, syscall.ENOENT, true
	}
	if a, ok := o.meta.attr(ent.Ino); ok && !o.dirty(ent.Ino) {
		return a, 0, true
	}
	return Attr{}, 0, false
}

// SetAttr implements Ops. A change of mode, owner or explicit times to a
// file this mount has open may be held back and committed with the
// file's writes (see attrbehind.go).
func (o *ClientOps) SetAttr(ctx context.Context, ino uint64, in SetAttrIn) (a Attr, e syscall.Errno) {
	if in.SetSize && in.Size > pb.MaxFileSize {
		// The kernel allows any size below 2^63 on a FUSE mount.
		return Attr{}, syscall.EFBIG
	}
	if a, ok := o.bufSetAttr(ino, in); ok {
		return a, 0
	}
	if isLocal(in.Handle) {
		// Opened without the cluster: by inode. The handle a recall
		// pinned the file with is read-only (it only keeps the inode
		// alive), and a truncate through it is refused; the kernel has
		// checked that this descriptor may write.
		in.Handle = 0
	}
	if a, ok, e := o.deferSetAttr(ctx, ino, in); ok || e != 0 {
		return a, e
	}
	o.barrier(ino)
	defer o.dropWindows(ino)
	ctx, cancel := o.bound(ctx)
	defer cancel()
	start := o.meta.commit(ino)
	pa, err := o.c.SetAttr(ctx, setAttrCmd(ino, in))
	o.meta.committed(ino, pa, start)
	if err != nil {
		return Attr{}, errnoOf("setattr", err)
	}
	if pa == nil {
		return o.GetAttr(ctx, ino)
	}
	return attrOf(pa), 0
}

// setAttrCmd is the cluster's command for in.
func setAttrCmd(ino uint64, in SetAttrIn) *pb.SetAttrCmd {
	cmd := &pb.SetAttrCmd{Loc: inode(ino), Mode: in.Mode, Uid: in.Uid, Gid: in.Gid, Size: int64(in.Size), Handle: in.Handle}
	set := func(on bool, bit pb.SetAttrBit) {
		if on {
			cmd.Valid |= uint32(bit)
		}
	}
	set(in.SetMode, pb.SetAttrBit_SET_MODE)
	set(in.SetUid, pb.SetAttrBit_SET_UID)
	set(in.SetGid, pb.SetAttrBit_SET_GID)
	set(in.SetSize, pb.SetAttrBit_SET_SIZE)
	set(in.SetAtime && in.AtimeNow, pb.SetAttrBit_SET_ATIME_NOW)
	set(in.SetAtime && !in.AtimeNow, pb.SetAttrBit_SET_ATIME)
	set(in.SetMtime && in.MtimeNow, pb.SetAttrBit_SET_MTIME_NOW)
	set(in.SetMtime && !in.MtimeNow, pb.SetAttrBit_SET_MTIME)
	if in.SetAtime && !in.AtimeNow {
		cmd.AtimeNs = in.Atime.UnixNano()
	}
	if in.SetMtime && !in.MtimeNow {
		cmd.MtimeNs = in.Mtime.UnixNano()
	}
	return cmd
}

// Access implements Ops with the classic owner/group/other check. The
// caller's supplementary groups are not known here; with
// default_permissions the kernel does this check itself and never asks.
func (o *ClientOps) Access(ctx context.Context, ino uint64, mask uint32, c Caller) (e syscall.Errno) {
	a, e := o.GetAttr(ctx, ino)
	if e != 0 {
		return e
	}
	return accessCheck(a, mask&7, c)
}

// accessCheck decides access(2) for mask (R=4, W=2, X=1) from the mode.
func accessCheck(a Attr, mask uint32, c Caller) syscall.Errno {
	if mask == 0 {
		return 0
	}
	if c.Uid == 0 {
		// root may do anything except execute a file nobody may execute.
		if mask&1 != 0 && !a.IsDir() && a.Mode&0o111 == 0 {
			return syscall.EACCES
		}
		return 0
	}
	perm := a.Mode & 7
	switch {
	case c.Uid == a.Uid:
		perm = a.Mode >> 6 & 7
	case c.Gid == a.Gid:
		perm = a.Mode >> 3 & 7
	}
	if perm&mask != mask {
		return syscall.EACCES
	}
	return 0
}

// openFlags turns the kernel's open flags into the cluster's.
func (o *ClientOps) openFlags(flags int) uint32 {
	f := flags & oPassed
	if o.opt.WritebackCache {
		if f&oAccMode == syscall.O_WRONLY {
			f = f&^oAccMode | syscall.O_RDWR
		}
		f &^= syscall.O_APPEND
	}
	return uint32(f)
}

// Open implements Ops.
func (o *ClientOps) Open(ctx context.Context, ino uint64, flags int, c Caller) (out OpenOut, e syscall.Errno) {
	o.barrier(ino)
	ctx, cancel := o.bound(ctx)
	defer cancel()
	f := o.openFlags(flags &^ syscall.O_CREAT)
	if out, ok := o.openLocal(ino, f); ok {
		return out, 0
	}
	h, _, err := o.c.OpenLoc(ctx, inode(ino), f, 0, c.Uid, c.Gid, false, false)
	if err != nil {
		return OpenOut{}, errnoOf("open", err)
	}
	if f&syscall.O_TRUNC != 0 {
		o.dropWindows(ino)
		o.meta.forgetAttr(ino)
	}
	o.register(newOpenFile(ino, h, f&syscall.O_APPEND != 0))
	return OpenOut{Handle: h, KeepCache: o.keepCache(ino)}, 0
}

// keepCache reports whether the kernel may keep the pages it cached of ino
// at an open: while the change stream is received and, with
// capabilities, while the mount holds one on ino. Without one, pages the
// kernel read may have been changed by another client since, which a
// recall would have dropped but a change event reports only after the
// change committed: a program that takes a lock another host just gave
// up could read the file as it was before the other host wrote it (with
// go-fuse the kernel compares its pages with the attributes too; with
// bazil it does not).
func (o *ClientOps) keepCache(ino uint64) bool {
	return o.watching.Load() && (!o.meta.on() || o.meta.caps.Held(ino))
}

// Create implements Ops.
func (o *ClientOps) Create(ctx context.Context, parent uint64, name string, flags int, mode uint32, c Caller) (a Attr, out OpenOut, e syscall.Errno) {
	ctx, cancel := o.bound(ctx)
	defer cancel()
	f := o.openFlags(flags) | syscall.O_CREAT
	o.wantExclusive(ctx, parent)
	if a, ok, e := o.bufCreate(ctx, parent, name, newKind{mode: syscall.S_IFREG | mode&0o7777}, c); ok {
		if e != 0 && (e != syscall.EEXIST || f&syscall.O_EXCL != 0) {
			return Attr{}, OpenOut{}, e
		}
		if e == 0 {
			h := localBit | o.localNext.Add(1)
			nf := newOpenFile(a.Ino, h, f&syscall.O_APPEND != 0)
			nf.journaled.Store(true)
			o.register(nf)
			return a, OpenOut{Handle: h, KeepCache: o.keepCache(a.Ino)}, 0
		}
	}
	if o.meta.on() {
		defer o.meta.caps.Expect()()
	}
	defer o.meta.changes(parent)()
	res, err := o.c.Do(ctx, &pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{
		Loc: entry(parent, name), Flags: f, Mode: mode & 0o7777, Uid: c.Uid, Gid: c.Gid,
	}}})
	if err != nil {
		o.meta.forget(parent) // it may have been applied
		return Attr{}, OpenOut{}, errnoOf("create", err)
	}
	h, pa := res.GetHandle(), res.GetAttr()
	o.createdHere(parent, name, res, 0)
	a = attrOf(pa)
	out = OpenOut{Handle: h, KeepCache: o.keepCache(a.Ino)}
	if pa == nil {
		if a, e = o.Lookup(ctx, parent, name); e != 0 {
			_ = o.c.CloseHandle(ctx, h)
			return Attr{}, OpenOut{}, e
		}
	}
	if f&syscall.O_EXCL != 0 {
		// A file this call made has no xattrs: the kernel's
		// security.capability check before the first write (see
		// inoSet) needs no round trip.
		o.capMiss.add(a.Ino)
	}
	if f&syscall.O_TRUNC != 0 {
		o.dropWindows(a.Ino) // it may have existed, with data
	}
	o.register(newOpenFile(a.Ino, h, f&syscall.O_APPEND != 0))
	return a, out, 0
}

// Mknod implements Ops: a regular file, FIFO, socket or device node in
// one command. Opening a special file is the kernel's business.
func (o *ClientOps) Mknod(ctx context.Context, parent uint64, name string, mode, rdev uint32, c Caller) (a Attr, e syscall.Errno) {
	if o.meta.on() {
		defer o.meta.caps.Expect()()
	}
	defer o.meta.changes(parent)()
	res, e := o.do(ctx, "mknod", &pb.Command{Op: &pb.Command_Mknod{Mknod: &pb.MknodCmd{
		Loc: entry(parent, name), Mode: mode, Rdev: uint64(rdev), Uid: c.Uid, Gid: c.Gid,
	}}})
	o.createdHere(parent, name, res, e)
	if e != 0 {
		return Attr{}, e
	}
	return o.created(ctx, "mknod", res, parent, name)
}

// Read implements Ops.
func (o *ClientOps) Read(ctx context.Context, ino, handle uint64, off int64, dst []byte) (n int, e syscall.Errno) {
	o.barrier(ino)
	ctx, cancel := o.bound(ctx)
	defer cancel()
	var ok bool
	var err error
	if f := o.file(handle); f != nil {
		n, ok, err = o.readWindowed(ctx, f, off, dst)
	}
	if !ok {
		n, ok, err = o.readCached(ctx, ino, handle, off, dst)
	}
	if ok {
		if err != nil {
			return 0, errnoOf("read", err)
		}
		o.stats.windowReads.Add(1)
		o.accessed(ino)
		return n, 0
	}
	o.reads.Add(1)
	if h := o.serverHandle(handle); h != 0 {
		n, err = o.c.ReadHandle(ctx, h, off, dst)
	} else {
		n, err = o.c.ReadIno(ctx, ino, off, dst)
	}
	if err != nil {
		return 0, errnoOf("read", err)
	}
	o.accessed(ino)
	return n, 0
}

// Write implements Ops; data is copied if it is kept after Write returns.
// A sequential write is acknowledged once collected (see writebehind.go);
// the failure of an earlier background commit is reported here and at
// close.
func (o *ClientOps) Write(ctx context.Context, ino, handle uint64, off int64, data []byte) (n int, e syscall.Errno) {
	f := o.file(handle)
	if f == nil || !f.append {
		// The kernel checks writes against 2^63-1 on a FUSE mount, so the
		// cluster's limit is checked here as the kernel checks a local
		// file system's: a write that would cross it is cut short there,
		// one that starts at it is EFBIG. An append's end is where the
		// cluster finds it, which refuses one crossing the limit.
		if off >= pb.MaxFileSize {
			return 0, syscall.EFBIG
		}
		if room := pb.MaxFileSize - off; int64(len(data)) > room {
			data = data[:room]
		}
	}
	if f != nil && !f.append {
		// Only what the write covers, or the end of the file it may
		// extend, goes stale: a sequential writer's earlier windows
		// (keepWritten) stay for its readers.
		o.dropWindowsRange(ino, off, off+int64(len(data)))
	} else {
		o.dropWindows(ino) // an append lands wherever the end is
	}
	if o.hasHeld(ino) {
		// Held attribute changes were made before this write and go to
		// the cluster first, so that the write still moves the mtime.
		o.barrier(ino)
	}
	if f != nil {
		if err := f.peekErr(); err != nil {
			return 0, errnoOf("write", err)
		}
		if n, ok := o.bufWrite(f, off, data); ok {
			f.wrote.Store(time.Now().UnixNano())
			return n, 0
		}
		if o.collectHeld(ctx, f, off, data) {
			f.wrote.Store(time.Now().UnixNano())
			return len(data), 0
		}
	}
	ctx, cancel := o.bound(ctx)
	defer cancel()
	var err error
	var pa *pb.Attr
	start := o.meta.commit(ino)
	switch {
	case handle != 0 && !isLocal(handle):
		n, pa, err = o.c.WriteHandle(ctx, handle, off, data)
	case f != nil && f.append:
		// Opened without the cluster (a buffered create) with O_APPEND:
		// the end is where the cluster finds it, as through a handle.
		n, pa, err = o.c.AppendIno(ctx, ino, data)
	default:
		n, pa, err = o.c.WriteIno(ctx, ino, off, data)
	}
	o.dropWindows(ino)
	o.meta.committed(ino, pa, start)
	if err != nil {
		return 0, errnoOf("write", err)
	}
	return n, 0
}

// Lseek implements Ops. The cluster answers from the chunks it stores, so
// what this mount holds of the file is committed first.
func (o *ClientOps) Lseek(ctx context.Context, ino, _ uint64, off int64, whence int) (pos int64, e syscall.Errno) {
	var hole bool
	switch whence {
	case seekData:
	case seekHole:
		hole = true
	default:
		return 0, syscall.EINVAL
	}
	if off < 0 {
		return 0, syscall.ENXIO
	}
	o.barrier(ino)
	ctx, cancel := o.bound(ctx)
	defer cancel()
	if err := o.syncJournal(ctx, ino); err != nil {
		return 0, errnoOf("lseek", err)
	}
	pos, err := o.c.SeekIno(ctx, ino, off, hole)
	if err != nil {
		return 0, errnoOf("lseek", err)
	}
	return pos, 0
}

// lseek(2)'s whence values for data and holes (Linux).
const (
	seekData = 3
	seekHole = 4
)

// Flush implements Ops: the handle's collected writes are committed, and
// the first failure among them is returned (to close(2)).
func (o *ClientOps) Flush(_ context.Context, _, handle uint64) (e syscall.Errno) {
	f := o.file(handle)
	if f == nil {
		return 0
	}
	o.drain(f)
	_ = o.commitHeld(f.ino) // a failure is recorded on f
	if err := f.takeErr(); err != nil {
		return client.Errno(err)
	}
	if o.buffering() {
		o.keepJournaled(f)
		return client.Errno(o.jr.TakeErr(f.ino))
	}
	return 0
}

// Fsync implements Ops: it returns once every write to ino acknowledged by
// this mount is committed to a majority of the cluster (and, unless the
// cluster is ephemeral, in their fsynced logs).
func (o *ClientOps) Fsync(_ context.Context, ino uint64) (e syscall.Errno) {
	o.barrier(ino)
	if err := o.syncJournal(context.Background(), ino); err != nil {
		return client.Errno(err)
	}
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	for _, f := range o.files[ino] {
		if err := f.takeErr(); err != nil {
			return client.Errno(err)
		}
	}
	return 0
}

// Release implements Ops: the last close of the handle.
func (o *ClientOps) Release(ctx context.Context, ino, handle uint64) (e syscall.Errno) {
	o.releaseOFDLocks(ctx, ino, handle)
	if f := o.file(handle); f != nil {
		o.drain(f)
		o.retire(f)
		if err := f.takeErr(); err != nil {
			errnoOf("release", err)
		}
	}
	ctx, cancel := o.bound(context.WithoutCancel(ctx))
	defer cancel()
	if h := o.serverHandle(handle); h != 0 {
		if err := o.c.CloseHandle(ctx, h); err != nil {
			return errnoOf("release", err)
		}
	}
	return 0
}

// ReadDir implements Ops.
func (o *ClientOps) ReadDir(ctx context.Context, ino uint64) (ents []DirEntry, e syscall.Errno) {
	return o.readDir(ctx, ino, false)
}

// ReadDirPlus implements Ops: entries carry their attributes, except those
// of inodes this mount has acknowledged writes or attribute changes to not
// yet committed (the cluster's size would be older than what the program
// was told), which the kernel then looks up as usual.
func (o *ClientOps) ReadDirPlus(ctx context.Context, ino uint64) (ents []DirEntry, e syscall.Errno) {
	return o.readDir(ctx, ino, true)
}

func (o *ClientOps) readDir(ctx context.Context, ino uint64, plus bool) ([]DirEntry, syscall.Errno) {
	ctx, cancel := o.bound(ctx)
	defer cancel()
	if o.meta.on() {
		ents, ok := o.meta.list(ino)
		if !ok {
			o.fillDir(ctx, ino)
			ents, ok = o.meta.list(ino)
		}
		if ok {
			if plus {
				for i := 2; i < len(ents); i++ {
					if a, ok := o.meta.attr(ents[i].Ino); ok && !o.dirty(ents[i].Ino) {
						ents[i].Attr = &a
					}
				}
			}
			return ents, 0
		}
	}
	list := o.c.ReadDirIno
	var dirty map[uint64]bool
	if plus {
		list = o.c.ReadDirPlusIno
		// Dirty before the query or after it: a write acknowledged
		// before may be committed only after the query read the size;
		// the kernel itself discards attributes older than writes made
		// after it sent the request.
		dirty = o.dirtyInodes()
	}
	des, err := list(ctx, ino)
	if err != nil {
		return nil, errnoOf("readdir", err)
	}
	if plus {
		maps.Copy(dirty, o.dirtyInodes())
	}
	// readdir(3) lists "." and ".." first, as tmpfs does; the cluster's
	// listing leaves them out. The parent's inode costs one lookup; if
	// it fails (the directory was just removed), ".." names the
	// directory itself, as it does for the root.
	parent, err := o.parentOf(ctx, ino)
	if err != nil {
		parent = ino
	}
	ents := make([]DirEntry, 0, len(des)+2)
	ents = append(ents,
		DirEntry{Name: ".", Ino: ino, Mode: syscall.S_IFDIR},
		DirEntry{Name: "..", Ino: parent, Mode: syscall.S_IFDIR})
	for _, d := range des {
		de := DirEntry{Name: d.GetName(), Ino: d.GetIno(), Mode: d.GetMode()}
		pa := d.GetAttr()
		o.seen(pa)
		if pa != nil && !dirty[de.Ino] {
			a := attrOf(pa)
			de.Attr = &a
		}
		ents = append(ents, de)
	}
	return ents, 0
}

// parentOf is the inode of directory ino's parent (the root's is itself).
func (o *ClientOps) parentOf(ctx context.Context, ino uint64) (uint64, error) {
	if ino == RootIno {
		return ino, nil
	}
	pa, err := o.c.Lookup(ctx, ino, "..")
	if err != nil {
		return 0, err
	}
	return pa.GetIno(), nil
}

// do runs one command under the operation time limit and returns the
// attributes it reports.
func (o *ClientOps) do(ctx context.Context, op string, cmd *pb.Command) (*pb.Result, syscall.Errno) {
	ctx, cancel := o.bound(ctx)
	defer cancel()
	res, err := o.c.Do(ctx, cmd)
	if err != nil {
		return nil, errnoOf(op, err)
	}
	return res, 0
}

// created returns the attributes a creating command reported, or looks the
// new entry up when it reported none.
func (o *ClientOps) created(ctx context.Context, op string, res *pb.Result, parent uint64, name string) (Attr, syscall.Errno) {
	if a := res.GetAttr(); a != nil {
		return attrOf(a), 0
	}
	a, e := o.Lookup(ctx, parent, name)
	if e != 0 {
		return Attr{}, errnoOf(op, errors.Join(errNoAttr, e))
	}
	return a, 0
}

// Mkdir implements Ops.
func (o *ClientOps) Mkdir(ctx context.Context, parent uint64, name string, mode uint32, c Caller) (a Attr, e syscall.Errno) {
	o.wantExclusive(ctx, parent)
	if a, ok, e := o.bufCreate(ctx, parent, name, newKind{mode: syscall.S_IFDIR | mode&0o7777}, c); ok {
		return a, e
	}
	if o.meta.on() {
		defer o.meta.caps.Expect()()
	}
	defer o.meta.changes(parent)()
	res, e := o.do(ctx, "mkdir", &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{
		Loc: entry(parent, name), Mode: mode & 0o7777, Uid: c.Uid, Gid: c.Gid,
	}}})
	o.createdHere(parent, name, res, e)
	if e != 0 {
		return Attr{}, e
	}
	return o.created(ctx, "mkdir", res, parent, name)
}

// sticky enforces the restricted deletion flag (S_ISVTX on a directory):
// only root, the directory's owner or the entry's owner may remove or
// rename the entry. The kernel would check this itself, but bazil.org/fuse
// drops the sticky bit from the modes it reports, so the kernel never sees
// it. The two lookups are made only for unprivileged callers. Without the
// entry there is nothing to protect, and the operation reports ENOENT.
func (o *ClientOps) sticky(ctx context.Context, parent uint64, name string, c Caller) syscall.Errno {
	if c.Uid == 0 {
		return 0
	}
	dir, e := o.GetAttr(ctx, parent)
	if e != 0 || dir.Mode&syscall.S_ISVTX == 0 || dir.Uid == c.Uid {
		return e
	}
	ent, e := o.Lookup(ctx, parent, name)
	switch {
	case e == syscall.ENOENT:
		return 0
	case e != 0:
		return e
	case ent.Uid != c.Uid:
		return syscall.EPERM
	}
	return 0
}

// Rmdir implements Ops.
func (o *ClientOps) Rmdir(ctx context.Context, parent uint64, name string, c Caller) (e syscall.Errno) {
	if e = o.sticky(ctx, parent, name, c); e != 0 {
		return e
	}
	o.wantExclusive(ctx, parent)
	if ok, e := o.bufRemove(parent, name, true); ok {
		return e
	}
	defer o.meta.changes(parent)()
	_, e = o.do(ctx, "rmdir", &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: entry(parent, name), DirOnly: true}}})
	o.removedHere(parent, name, e)
	return e
}

// Unlink implements Ops. An inode unlinked while open here stays readable
// through its handles: the cluster keeps it until the last one closes.
func (o *ClientOps) Unlink(ctx context.Context, parent uint64, name string, c Caller) (e syscall.Errno) {
	if e = o.sticky(ctx, parent, name, c); e != 0 {
		return e
	}
	o.wantExclusive(ctx, parent)
	if ok, e := o.bufRemove(parent, name, false); ok {
		return e
	}
	o.pinEntry(ctx, parent, name)
	defer o.meta.changes(parent)()
	_, e = o.do(ctx, "unlink", &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: entry(parent, name), FileOnly: true}}})
	o.removedHere(parent, name, e)
	o.staleViews() // the removed inode's nlink and ctime changed
	return e
}

// Rename implements Ops; the cluster replaces a target atomically.
func (o *ClientOps) Rename(ctx context.Context, parent uint64, name string, newParent uint64, newName string, c Caller) (e syscall.Errno) {
	if e = o.sticky(ctx, parent, name, c); e != 0 {
		return e
	}
	if e = o.sticky(ctx, newParent, newName, c); e != 0 {
		return e
	}
	o.wantExclusive(ctx, parent, newParent)
	if ok, e := o.bufRename(parent, name, newParent, newName); ok {
		return e
	}
	o.pinEntry(ctx, newParent, newName)
	defer o.meta.changes(parent, newParent)()
	_, e = o.do(ctx, "rename", &pb.Command{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{
		Src: entry(parent, name), Dst: entry(newParent, newName),
	}}})
	o.renamedHere(parent, name, newParent, newName, e)
	o.staleViews() // a replaced target lost a link; the renamed inode has a new ctime
	return e
}

// Symlink implements Ops.
func (o *ClientOps) Symlink(ctx context.Context, parent uint64, name, target string, c Caller) (a Attr, e syscall.Errno) {
	o.wantExclusive(ctx, parent)
	if a, ok, e := o.bufCreate(ctx, parent, name, newKind{mode: syscall.S_IFLNK | 0o777, target: target}, c); ok {
		return a, e
	}
	if o.meta.on() {
		defer o.meta.caps.Expect()()
	}
	defer o.meta.changes(parent)()
	res, e := o.do(ctx, "symlink", &pb.Command{Op: &pb.Command_Symlink{Symlink: &pb.SymlinkCmd{
		Loc: entry(parent, name), Target: target, Uid: c.Uid, Gid: c.Gid,
	}}})
	o.createdHere(parent, name, res, e)
	if e != 0 {
		return Attr{}, e
	}
	return o.created(ctx, "symlink", res, parent, name)
}

// Readlink implements Ops.
func (o *ClientOps) Readlink(ctx context.Context, ino uint64) (t string, e syscall.Errno) {
	if t, ok := o.meta.target(ino); ok {
		return t, 0
	}
	start := o.meta.now()
	res, e := o.query(ctx, "readlink", &pb.Query{Q: &pb.Query_Readlink{Readlink: &pb.ReadlinkQuery{Loc: inode(ino)}}})
	if e != 0 {
		return "", e
	}
	o.meta.putTarget(ino, res.GetTarget(), start)
	return res.GetTarget(), 0
}

// Link implements Ops.
func (o *ClientOps) Link(ctx context.Context, ino, newParent uint64, newName string) (a Attr, e syscall.Errno) {
	o.barrier(ino)
	o.wantExclusive(ctx, newParent)
	if a, ok, e := o.bufLink(ino, newParent, newName); ok {
		return a, e
	}
	defer o.meta.changes(newParent)()
	res, e := o.do(ctx, "link", &pb.Command{Op: &pb.Command_Link{Link: &pb.LinkCmd{
		Src: inode(ino), Dst: entry(newParent, newName),
	}}})
	o.meta.forgetAttr(ino)
	o.meta.forget(newParent)
	o.staleViews() // the inode gained a link
	if e != 0 {
		return Attr{}, e
	}
	return o.created(ctx, "link", res, newParent, newName)
}

// query runs one read under the operation time limit.
func (o *ClientOps) query(ctx context.Context, op string, q *pb.Query) (*pb.Result, syscall.Errno) {
	ctx, cancel := o.bound(ctx)
	defer cancel()
	res, err := o.c.Query(ctx, q)
	if err != nil {
		return nil, errnoOf(op, err)
	}
	return res, 0
}

// POSIX ACLs reach a FUSE file system as the xattrs system.posix_acl_access
// and system.posix_acl_default. The cluster keeps modes only: storing an
// ACL as an opaque value would leave the mode unchanged while programs
// believe it set (cp -a sets modes this way). Refusing them with
// EOPNOTSUPP is what a file system without ACLs does, and programs then
// fall back to chmod.
func isACL(name string) bool {
	return name == "system.posix_acl_access" || name == "system.posix_acl_default"
}

// GetXattr implements Ops.
func (o *ClientOps) GetXattr(ctx context.Context, ino uint64, name string) (v []byte, e syscall.Errno) {
	if isACL(name) {
		return nil, syscall.EOPNOTSUPP
	}
	if o.noXattrs.has(ino) || o.meta.noXattrs(ino) || name == capXattr && o.capMiss.has(ino) {
		return nil, syscall.ENODATA
	}
	res, e := o.query(ctx, "getxattr", &pb.Query{Q: &pb.Query_GetXattr{GetXattr: &pb.GetXattrQuery{Loc: inode(ino), Name: name}}})
	if e == syscall.ENODATA && name == capXattr {
		o.capMiss.add(ino)
	}
	if e != 0 {
		return nil, e
	}
	if res.GetData() == nil {
		return []byte{}, 0
	}
	return res.GetData(), 0
}

// ListXattr implements Ops.
func (o *ClientOps) ListXattr(ctx context.Context, ino uint64) (names []string, e syscall.Errno) {
	if o.noXattrs.has(ino) || o.meta.noXattrs(ino) {
		return nil, 0
	}
	res, e := o.query(ctx, "listxattr", &pb.Query{Q: &pb.Query_ListXattr{ListXattr: &pb.ListXattrQuery{Loc: inode(ino)}}})
	if e != 0 {
		return nil, e
	}
	return slices.DeleteFunc(slices.Clone(res.GetNames()), isACL), 0
}

// SetXattr implements Ops.
func (o *ClientOps) SetXattr(ctx context.Context, ino uint64, name string, value []byte, flags uint32) (e syscall.Errno) {
	if isACL(name) {
		return syscall.EOPNOTSUPP
	}
	defer o.forgetXattrs(ino)
	_, e = o.do(ctx, "setxattr", &pb.Command{Op: &pb.Command_SetXattr{SetXattr: &pb.SetXattrCmd{
		Loc: inode(ino), Name: name, Value: value, Flags: flags & (XattrCreate | XattrReplace),
	}}})
	return e
}

// RemoveXattr implements Ops.
func (o *ClientOps) RemoveXattr(ctx context.Context, ino uint64, name string) (e syscall.Errno) {
	if isACL(name) {
		return syscall.EOPNOTSUPP
	}
	defer o.forgetXattrs(ino)
	_, e = o.do(ctx, "removexattr", &pb.Command{Op: &pb.Command_RemoveXattr{RemoveXattr: &pb.RemoveXattrCmd{Loc: inode(ino), Name: name}}})
	return e
}

// unlimitedBytes is the size statfs reports for a cluster without a
// memory budget, so that df and installers see room.
const unlimitedBytes = 1 << 50

// Statfs implements Ops.
func (o *ClientOps) Statfs(ctx context.Context) (out StatfsOut, e syscall.Errno) {
	ctx, cancel := o.bound(ctx)
	defer cancel()
	st, err := o.c.Statfs(ctx)
	if err != nil {
		return StatfsOut{}, errnoOf("statfs", err)
	}
	return statfsOf(st), 0
}

func statfsOf(st *pb.Statfs) StatfsOut {
	bs := uint64(st.GetBlockSize())
	if bs == 0 {
		bs = 4096
	}
	total, free := st.GetTotalBytes(), st.GetFreeBytes()
	if total == 0 {
		total = unlimitedBytes
		free = total - min(st.GetPhysicalBytes(), total)
	}
	nameLen := st.GetMaxNameLen()
	if nameLen == 0 {
		nameLen = maxNameLen
	}
	return StatfsOut{
		BlockSize: uint32(bs), Blocks: total / bs, BlocksFree: free / bs,
		Files: st.GetFiles(), FilesFree: 1 << 32, NameLen: nameLen,
	}
}
