package region

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

var (
	// ErrLost: writes of the region could not be committed because its
	// capability was taken (revoked after its lease, or handed on) first.
	ErrLost = fmt.Errorf("region: writes lost with the capability: %w", syscall.EKEYREVOKED)
	// ErrHandedOff: the region was handed to another session.
	ErrHandedOff = errors.New("region: handed off to another session")
	// ErrClosed: the region is closed.
	ErrClosed = fmt.Errorf("region: closed: %w", fs.ErrClosed)
)

// Options configure a region. The zero value is usable.
type Options struct {
	// Workers pull in the background (default 4; negative: no
	// background pull, chunks come only when read).
	Workers int
	// Priority orders the background pull (default Outward()).
	Priority Priority
	// PushInterval is how long a written chunk may wait before it is
	// written back (default 20 ms); PushWorkers send in parallel
	// (default 2).
	PushInterval time.Duration
	PushWorkers  int
	// Cache holds chunks by hash beyond this region (nil: none).
	Cache Cache
	// Progress, when set, is called every ProgressInterval (default 1 s)
	// and once at Close.
	Progress         func(Progress)
	ProgressInterval time.Duration
	// Create makes the file when it is missing; Size, when larger than
	// the file, extends it (a region never changes its size afterwards).
	Create bool
	Size   int64
	// ReadOnly takes no capability: reads see committed data as the
	// client's consistency level gives it, and writes fail.
	ReadOnly bool
}

// Progress is a region's state for a progress display.
type Progress struct {
	Size            int64   // bytes in the region
	Local           int64   // bytes present locally
	Dirty           int64   // bytes written and not committed yet
	Pulled, Pushed  int64   // bytes fetched and written back so far
	PullRate        float64 // bytes per second since the last report
	PushRate        float64
	DirtySinceLeech int64 // bytes written since a leecher registered
}

func (o *Options) defaults() {
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.Priority == nil {
		o.Priority = Outward()
	}
	if o.PushInterval <= 0 {
		o.PushInterval = 20 * time.Millisecond
	}
	if o.PushWorkers <= 0 {
		o.PushWorkers = 2
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = time.Second
	}
}

// Open opens the regular file at path as a region. Unless opts.ReadOnly,
// c must have been made WithCaps: Open takes an exclusive capability on
// the file and holds it until Close (taking it back, and looking again at
// what changed, whenever another session had it meanwhile).
func Open(ctx context.Context, c *client.Client, path string, opts Options) (*Region, error) {
	opts.defaults()
	if !opts.ReadOnly && c.Caps() == nil {
		return nil, errors.New("region: a writable region needs a client made WithCaps")
	}
	ino, err := prepare(ctx, c, path, opts)
	if err != nil {
		return nil, err
	}
	r := newRegion(c, path, ino, opts)
	if !opts.ReadOnly {
		if err := r.grant(ctx); err != nil {
			return nil, err
		}
	}
	if err := r.load(ctx); err != nil {
		return nil, err
	}
	if !opts.ReadOnly {
		r.writable = true
		r.startWriter()
	}
	r.startPull()
	return r, nil
}

// prepare creates or extends the file as opts ask and returns its inode.
func prepare(ctx context.Context, c *client.Client, path string, opts Options) (uint64, error) {
	st, err := c.Stat(path)
	if errors.Is(err, fs.ErrNotExist) && opts.Create {
		f, cerr := c.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if cerr != nil {
			return 0, fmt.Errorf("region: %w", cerr)
		}
		_ = f.Close()
		st, err = c.Stat(path)
	}
	if err != nil {
		return 0, fmt.Errorf("region: %w", err)
	}
	if !st.Mode().IsRegular() {
		return 0, fmt.Errorf("region: %s: %w", path, syscall.EINVAL)
	}
	if opts.Size > st.Size() {
		if err := c.Truncate(path, opts.Size); err != nil {
			return 0, fmt.Errorf("region: %w", err)
		}
	}
	return st.Sys().(*pb.Attr).Ino, ctx.Err()
}

// Size is the region's length in bytes.
func (r *Region) Size() int64 { return r.size }

// Path is the file the region is of.
func (r *Region) Path() string { return r.path }

// ChunkSize is the cluster's block size, the region's unit of transfer.
func (r *Region) ChunkSize() int { return r.cs }

// ReadAt reads len(p) bytes at off, fetching chunks not local yet first.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	return r.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt with a context for the fetches it may wait for.
func (r *Region) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("region: read at %d: %w", off, syscall.EINVAL)
	}
	if off >= r.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, errEOF
	}
	n := len(p)
	short := false
	if off+int64(n) > r.size {
		n, short = int(r.size-off), true
	}
	for {
		if err := r.hold(ctx); err != nil {
			return 0, err
		}
		if err := r.ensure(ctx, off, n, false); err != nil {
			return 0, err
		}
		r.mu.Lock()
		if r.holding() && r.allPresent(off, n) {
			copy(p, r.mem[off:off+int64(n)])
			r.mu.Unlock()
			break
		}
		r.mu.Unlock() // lost the capability or a chunk meanwhile: again
	}
	if short {
		return n, errEOF
	}
	return n, nil
}

// WriteAt writes p at off into the local region; the pusher commits it
// in the background (Sync waits for that). Writes past Size fail: a
// region does not grow.
func (r *Region) WriteAt(p []byte, off int64) (int, error) {
	return r.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext is WriteAt with a context for what it may wait for (a
// partly written chunk not local yet, the capability taken back).
func (r *Region) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if !r.opts.ReadOnly && off >= 0 && off+int64(len(p)) <= r.size {
		for {
			if err := r.hold(ctx); err != nil {
				return 0, err
			}
			if err := r.ensure(ctx, off, len(p), true); err != nil {
				return 0, err
			}
			r.mu.Lock()
			if err := r.err; err != nil {
				r.mu.Unlock()
				return 0, err
			}
			if r.holding() && r.writable && r.coveredOrPresent(off, len(p)) {
				r.write(p, off)
				r.mu.Unlock()
				return len(p), nil
			}
			r.mu.Unlock()
		}
	}
	if r.opts.ReadOnly {
		return 0, fmt.Errorf("region: read-only: %w", syscall.EBADF)
	}
	return 0, fmt.Errorf("region: write of %d bytes at %d past its size %d: %w", len(p), off, r.size, syscall.EFBIG)
}

// Bytes is the region's memory (see the package comment for what a
// program may do with it).
func (r *Region) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.view = true
	return r.mem[:r.size:r.size]
}

// MarkDirty names bytes written through Bytes; from the first call on,
// Sync no longer compares hashes to find them.
func (r *Region) MarkDirty(off, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.marked = true
	if off < 0 || n <= 0 || off >= r.size {
		return
	}
	n = min(n, r.size-off)
	r.wgen++
	for i := int(off / int64(r.cs)); int64(i)*int64(r.cs) < off+n; i++ {
		lo := int64(i) * int64(r.cs)
		hi := min(lo+int64(r.cs), r.size)
		r.dirty(i, int(max(off, lo)-lo), int(min(off+n, hi)-lo))
	}
	r.kickPush()
}

// Fetch makes [off, off+n) local, so that the program may read it
// through Bytes.
func (r *Region) Fetch(ctx context.Context, off, n int64) error {
	if off < 0 || off >= r.size || n <= 0 {
		return nil
	}
	return r.ensure(ctx, off, int(min(n, r.size-off)), false)
}

// Wait returns once the whole region is local.
func (r *Region) Wait(ctx context.Context) error { return r.Fetch(ctx, 0, r.size) }

// Sync returns once everything written before it (and what Bytes
// writes are found, see the package comment) is committed.
func (r *Region) Sync(ctx context.Context) error {
	if r.opts.ReadOnly {
		return nil
	}
	r.mu.Lock()
	frozen := r.state == stateFrozen
	r.mu.Unlock()
	if !frozen {
		// Writes found below are fenced with the capability held now.
		if err := r.hold(ctx); err != nil {
			return err
		}
	}
	r.scanView()
	r.mu.Lock()
	target := r.wgen
	r.mu.Unlock()
	return r.waitPushed(ctx, target)
}

// Err is the first error that lost writes (ErrLost), if any.
func (r *Region) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Progress reports the region's state now.
func (r *Region) Progress() Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progressLocked()
}

// Close commits what was written, gives the capability back and frees
// the memory.
func (r *Region) Close() error {
	var err error
	r.mu.Lock()
	open := r.state == stateOpen
	r.mu.Unlock()
	if open && r.writable {
		// Commit what is dirty, without taking the capability back for it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r.scanView()
		r.mu.Lock()
		target := r.wgen
		r.mu.Unlock()
		err = r.waitPushed(ctx, target)
		cancel()
	}
	r.shutdown(stateClosed)
	if open && r.writable {
		r.c.Caps().Release(r.ino)
	}
	if r.opts.Progress != nil {
		r.opts.Progress(r.Progress())
	}
	r.freeMem()
	return err
}
