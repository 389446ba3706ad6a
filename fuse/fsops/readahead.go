package fsops

import (
	"bytes"
	"context"
	pb "github.com/memoryfs/memfs/memfspb"
	"sync"
)

// Readahead. The kernel reads ahead of a sequential reader in requests of
// 128 KiB (the bazil limit), several at once. Each would be a round trip
// to the leader; instead a handle fetches aligned windows of raWindow
// bytes, one request each, and answers the kernel's requests from them.
// Windows are kept in the mount's data cache (datacache.go).
//
// Only large requests use windows: small ones are random reads, for which
// a window would fetch far more than asked. A reader that moves through
// the file window after window gets raAhead windows fetched ahead of the
// one it reads, so that several window RPCs are in flight and each
// overlaps the kernel's copying of the previous ones; a single window
// ahead left the reader waiting for every fetch in turn. A large read
// that jumps (random access with big requests) fetches only its own
// window.
//
// A window must never serve data older than a change this mount knows of.
// Every commit of a write or truncate through this mount, once answered,
// and every change event from the cluster drop the inode's windows
// (dropWindows); a window whose fetch began before such a drop is marked
// stale and not used. Reads drain the inode's collected writes before
// looking at windows, so a window never predates an acknowledged write.

const (
	raWindow  = 1 << 20 // one read RPC (pb.MaxMessageData)
	raMinRead = 64 << 10
	raAhead   = 2 // windows fetched ahead of a sequential reader
	// raMaxAlive is how many windows one sequential reader needs alive:
	// those ahead, and enough behind for the kernel's requests, which
	// arrive out of order and up to two windows at once. Keeping only
	// three evicted windows still being read, and refetched them: 162
	// window RPCs for a 128 MiB sequential read, against 132 with six.
	raMaxAlive = raAhead + 4
)

// raState is a handle's readahead state.
type raState struct {
	mu       sync.Mutex
	seen     bool  // guarded by mu: a window has been read
	last     int64 // guarded by mu: start of the window read last
	furthest int64 // guarded by mu: start of the furthest window of the current run
}

// sequential records a read in the window at start and reports whether
// the reader is moving through the file: its first window is the file's
// first, or it is at most one window away from the last one read or from
// the furthest one of its run. The kernel sends a sequential reader's
// requests several at once and out of order, so a step back of one window
// still counts; any other jump starts a new run.
func (r *raState) sequential(start int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	near := func(x int64) bool { return start >= x-raWindow && start <= x+raWindow }
	seq := !r.seen && start == 0 || r.seen && (near(r.last) || near(r.furthest))
	switch {
	case !seq:
		r.furthest = start
	case start > r.furthest:
		r.furthest = start
	}
	r.seen, r.last = true, start
	return seq
}

// dropWindows forgets ino's cached windows: their data may be stale.
func (o *ClientOps) dropWindows(ino uint64) {
	o.staleHeld(ino)
	o.cache.drop(ino)
	o.forgetAccess(ino)
}

// staleHeld marks the attributes that ino's held changes were answered
// with as stale, as its data is.
func (o *ClientOps) staleHeld(ino uint64) {
	o.filesMu.Lock()
	if s := o.attrs[ino]; s != nil {
		s.gen.Add(1)
	}
	o.filesMu.Unlock()
}

// dropWindowsRange is dropWindows for a write of this mount of [off, end),
// which leaves the windows it cannot have changed as they were
// (dataCache.dropRange).
func (o *ClientOps) dropWindowsRange(ino uint64, off, end int64) {
	o.staleHeld(ino)
	o.cache.dropRange(ino, off, end)
	o.forgetAccess(ino)
}

// keepWritten keeps what a write of this mount committed at off (begun at
// start, see metaCache.commit) as data cache windows: the aligned whole
// windows it covers, and the last, short one when the write ended the
// file. Only while the mount holds a capability on the file that was not
// recalled since the write began: then nobody else changed those bytes,
// and a recall after this drops the windows again. A sequential writer's
// file thus reads back from memory.
func (o *ClientOps) keepWritten(f *openFile, off int64, buf []byte, a *pb.Attr, start uint64) {
	if !o.meta.on() || !o.sharedCache() || a == nil {
		return
	}
	ino, end := f.ino, off+int64(len(buf))
	o.meta.whileUnchanged(ino, f.handle, start, func(newest uint64, alone bool) {
		for ws := (off + raWindow - 1) &^ (raWindow - 1); ws < end; ws += raWindow {
			we := min(ws+raWindow, end)
			// A partial window only where this write ended the file, no
			// later write of the handle has extended it since, and none
			// is in flight: a later write applied after this one may
			// already have answered and dropped its range, and a short
			// window kept after that would answer its bytes with the end
			// of the file (the kernel then shrinks the file to it).
			if we-ws < raWindow && (!alone || uint64(we) != a.GetSize() || newest > uint64(we)) {
				break
			}
			data := buf[ws-off : we-off : we-off]
			if cap(buf) > 2*len(data) {
				// Most of the buffer is not this window's: keeping a
				// slice would keep all of it.
				data = bytes.Clone(data)
			}
			o.cache.put(ino, ws, data)
		}
	})
}

// dropAllWindows is dropWindows for every inode, for when change events
// may have been missed.
func (o *ClientOps) dropAllWindows() {
	o.filesMu.Lock()
	for _, s := range o.attrs {
		s.gen.Add(1)
	}
	o.filesMu.Unlock()
	o.cache.clear()
	o.forgetAccess(0)
}

// sharedCache reports whether windows fetched by one handle may answer
// another's reads (see datacache.go).
func (o *ClientOps) sharedCache() bool {
	return o.opt.DataCache > 0 && o.watching.Load()
}

// sharedWindow reports whether ino's windows may answer any handle's
// reads. With capabilities only while ino's holds: another mount may
// acknowledge writes to a file before they commit, under an exclusive
// capability, so no change event would tell this mount its windows went
// stale; a read without a capability goes to the cluster, whose answer
// recalls that capability first.
func (o *ClientOps) sharedWindow(ino uint64) bool {
	return o.sharedCache() && (!o.meta.on() || o.meta.caps.Held(ino))
}

// readCached answers a read from a window already held or being fetched,
// without starting a fetch: small reads are random reads, for which a
// window would fetch far more than asked. ok is false when the read must
// go to the cluster.
func (o *ClientOps) readCached(ctx context.Context, ino, handle uint64, off int64, dst []byte) (n int, ok bool, err error) {
	start := off &^ (raWindow - 1)
	if off < 0 || off+int64(len(dst)) > start+raWindow {
		return 0, false, nil
	}
	w := o.cache.lookup(ino, start)
	if w == nil {
		return 0, false, nil
	}
	return o.readFrom(ctx, w, handle, off, dst, false)
}

// readFrom copies what w holds at off into dst once w is fetched; ok is
// false when w may not answer (dataCache.usable; mine: this read started
// its fetch).
func (o *ClientOps) readFrom(ctx context.Context, w *window, handle uint64, off int64, dst []byte, mine bool) (n int, ok bool, err error) {
	select {
	case <-w.done:
	case <-ctx.Done():
		return 0, true, ctx.Err()
	}
	if !o.cache.usable(w, handle, o.sharedWindow(w.ino), mine) {
		return 0, false, nil
	}
	if rel := off - w.off; rel < int64(len(w.data)) {
		n = copy(dst, w.data[rel:])
	}
	return n, true, nil
}

// readWindowed answers a large read from f's windows, fetching the
// window(s) it needs and starting the next ones. ok is false when the read
// must go to the cluster directly.
func (o *ClientOps) readWindowed(ctx context.Context, f *openFile, off int64, dst []byte) (n int, ok bool, err error) {
	if len(dst) < raMinRead || len(dst) > raWindow || off < 0 {
		return 0, false, nil
	}
	start := off &^ (raWindow - 1)
	if off+int64(len(dst)) > start+raWindow {
		return 0, false, nil // spans two windows: rare, read it directly
	}
	w, mine := o.window(f, start)
	seq := f.ra.sequential(start)
	n, ok, err = o.readFrom(ctx, w, f.handle, off, dst, mine)
	if ok && err == nil && seq && w.held && len(w.data) == raWindow {
		// Not at the end: the reader will want the next ones.
		for i := int64(1); i <= raAhead; i++ {
			if next, _ := o.window(f, start+i*raWindow); next.short() {
				break // the end of the file: nothing lies past it
			}
		}
	}
	return n, ok, err
}

// window returns ino's window at start, starting its fetch through f if
// the cache has none f may read (and then reports it did).
func (o *ClientOps) window(f *openFile, start int64) (*window, bool) {
	held := func() bool { return !o.meta.on() || o.meta.caps.Held(f.ino) }
	return o.cache.window(f.ino, start, f.handle, o.sharedCache(), held, func(w *window) {
		ctx, cancel := o.bound(context.Background())
		defer cancel()
		buf := make([]byte, raWindow)
		o.reads.Add(1)
		var n int
		var err error
		if h := o.serverHandle(f.handle); h != 0 {
			n, err = o.c.ReadHandle(ctx, h, start, buf)
		} else {
			n, err = o.c.ReadIno(ctx, f.ino, start, buf)
		}
		w.data, w.err = buf[:n], err
	})
}
