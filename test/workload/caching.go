package workload

import (
	"context"
	"fmt"
	"math/rand"
	"path"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/fuse/fsops"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/test/model"
)

// A caching reader is what a FUSE mount with capabilities does: lookup,
// getattr, readdir, open and read go through an fsops.ClientOps over a
// client made client.WithCaps, whose metadata cache answers them without
// the cluster while its capabilities hold (fuse/fsops/metacache.go). No
// kernel is involved: the Ops methods are called directly, and each
// operation's invocation and response are taken around those calls, so the
// checker judges what the cache answered, against the same model as the
// plain clients' operations.
//
// It only issues operations that are one atomic step in the mount:
//   - data files: size by getattr of the file's inode or by lookup of its
//     name in its directory, and open(O_RDONLY) + read;
//   - namespace groups: lookup of a top-level name (stat: type and
//     permission bits, or ENOENT) and a listing of the group directory.
//
// With Writes > 0 that share of its operations change things through the
// mount, whose own changes edit its cache instead of being recalled from
// it: appends and positional writes (open, write, flush: the write-behind
// buffer is committed by the flush, inside the recorded interval), and
// create (O_EXCL), mkdir and rename of top-level names of a group.
//
// Paths below the top level are left out: the mount resolves a/x with two
// lookups, which is not atomic against renames (neither is the kernel's
// path walk), so their answers need not be linearizable. So are remove
// (the mount has unlink and rmdir, and which one applies takes a lookup)
// and chmod (a setattr by inode, found by a lookup), except that a
// buffering reader removes (see CachingReader.remove for how its answers
// stay sound).
//
// A reader over a mount that buffers (NewBufferingReaders) has its
// answers held until a sync of the journal confirms them (buffering.go),
// makes its changes in a group in bursts, and syncs as one of its
// operations.

// CacheStats count what the caching readers of a run did.
type CacheStats struct {
	// Ops are the operations the caching readers recorded; Local those
	// during which their client made no call to the cluster at all
	// (answered from the cache; a keepalive or release falling inside an
	// operation hides it, so this is a lower bound).
	Ops, Local atomic.Int64
	// Recalls counts inodes the readers lost to recalls, revocations or
	// a reopened change stream (client.Caps.OnRecall).
	Recalls atomic.Int64
	// Freezes and Kills count the nemesis's episodes against the readers.
	Freezes, Kills atomic.Int64
	// What the buffering ones did (buffering.go).
	BufferStats
}

func (s *CacheStats) String() string {
	out := fmt.Sprintf("caching readers: %d ops, %d answered locally, %d inodes recalled; %d freezes, %d kills",
		s.Ops.Load(), s.Local.Load(), s.Recalls.Load(), s.Freezes.Load(), s.Kills.Load())
	if s.Syncs.Load() > 0 || s.Confirmed.Load()+s.Voided.Load() > 0 {
		out += "; " + s.BufferStats.String()
	}
	return out
}

// maxLocalPause bounds the pause after an answer from the cache.
const maxLocalPause = 2 * time.Millisecond

// CachingReader is one sequential stream of operations, reads but for the
// Writes share, through an fsops.ClientOps over a caching client.
type CachingReader struct {
	ID   int    // porcupine client id, unique per history
	Name string // the client's endpoint in the Net
	C    *client.Client
	Ops  *fsops.ClientOps

	cfg Config
	rec *model.Recorder
	rng *rand.Rand
	// pauses draws think times, apart from rng so that the operations
	// drawn do not depend on which were answered locally.
	pauses *rand.Rand
	st     *Stats
	cs     *CacheStats

	inos map[string]uint64 // keys' inodes (data files, groups) and their directories'
	n    int               // tokens written

	// conf holds the answers of a buffering client until a sync settles
	// them (buffering.go); nil for a caching client that does not buffer.
	conf *confirmer
	// A buffering reader's change in a group starts a burst: up to
	// maxBurst-1 more operations in the same group, changes and reads,
	// without think time, as a program unpacking files does. Plain
	// clients' reads of the group recall its exclusive capability
	// within milliseconds, so changes one at a time would rarely find
	// it still held; in a burst the later ones are answered from it.
	burstKey string
	burst    int

	// Writes is the share of operations that change things (see above).
	Writes float64
}

// syncShare is the share of a buffering reader's operations that sync its
// client's journal (as an fsync would), so that its answers are confirmed
// during the history and not only at its end.
const syncShare = 0.05

// maxBurst bounds a buffering reader's bursts (see CachingReader.burst).
const maxBurst = 10

// NewCachingReader makes reader id over c, which must have been made
// client.WithCaps; its choices follow cfg.Seed and id. It registers its
// recall counter, so call it before c's first grant.
func NewCachingReader(id int, name string, c *client.Client, cfg Config, rec *model.Recorder, st *Stats, cs *CacheStats) *CachingReader {
	return NewCachingReaders(id, 1, name, c, cfg, rec, st, cs)[0]
}

// NewCachingReaders makes n readers, ids firstID..firstID+n-1, over one
// fsops.ClientOps over c: concurrent streams through one mount, as the
// kernel sends a mount concurrent requests.
func NewCachingReaders(firstID, n int, name string, c *client.Client, cfg Config, rec *model.Recorder, st *Stats, cs *CacheStats) []*CachingReader {
	return newCachingReaders(firstID, n, name, c, fsops.Options{}, cfg, rec, st, cs)
}

// NewBufferingReaders is NewCachingReaders over a mount that buffers
// (fsops.Options{Buffered: true}, with jopt bounding its journal's
// batches). Their answers enter the history once a sync confirms them
// (buffering.go); a share of their operations is such a sync (Sync).
func NewBufferingReaders(firstID, n int, name string, c *client.Client, jopt client.JournalOptions, cfg Config, rec *model.Recorder, st *Stats, cs *CacheStats) []*CachingReader {
	return newCachingReaders(firstID, n, name, c, fsops.Options{Buffered: true, Journal: jopt}, cfg, rec, st, cs)
}

func newCachingReaders(firstID, n int, name string, c *client.Client, opt fsops.Options, cfg Config, rec *model.Recorder, st *Stats, cs *CacheStats) []*CachingReader {
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	// The operation time limit is the context's (cfg.OpTimeout); the
	// mount's own bound must not cut it shorter.
	opt.OpTimeout = time.Minute
	ops := fsops.New(c, opt)
	if caps := c.Caps(); caps != nil {
		caps.OnRecall(func(inos []uint64) { cs.Recalls.Add(int64(len(inos))) })
	}
	var conf *confirmer
	if opt.Buffered {
		// fsops.New started the client's journal.
		if jr := c.Journal(); jr != nil {
			conf = newConfirmer(jr, rec, cs)
		}
	}
	out := make([]*CachingReader, n)
	for i := range out {
		id := firstID + i
		out[i] = &CachingReader{ID: id, Name: name, C: c, Ops: ops, cfg: cfg, rec: rec, st: st, cs: cs, conf: conf,
			rng:    rand.New(rand.NewSource(cfg.Seed*7919 + int64(id))),
			pauses: rand.New(rand.NewSource(cfg.Seed*7907 + int64(id))),
			inos:   map[string]uint64{}}
	}
	return out
}

// Killed tells a buffering reader that its client was killed, as the
// nemesis does: every answer not yet confirmed is voided, and so is every
// later one (buffering.go).
func (r *CachingReader) Killed() {
	if r.conf != nil {
		r.conf.kill()
	}
}

// Buffering reports whether r's mount buffers.
func (r *CachingReader) Buffering() bool { return r.conf != nil }

// Sync commits the journal of r's client and confirms the answers it can
// (buffering.go): nil when every answer that returned before it is now in
// the history as it returned. Nothing for a reader that does not buffer.
func (r *CachingReader) Sync(ctx context.Context) error {
	if r.conf == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	return r.conf.sync(ctx)
}

// Watch follows the change stream as the mount does (fsops.ClientOps.Watch,
// with nothing to invalidate) until ctx ends.
func (r *CachingReader) Watch(ctx context.Context) { r.Ops.Watch(ctx, noKernel{}) }

type noKernel struct{}

func (noKernel) InvalidateAttr(uint64)          {}
func (noKernel) InvalidateData(uint64)          {}
func (noKernel) InvalidateEntry(uint64, string) {}

// via is how a caching reader performs a model operation.
type via uint8

const (
	viaGetAttr     via = iota // KindSize: getattr of the inode
	viaLookup                 // KindSize, KindStat: lookup of the name in its directory
	viaOpenRead               // KindRead: open(O_RDONLY), read, release
	viaReadDir                // KindReadDir of a group
	viaReadDirPlus            // the same through readdirplus
	viaWrite                  // KindWrite, KindAppend: open(O_WRONLY[|O_APPEND]), write, flush, release
	viaCreate                 // KindCreate: create(O_EXCL), release
	viaMkdir                  // KindMkdir
	viaRename                 // KindRename of top-level names
	viaRemove                 // KindRemove of a top-level name: lookup, then unlink or rmdir (buffering readers)
	viaSync                   // no model operation: a sync of a buffering client's journal
)

// CachedOp is one operation of a caching reader.
type CachedOp struct {
	In  model.Input
	Via via
}

// Size, Read, Stat and List are a caching reader's operations, for tests
// that script them: the size of data file key by getattr (or, with
// lookup, by a lookup of its name), its whole contents by open and read,
// a lookup of the top-level name of group key, and the group's listing.
func Size(key string, lookup bool) CachedOp {
	op := CachedOp{In: model.Input{Kind: model.KindSize, Key: key}, Via: viaGetAttr}
	if lookup {
		op.Via = viaLookup
	}
	return op
}

func Read(key string) CachedOp {
	return CachedOp{In: model.Input{Kind: model.KindRead, Key: key, Len: 1 << 20}, Via: viaOpenRead}
}

func Stat(key, name string) CachedOp {
	return CachedOp{In: model.Input{Kind: model.KindStat, Key: key, Path: name}, Via: viaLookup}
}

func List(key string) CachedOp {
	return CachedOp{In: model.Input{Kind: model.KindReadDir, Key: key}, Via: viaReadDir}
}

// Change is a change through the mount, for tests that script one: a
// write or append to a data file, or a create, mkdir or rename of
// top-level names of a group.
func Change(in model.Input) CachedOp {
	op := CachedOp{In: in}
	switch in.Kind {
	case model.KindWrite, model.KindAppend:
		op.Via = viaWrite
	case model.KindCreate:
		op.Via = viaCreate
	case model.KindMkdir:
		op.Via = viaMkdir
	case model.KindRename:
		op.Via = viaRename
	case model.KindRemove:
		op.Via = viaRemove
	default:
		panic("workload: not a change a caching reader makes: " + in.Kind.String())
	}
	return op
}

// Run performs operations until ctx ends or MaxOps are done.
func (r *CachingReader) Run(ctx context.Context) {
	for i := 0; r.cfg.MaxOps == 0 || i < r.cfg.MaxOps; i++ {
		if ctx.Err() != nil {
			return
		}
		a := r.Do(ctx, r.Next())
		if r.burst > 0 {
			continue // a burst runs without think time
		}
		pause := r.cfg.Pause
		if a.Local && pause < maxLocalPause {
			// The cache answers in microseconds: without a pause one
			// reader would record hundreds of thousands of operations a
			// second, which says no more and costs the checker.
			pause = maxLocalPause
		}
		if pause > 0 {
			wait(ctx, time.Duration(r.pauses.Int63n(int64(pause))))
		}
	}
}

// Next draws the next random operation; the sequence depends only on the
// seed and the reader's id.
func (r *CachingReader) Next() CachedOp {
	share := r.cfg.DataShare
	switch {
	case r.cfg.Groups == 0:
		share = 1
	case r.cfg.DataFiles == 0:
		share = 0
	case share == 0:
		share = 0.5
	}
	// Drawn only when buffering (writing), so that a reader that does
	// not draws the sequence it always did.
	if r.conf != nil && r.rng.Float64() < syncShare {
		return CachedOp{Via: viaSync}
	}
	if r.burst > 0 {
		r.burst--
		if r.rng.Intn(3) == 0 {
			return r.groupRead(r.burstKey)
		}
		return r.groupChange(r.burstKey)
	}
	write := r.Writes > 0 && r.rng.Float64() < r.Writes
	if r.rng.Float64() < share {
		key := r.cfg.DataKey(r.rng.Intn(r.cfg.DataFiles))
		if write {
			if r.rng.Intn(2) == 0 {
				return CachedOp{In: model.Input{Kind: model.KindAppend, Key: key, Data: r.token("a")}, Via: viaWrite}
			}
			return CachedOp{In: model.Input{Kind: model.KindWrite, Key: key, Off: int64(r.rng.Intn(48)), Data: r.token("w")}, Via: viaWrite}
		}
		switch k := r.rng.Intn(100); {
		case k < 35:
			return CachedOp{In: model.Input{Kind: model.KindSize, Key: key}, Via: viaGetAttr}
		case k < 60:
			return CachedOp{In: model.Input{Kind: model.KindSize, Key: key}, Via: viaLookup}
		default:
			in := model.Input{Kind: model.KindRead, Key: key, Len: 1 << 20}
			if r.rng.Intn(4) == 0 {
				in.Off, in.Len = int64(r.rng.Intn(64)), 1+r.rng.Intn(32)
			}
			return CachedOp{In: in, Via: viaOpenRead}
		}
	}
	key := r.cfg.GroupKey(r.rng.Intn(r.cfg.Groups))
	if write {
		if r.conf != nil {
			r.burstKey, r.burst = key, r.rng.Intn(maxBurst)
		}
		return r.groupChange(key)
	}
	return r.groupRead(key)
}

// groupChange draws a create, mkdir or rename of top-level names of group
// key, or, for a buffering reader, a remove (which frees names: with three
// of them a group is soon full, and every create and mkdir fails).
func (r *CachingReader) groupChange(key string) CachedOp {
	name := model.Top[r.rng.Intn(len(model.Top))]
	kinds := 3
	if r.conf != nil {
		kinds = 4
	}
	switch k := r.rng.Intn(kinds); k {
	case 3:
		return CachedOp{In: model.Input{Kind: model.KindRemove, Key: key, Path: name}, Via: viaRemove}
	case 0:
		return CachedOp{In: model.Input{Kind: model.KindCreate, Key: key, Path: name, Perm: perms[r.rng.Intn(len(perms))]}, Via: viaCreate}
	case 1:
		return CachedOp{In: model.Input{Kind: model.KindMkdir, Key: key, Path: name, Perm: 0o755}, Via: viaMkdir}
	default:
		to := model.Top[r.rng.Intn(len(model.Top))]
		return CachedOp{In: model.Input{Kind: model.KindRename, Key: key, Path: name, Path2: to}, Via: viaRename}
	}
}

// groupRead draws a lookup of a top-level name of group key or a listing
// of it.
func (r *CachingReader) groupRead(key string) CachedOp {
	switch k := r.rng.Intn(100); {
	case k < 60:
		return CachedOp{In: model.Input{Kind: model.KindStat, Key: key, Path: model.Top[r.rng.Intn(len(model.Top))]}, Via: viaLookup}
	case k < 80:
		return CachedOp{In: model.Input{Kind: model.KindReadDir, Key: key}, Via: viaReadDir}
	default:
		return CachedOp{In: model.Input{Kind: model.KindReadDir, Key: key}, Via: viaReadDirPlus}
	}
}

func (r *CachingReader) token(kind string) string {
	r.n++
	return fmt.Sprintf("<%s%d.%d>", kind, r.ID, r.n)
}

// ReadAll reads every key once. It returns the reads that failed other
// than definitely.
func (r *CachingReader) ReadAll(ctx context.Context) []string {
	var failed []string
	read := func(op CachedOp) {
		a := r.Do(ctx, op)
		// A handle opened in a session that then expired (a 2 s lease
		// does, across a crash of every node) fails with ESTALE, and so
		// does a command first sent in it; the next attempt opens
		// another in the new session. Both failures are left out of the
		// history.
		for k := 0; k < 3 && a.Errno == syscall.ESTALE; k++ {
			a = r.Do(ctx, op)
		}
		if a.Errno != 0 && a.Out.Err == 0 {
			failed = append(failed, fmt.Sprintf("caching reader %d (%s): %s: %v", r.ID, r.Name,
				model.Describe(op.In, model.Output{Unknown: true}), a.Errno))
		}
	}
	for i := 0; i < r.cfg.DataFiles; i++ {
		k := r.cfg.DataKey(i)
		read(Read(k))
		read(Size(k, true))
	}
	for i := 0; i < r.cfg.Groups; i++ {
		k := r.cfg.GroupKey(i)
		read(List(k))
		for _, t := range model.Top {
			read(Stat(k, t))
		}
	}
	return failed
}

// Answer is what one operation of a caching reader returned.
type Answer struct {
	Out   model.Output
	Errno syscall.Errno
	// Local is true when the client made no call to the cluster during
	// the operation: the cache answered.
	Local bool
}

// Do runs op and records it.
func (r *CachingReader) Do(ctx context.Context, op CachedOp) Answer {
	if op.Via == viaSync {
		_ = r.Sync(ctx) // a failure voids what it must (buffering.go)
		return Answer{}
	}
	octx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	if err := r.prepare(octx, op.In.Key); err != nil {
		return Answer{Errno: client.Errno(err)} // nothing was invoked
	}
	r.st.Ops.Add(1)
	r.cs.Ops.Add(1)
	before := r.C.Calls()
	call := r.rec.Begin(r.ID, op.In)
	out, e, after := r.invoke(octx, op)
	ans := Answer{Out: out, Errno: e}
	read := op.In.Kind.IsRead()
	switch {
	case e == 0:
		r.end(call, out)
		r.st.OK.Add(1)
		if r.C.Calls() == before {
			ans.Local = true
			r.cs.Local.Add(1)
			if r.conf != nil && !read {
				r.cs.Answered.Add(1)
			}
		}
	case read && (e == syscall.ENOENT || e == syscall.ENOTDIR),
		!read && !op.In.Kind.IsData() && definite[e]:
		// Definite answers. Data files and groups always exist, so for
		// them the model refuses ENOENT: a cache that lost a name fails
		// the check instead of being dropped as a failed read.
		ans.Out = model.Output{Err: e}
		r.end(call, ans.Out)
		r.st.Failed.Add(1)
		if r.conf != nil && !read && r.C.Calls() == before {
			r.cs.Answered.Add(1)
		}
	case read:
		call.Discard()
		r.st.Discarded.Add(1)
	default:
		call.End(model.Output{Unknown: true})
		r.st.Unknown.Add(1)
	}
	if after != nil {
		after()
	}
	return ans
}

// end records an answer: at once, or, from a buffering client, once a
// sync settles it (buffering.go). Answers of unknown outcome and dropped
// reads need no settling: they claim nothing.
func (r *CachingReader) end(call *model.Call, out model.Output) {
	if r.conf != nil {
		r.conf.hold(call, out)
		return
	}
	call.End(out)
}

// prepare resolves, before anything is recorded, the inodes of a key and
// of its directory: they never change (data files and groups are never
// renamed or removed).
func (r *CachingReader) prepare(ctx context.Context, key string) error {
	if _, ok := r.inos[key]; ok {
		return nil
	}
	cc := r.C.WithContext(ctx)
	dir, err := cc.Stat(path.Dir(key))
	if err != nil {
		return err
	}
	fi, err := cc.Stat(key)
	if err != nil {
		return err
	}
	r.inos[path.Dir(key)] = dir.Sys().(*pb.Attr).GetIno()
	r.inos[key] = fi.Sys().(*pb.Attr).GetIno()
	return nil
}

var root = fsops.Caller{}

// invoke performs op through the Ops; after, when not nil, is to be
// called once the response is recorded (a release).
func (r *CachingReader) invoke(ctx context.Context, op CachedOp) (model.Output, syscall.Errno, func()) {
	in, ino := op.In, r.inos[op.In.Key]
	switch op.Via {
	case viaGetAttr:
		a, e := r.Ops.GetAttr(ctx, ino)
		return model.Output{N: int64(a.Size)}, e, nil
	case viaLookup:
		parent, name := r.inos[path.Dir(in.Key)], path.Base(in.Key)
		if in.Kind == model.KindStat {
			parent, name = ino, in.Path
		}
		a, e := r.Ops.Lookup(ctx, parent, name)
		if in.Kind == model.KindSize {
			return model.Output{N: int64(a.Size)}, e, nil
		}
		return model.Output{Dir: a.IsDir(), Perm: a.Mode & 0o777}, e, nil
	case viaOpenRead:
		h, e := r.Ops.Open(ctx, ino, syscall.O_RDONLY, root)
		if e != 0 {
			return model.Output{}, e, nil
		}
		buf := make([]byte, in.Len)
		n, e := r.Ops.Read(ctx, ino, h.Handle, in.Off, buf)
		return model.Output{Data: string(buf[:n])}, e, r.release(ino, h.Handle)
	case viaReadDir, viaReadDirPlus:
		list := r.Ops.ReadDir
		if op.Via == viaReadDirPlus {
			list = r.Ops.ReadDirPlus
		}
		ents, e := list(ctx, ino)
		out := model.Output{}
		for _, ent := range ents {
			if ent.Name == "." || ent.Name == ".." {
				continue
			}
			name := ent.Name
			if ent.Mode&syscall.S_IFMT == syscall.S_IFDIR {
				name += "/"
			}
			out.Names = append(out.Names, name)
		}
		return out, e, nil
	case viaWrite:
		flags := syscall.O_WRONLY
		if in.Kind == model.KindAppend {
			flags |= syscall.O_APPEND
		}
		h, e := r.Ops.Open(ctx, ino, flags, root)
		if e != 0 {
			return model.Output{}, e, nil
		}
		n, e := r.Ops.Write(ctx, ino, h.Handle, in.Off, []byte(in.Data))
		if e == 0 {
			// The write may only have been collected: the flush
			// commits it, inside the recorded interval.
			e = r.Ops.Flush(ctx, ino, h.Handle)
		}
		return model.Output{N: int64(n)}, e, r.release(ino, h.Handle)
	case viaCreate:
		a, h, e := r.Ops.Create(ctx, ino, in.Path, syscall.O_WRONLY|syscall.O_EXCL, in.Perm, root)
		if e != 0 {
			return model.Output{}, e, nil
		}
		return model.Output{}, 0, r.release(a.Ino, h.Handle)
	case viaMkdir:
		_, e := r.Ops.Mkdir(ctx, ino, in.Path, in.Perm, root)
		return model.Output{}, e, nil
	case viaRename:
		return model.Output{}, r.Ops.Rename(ctx, ino, in.Path, ino, in.Path2, root), nil
	case viaRemove:
		return model.Output{}, r.remove(ctx, ino, in.Path), nil
	}
	return model.Output{}, syscall.EINVAL, nil
}

// remove is MemoryFS's delete through the mount: a lookup says whether
// the name is a directory, then rmdir or unlink, both inside the recorded
// interval. An ENOENT of either, and ENOTEMPTY, are what a remove at that
// moment answers. When the name changed type in between (EISDIR from
// unlink, ENOTDIR from rmdir) nothing was removed, but the model's remove
// would have removed it: the answer is made one of unknown outcome
// (EAGAIN is not definite), which is always sound.
func (r *CachingReader) remove(ctx context.Context, dir uint64, name string) syscall.Errno {
	a, e := r.Ops.Lookup(ctx, dir, name)
	if e != 0 {
		return e
	}
	if a.IsDir() {
		e = r.Ops.Rmdir(ctx, dir, name, root)
	} else {
		e = r.Ops.Unlink(ctx, dir, name, root)
	}
	if e == syscall.EISDIR || e == syscall.ENOTDIR {
		return syscall.EAGAIN
	}
	return e
}

// release closes a handle once the operation is recorded. The mount's
// release does not stop at its context's end (the handle must be closed
// even when the caller gave up) but retries for the mount's time limit, a
// minute here, which a killed client's release spends in full; the reader
// waits 2 s at most and leaves the rest to the background.
func (r *CachingReader) release(ino, h uint64) func() {
	return func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = r.Ops.Release(context.Background(), ino, h)
		}()
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
	}
}
