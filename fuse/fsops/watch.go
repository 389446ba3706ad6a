package fsops

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Resetter is offered by an Invalidator that can drop everything the kernel
// caches for the mount, for when change events may have been missed.
type Resetter interface {
	InvalidateAll()
}

// watchRetry paces attempts to open the change stream while the cluster
// cannot be reached.
const watchRetry = time.Second

// maxBatch is how many queued events are folded into one round of
// invalidations: a burst of writes to one file costs one invalidation.
const maxBatch = 256

// Watch applies the cluster's change events to inv until ctx ends: every
// inode an event names loses its cached attributes and pages, and every
// directory entry it names is dropped from the kernel's name cache. While
// the stream is open, opens keep the kernel's page cache
// (OpenOut.KeepCache; with capabilities, of files the mount holds one on);
// until it is, they do not. When the client had to
// reconnect the stream, events may have been missed, and everything cached
// is dropped (if inv is a Resetter).
//
// Changes this mount made itself come back as events too and invalidate
// its own cache: the cluster's results do not carry the log index that
// would tell them apart.
func (o *ClientOps) Watch(ctx context.Context, inv Invalidator) {
	o.inv.Store(&inv)
	for ctx.Err() == nil {
		ch, err := o.c.Watch(ctx)
		if err != nil {
			slog.Debug("fuse: change stream unavailable; kernel caching limited to timeouts", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(watchRetry):
			}
			continue
		}
		o.watching.Store(true)
		o.consume(ctx, ch, inv)
		o.watching.Store(false)
	}
}

// Watching reports whether the change stream is open and its events are
// being applied: only then may a binding let the kernel cache what could
// change elsewhere without a timeout to bound it (kept pages, missing
// names).
func (o *ClientOps) Watching() bool { return o.watching.Load() }

// Capabilities reports whether the mount caches under capabilities; the
// kernel may then keep only what KernelTimeout allows.
func (o *ClientOps) Capabilities() bool { return o.meta.on() }

// KernelTimeout is, with capabilities, how long the kernel may keep an
// answer a gives (attributes, a name resolving to a.Ino, or, for a
// directory, a name missing from it): a.Valid, or else as long as the
// mount's capability on a.Ino can be trusted, and not at all without one,
// nor while other clients conflict with it (kerneltold.go). Another mount
// may acknowledge changes to an inode this one does not hold before they
// commit, under an exclusive capability, and no change event would tell
// this one; asked again, the cluster recalls that capability first. Not
// even a nanosecond: the kernel rounds a timeout up to a clock tick,
// during which it answers stat itself.
func (o *ClientOps) KernelTimeout(a Attr) time.Duration {
	d := a.Valid
	if d <= 0 && o.meta.caps.Held(a.Ino) {
		d = o.meta.caps.TrustedFor()
	}
	return o.told.tell(a.Ino, d)
}

// consume applies events from ch until it closes.
func (o *ClientOps) consume(ctx context.Context, ch <-chan *pb.WatchEvent, inv Invalidator) {
	for {
		ev, ok := <-ch
		if !ok {
			return
		}
		b := newBatch()
		b.add(ev)
	drain:
		for n := 1; n < maxBatch; n++ {
			select {
			case ev, ok = <-ch:
				if !ok {
					break drain
				}
				b.add(ev)
			default:
				break drain
			}
		}
		// The mount's own read windows first, so that what the kernel
		// reads again after the invalidation is fresh.
		if b.reset {
			o.dropAllWindows()
			o.noXattrs.clear()
		}
		for _, ino := range b.skipHeld(o.meta, o.opt.KernelChecksData) {
			o.dropWindows(ino)
			o.noXattrs.drop(ino)
		}
		b.apply(inv)
		if !ok || ctx.Err() != nil {
			return
		}
	}
}

// fetchSet counts, per inode, the GETATTRs this mount is answering. An
// invalidation that reaches the kernel while it waits for a GETATTR reply
// makes it throw the reply's attributes away, and a read past the old end
// of the file that asked for them then ends there. A recall therefore
// waits (boundedly) for the GETATTRs of its inodes to be answered before
// it tells the kernel: their answers were right until the release that
// follows, since nobody else changes the inode before it.
type fetchSet struct {
	mu   sync.Mutex
	n    map[uint64]int // guarded by mu
	idle chan struct{}  // guarded by mu: closed when a count drops to 0
}

// begin counts a GETATTR of ino until the returned function is called.
func (s *fetchSet) begin(ino uint64) func() {
	s.mu.Lock()
	if s.n == nil {
		s.n, s.idle = map[uint64]int{}, make(chan struct{})
	}
	s.n[ino]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.n[ino]--; s.n[ino] <= 0 {
			delete(s.n, ino)
			close(s.idle)
			s.idle = make(chan struct{})
		}
		s.mu.Unlock()
	}
}

// wait returns once no GETATTR of inos is being answered, or after d.
func (s *fetchSet) wait(inos []uint64, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		s.mu.Lock()
		busy := false
		for _, ino := range inos {
			busy = busy || s.n[ino] > 0
		}
		idle := s.idle
		s.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-idle:
		case <-timer.C:
			return
		}
	}
}

type entryKey struct {
	parent uint64
	name   string
}

// batch is the union of several events.
type batch struct {
	reset   bool
	inodes  map[uint64]struct{}
	entries map[entryKey]struct{}
	order   []uint64
	eorder  []entryKey
}

func newBatch() *batch {
	return &batch{inodes: map[uint64]struct{}{}, entries: map[entryKey]struct{}{}}
}

func (b *batch) add(ev *pb.WatchEvent) {
	if ev.GetIndex() == 0 && len(ev.GetInodes()) == 0 && len(ev.GetEntries()) == 0 {
		b.reset = true
		return
	}
	for _, ino := range ev.GetInodes() {
		if _, ok := b.inodes[ino]; !ok {
			b.inodes[ino] = struct{}{}
			b.order = append(b.order, ino)
		}
	}
	for _, d := range ev.GetEntries() {
		k := entryKey{d.GetIno(), d.GetName()}
		if _, ok := b.entries[k]; !ok {
			b.entries[k] = struct{}{}
			b.eorder = append(b.eorder, k)
		}
	}
}

// skipHeld leaves out, with capabilities, the inodes and directories this
// mount holds capabilities on, and returns the inodes whose windows the
// mount drops. Another client changes a held inode or directory only
// after its capability was recalled, and the recall dropped what the mount
// and the kernel cached (capops.go), so an event naming one is this
// mount's own change, which its caches already reflect.
//
// Where the kernel checks its pages against the attributes it gets
// (Options.KernelChecksData), every inode is left out: the kernel keeps
// nothing of an inode the mount does not hold (KernelTimeout), so it asks
// for the attributes before it uses its pages, and drops them when those
// show the change. Telling it anyway does harm: an invalidation that
// reaches the kernel while it waits for a GETATTR reply makes it throw the
// reply away, and a read past the old end of the file that asked for the
// reply then ends there. An event arrives when its change is already done,
// often at the moment another program reads what it just wrote through
// another mount, so that read came back empty.
func (b *batch) skipHeld(meta *metaCache, kernelChecks bool) []uint64 {
	if !meta.on() || b.reset {
		return b.order
	}
	b.eorder = slices.DeleteFunc(b.eorder, func(k entryKey) bool { return meta.caps.Held(k.parent) })
	b.order = slices.DeleteFunc(b.order, meta.caps.Held)
	windows := b.order
	if kernelChecks {
		b.order = nil
	}
	return windows
}

// apply sends the batch to the kernel. Entries go first so that a name
// removed elsewhere stops resolving before its inode is refreshed.
func (b *batch) apply(inv Invalidator) {
	if b.reset {
		// Events may have been lost while the stream was down.
		if r, ok := inv.(Resetter); ok {
			r.InvalidateAll()
		}
	}
	for _, k := range b.eorder {
		inv.InvalidateEntry(k.parent, k.name)
	}
	for _, ino := range b.order {
		inv.InvalidateData(ino)
	}
}
