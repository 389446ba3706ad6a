package fsops

import (
	"context"
	"sync"
)

// Readahead. The kernel reads ahead of a sequential reader in requests of
// 128 KiB (the bazil limit), several at once. Each would be a round trip
// to the leader; instead a handle fetches aligned windows of raWindow
// bytes, one request each, and answers the kernel's requests from them.
// The kernel's page cache keeps the data; a window only lives until it has
// been read through.
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
// (dropWindows); a window whose fetch began before such a drop is not used
// (the generation check). Reads drain the inode's collected writes before
// looking at windows, so a window never predates an acknowledged write.

const (
	raWindow  = 1 << 20 // one read RPC (pb.MaxMessageData)
	raMinRead = 64 << 10
	raAhead   = 2 // windows fetched ahead of a sequential reader
	// raMaxAlive is how many windows a handle keeps: those ahead, and
	// enough behind for the kernel's requests, which arrive out of order
	// and up to two windows at once. Keeping only three evicted windows
	// still being read, and refetched them: 162 window RPCs for a 128 MiB
	// sequential read, against 132 with six.
	raMaxAlive = raAhead + 4
)

// window is one fetched (or being fetched) aligned range of a file.
type window struct {
	off  int64
	gen  uint64
	done chan struct{}
	data []byte // set before done is closed; shorter than raWindow at EOF
	err  error
}

// raState is a handle's readahead windows.
type raState struct {
	mu       sync.Mutex
	gen      uint64    // guarded by mu: bumped by every drop
	windows  []*window // guarded by mu: oldest first
	seen     bool      // guarded by mu: a window has been read
	last     int64     // guarded by mu: start of the window read last
	furthest int64     // guarded by mu: start of the furthest window of the current run
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

// dropWindows forgets every window of ino's handles: their data may be
// stale.
func (o *ClientOps) dropWindows(ino uint64) {
	o.filesMu.Lock()
	var fs []*openFile
	for _, f := range o.files[ino] {
		fs = append(fs, f)
	}
	if s := o.attrs[ino]; s != nil {
		// The attributes held changes were answered with are stale too.
		s.gen.Add(1)
	}
	o.filesMu.Unlock()
	for _, f := range fs {
		f.ra.mu.Lock()
		f.ra.gen++
		f.ra.windows = nil
		f.ra.mu.Unlock()
	}
}

// dropAllWindows is dropWindows for every inode open here, for when
// change events may have been missed.
func (o *ClientOps) dropAllWindows() {
	o.filesMu.Lock()
	inos := make([]uint64, 0, len(o.files))
	for ino := range o.files {
		inos = append(inos, ino)
	}
	o.filesMu.Unlock()
	for _, ino := range inos {
		o.dropWindows(ino)
	}
}

// readWindowed answers a large read from f's windows, fetching the
// window(s) it needs and starting the next one. ok is false when the read
// must go to the cluster directly.
func (o *ClientOps) readWindowed(ctx context.Context, f *openFile, off int64, dst []byte) (n int, ok bool, err error) {
	if len(dst) < raMinRead || len(dst) > raWindow || off < 0 {
		return 0, false, nil
	}
	start := off &^ (raWindow - 1)
	if off+int64(len(dst)) > start+raWindow {
		return 0, false, nil // spans two windows: rare, read it directly
	}
	w := o.window(f, start)
	seq := f.ra.sequential(start)
	select {
	case <-w.done:
	case <-ctx.Done():
		return 0, true, ctx.Err()
	}
	f.ra.mu.Lock()
	stale := w.gen != f.ra.gen
	f.ra.mu.Unlock()
	if w.err != nil || stale {
		return 0, false, nil
	}
	if seq && len(w.data) == raWindow {
		// Not at the end: the reader will want the next ones.
		for i := int64(1); i <= raAhead; i++ {
			o.window(f, start+i*raWindow)
		}
	}
	if rel := off - w.off; rel < int64(len(w.data)) {
		n = copy(dst, w.data[rel:])
	}
	return n, true, nil
}

// window returns f's window at start, starting its fetch if it has none.
func (o *ClientOps) window(f *openFile, start int64) *window {
	f.ra.mu.Lock()
	defer f.ra.mu.Unlock()
	for _, w := range f.ra.windows {
		if w.off == start {
			return w
		}
	}
	w := &window{off: start, gen: f.ra.gen, done: make(chan struct{})}
	if len(f.ra.windows) == raMaxAlive {
		f.ra.windows = f.ra.windows[1:]
	}
	f.ra.windows = append(f.ra.windows, w)
	go func() {
		defer close(w.done)
		ctx, cancel := o.bound(context.Background())
		defer cancel()
		buf := make([]byte, raWindow)
		n, err := o.c.ReadHandle(ctx, f.handle, start, buf)
		w.data, w.err = buf[:n], err
	}()
	return w
}
