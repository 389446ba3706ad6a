package fsops

import (
	"context"
	"slices"
	"syscall"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Write-behind. The kernel hands a sequential writer's data over in
// requests of at most 128 KiB (bazil) or 1 MiB (go-fuse) and waits for each
// before sending the next, so committing each through Raft on its own caps
// a stream at one commit per request. Instead, a handle collects
// contiguous writes into a buffer of up to writeBuf bytes, acknowledges
// them at once, and commits full buffers in the background, up to
// writeDepth at a time: one Raft entry per MiB and several in flight.
//
// What keeps this correct:
//   - Appending writes are never collected. Before a buffer is committed,
//     it waits for every commit in flight that overlaps it, so data for
//     the same bytes is committed in the order it was written; commits of
//     disjoint ranges may land in any order, with the same result.
//   - Every operation whose answer depends on the file's data or size
//     (getattr, lookup, setattr, read, open, link, fsync) first drains
//     the inode's buffers (barrier), so the kernel never sees a size
//     older than the writes it was told succeeded. The one exception,
//     an answer while attribute changes are held (attrbehind.go), adds
//     the collected writes to the size it reports instead.
//   - Flush (each close), Fsync and Release drain and report the first
//     error of a background commit, as NFS does. Another mount or client
//     sees the data once it is committed: at the latest when the writer
//     closes the file (close-to-open consistency).
//
// LOCK ORDERING: ClientOps.filesMu, then openFile.sendMu, then
// openFile.mu; openFile.errMu is a leaf. Only sendMu is held while waiting
// (for an overlapping commit or a free slot), and commits finish without
// taking it.

const (
	writeBuf   = 1 << 20 // the largest single-message write (pb.MaxMessageData)
	writeDepth = 16      // buffers of one handle being committed at once: 16 MiB in flight
)

// flightRange is the byte range of one commit in flight; done is closed
// when it has been answered.
type flightRange struct {
	off, end int64
	done     chan struct{}
}

// collectedEnd is the end of the furthest write to ino acknowledged and
// not yet committed (0 if none).
func (o *ClientOps) collectedEnd(ino uint64) uint64 {
	var end int64
	for _, f := range o.openFiles(ino) {
		f.mu.Lock()
		if len(f.buf) > 0 {
			end = max(end, f.bufOff+int64(len(f.buf)))
		}
		end = max(end, f.sending)
		for _, r := range f.ranges {
			end = max(end, r.end)
		}
		f.mu.Unlock()
	}
	return uint64(end)
}

// writtenAttr answers GETATTR of a file this mount holds exclusively and
// has acknowledged writes to that are not all committed, without a round
// trip: nobody else changes the file, so its attributes are the ones the
// cluster last gave with the writes applied, the size they extend it to
// and their time as mtime and ctime (later than the last ones the
// cluster gave, whatever the clocks: a program that compares times must
// see that the file changed). The commit then sets the cluster's clock's,
// a little later. ok is false when the cluster must be asked: held
// attribute changes, another command of this mount in flight.
func (o *ClientOps) writtenAttr(ino uint64) (Attr, bool) {
	if o.hasHeld(ino) || !o.dirty(ino) {
		return Attr{}, false
	}
	// The collected end first, the base after: a commit keeps its answer
	// as the base before its range goes (sendBuffered), so one that ends
	// in between is in one of the two. The other way round it could be in
	// neither, and the size answered older than a write it acknowledged.
	end := o.collectedEnd(ino)
	if o.betweenReads != nil {
		o.betweenReads()
	}
	a, ok := o.meta.writingBase(ino)
	if !ok {
		return Attr{}, false
	}
	a.Size = max(a.Size, end)
	var wrote int64
	for _, f := range o.openFiles(ino) {
		wrote = max(wrote, f.wrote.Load())
	}
	if wrote != 0 {
		t := time.Unix(0, wrote)
		if !t.After(a.Mtime) {
			t = a.Mtime.Add(time.Nanosecond)
		}
		a.Mtime, a.Ctime = t, t
	}
	return a, true
}

// barrier drains every handle of ino and commits its held attribute
// changes (attrbehind.go), in that order, so that what the cluster
// reports about ino includes everything acknowledged so far.
func (o *ClientOps) barrier(ino uint64) {
	for _, f := range o.openFiles(ino) {
		o.drain(f)
	}
	_ = o.commitHeld(ino) // a failure is recorded on the handles
}

// collect takes a write into f's buffer if it continues it, sending the
// buffer when full. It reports false when the write must go on its own
// (synchronously), after everything before it has been committed.
//
// Writes of one handle may arrive concurrently (the kernel sends the
// pieces of an O_DIRECT write, or a writeback cache's pages, all at once):
// between sending the old buffer and starting a new one another write may
// have started one, which must then be sent too, never replaced.
func (o *ClientOps) collect(f *openFile, off int64, data []byte) bool {
	if f.append || o.opt.SyncWrites {
		return false
	}
	if len(data) > writeBuf {
		o.sendBuffered(f)
		// Written synchronously: nothing in flight may land on it later.
		f.waitInflight()
		return false
	}
	for {
		f.mu.Lock()
		continues := len(f.buf) > 0 && off == f.bufOff+int64(len(f.buf)) && len(f.buf)+len(data) <= writeBuf
		switch {
		case continues:
			f.buf = append(f.buf, data...)
		case len(f.buf) == 0:
			f.buf = append(make([]byte, 0, writeBuf), data...)
			f.bufOff = off
		default:
			f.mu.Unlock()
			o.sendBuffered(f)
			continue
		}
		f.pending.Add(int64(len(data)))
		o.unsent.Add(int64(len(data)))
		full := len(f.buf) == writeBuf
		f.mu.Unlock()
		if full {
			// A whole buffer in one request (go-fuse sends up to 1 MiB)
			// is committed in the background like one filled piece by
			// piece.
			o.sendBuffered(f)
		}
		return true
	}
}

// sendBuffered starts committing f's buffer, waiting for a free slot.
func (o *ClientOps) sendBuffered(f *openFile) {
	f.sendMu.Lock()
	f.mu.Lock()
	buf, off := f.buf, f.bufOff
	f.buf = nil
	if len(buf) > 0 {
		f.sending = off + int64(len(buf))
	}
	f.mu.Unlock()
	if len(buf) == 0 {
		f.sendMu.Unlock()
		return
	}
	f.slots <- struct{}{}
	r := f.claim(off, off+int64(len(buf)))
	f.sendMu.Unlock()
	go func() {
		defer func() {
			// The range goes last: a drain waiting on it then finds the
			// bytes no longer pending and the slot free.
			f.pending.Add(-int64(len(buf)))
			o.unsent.Add(-int64(len(buf)))
			<-f.slots
			f.release(r)
		}()
		ctx, cancel := o.bound(context.Background())
		defer cancel()
		start := o.meta.commitBy(f.ino, f.handle)
		var n int
		var pa *pb.Attr
		var err error
		if isLocal(f.handle) {
			// Opened without the cluster (a buffered create): by inode.
			n, pa, err = o.c.WriteIno(ctx, f.ino, off, buf)
		} else {
			n, pa, err = o.c.WriteHandle(ctx, f.handle, off, buf)
		}
		// A read window fetched before this commit may hold the old bytes,
		// and cached attributes the old size and times.
		o.dropWindowsRange(f.ino, off, off+int64(len(buf)))
		if err == nil && n == len(buf) {
			o.keepWritten(f, off, buf, pa, start)
		}
		o.meta.committed(f.ino, pa, start)
		if err == nil && n != len(buf) {
			err = syscall.EIO
		}
		if err != nil {
			errnoOf("write-behind", err)
			f.setErr(err)
		}
	}()
}

// claim waits until no commit in flight overlaps [off, end) and records
// the range as in flight. The caller holds sendMu, so no other range can be
// claimed meanwhile.
func (f *openFile) claim(off, end int64) *flightRange {
	for {
		f.mu.Lock()
		var wait chan struct{}
		for _, r := range f.ranges {
			if r.off < end && off < r.end {
				wait = r.done
				break
			}
		}
		if wait == nil {
			r := &flightRange{off: off, end: end, done: make(chan struct{})}
			f.ranges = append(f.ranges, r)
			f.sending = 0 // now counted by its range
			f.mu.Unlock()
			return r
		}
		f.mu.Unlock()
		<-wait
	}
}

// release ends a commit's claim on its range.
func (f *openFile) release(r *flightRange) {
	f.mu.Lock()
	for i, x := range f.ranges {
		if x == r {
			f.ranges = append(f.ranges[:i], f.ranges[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
	close(r.done)
}

// drain sends f's buffer and waits until nothing of f is in flight.
func (o *ClientOps) drain(f *openFile) {
	o.sendBuffered(f)
	f.waitInflight()
}

// waitInflight waits for every commit in flight when it is called. It
// waits on the commits' own ranges rather than a counter: drains on
// several threads while other threads keep starting commits are the normal
// case (fio with several jobs on one file), and a sync.WaitGroup may not be
// waited on while it is being reused.
func (f *openFile) waitInflight() {
	f.mu.Lock()
	rs := slices.Clone(f.ranges)
	f.mu.Unlock()
	for _, r := range rs {
		<-r.done
	}
}

func (f *openFile) setErr(err error) {
	f.errMu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.errMu.Unlock()
}

// takeErr returns and clears the first background failure.
func (f *openFile) takeErr() error {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	err := f.err
	f.err = nil
	return err
}

// peekErr returns the first background failure, leaving it to be
// reported again at close.
func (f *openFile) peekErr() error {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return f.err
}
