package fsops

import (
	"context"
	"log/slog"
	"slices"
	"time"

	pb "github.com/memoryfs/memfs/proto"
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
// (OpenOut.KeepCache); until it is, they do not. When the client had to
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
		b.skipHeld(o.meta)
		for _, ino := range b.order {
			o.dropWindows(ino)
			o.noXattrs.drop(ino)
		}
		b.apply(inv)
		if !ok || ctx.Err() != nil {
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

// skipHeld leaves out the inodes and directories this mount holds
// capabilities on: another client changes one only after its capability
// was recalled, and the recall dropped what the mount and the kernel
// cached (capops.go), so an event naming a held inode is this mount's own
// change, which its own caches already reflect.
func (b *batch) skipHeld(meta *metaCache) {
	if !meta.on() || b.reset {
		return
	}
	b.order = slices.DeleteFunc(b.order, meta.caps.Held)
	b.eorder = slices.DeleteFunc(b.eorder, func(k entryKey) bool { return meta.caps.Held(k.parent) })
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
