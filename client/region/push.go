package region

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// startWriter starts the pusher and the watch for a leecher.
func (r *Region) startWriter() {
	r.wg.Add(2)
	go r.pusher()
	go r.watchLeecher()
}

// pushItem is one chunk on its way: its content copied at a generation,
// and the ranges of it written since it was last committed.
type pushItem struct {
	idx   int
	data  []byte
	spans []span
	hash  Hash
	epoch uint64
}

// maxPushWrites bounds the write commands of one push or handoff: the
// most the state machine takes in a batch.
const maxPushWrites = 4096

// pusher writes dirty chunks back every PushInterval, or at once when
// kicked by Sync.
func (r *Region) pusher() {
	defer r.wg.Done()
	t := time.NewTicker(r.opts.PushInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-r.push:
			// A write: leave it PushInterval to be joined by others,
			// unless Sync waits (it kicks again through syncing).
			if !r.syncing() {
				select {
				case <-t.C:
				case <-r.ctx.Done():
					return
				}
			}
		case <-r.ctx.Done():
			return
		}
		r.pushRound(r.ctx)
	}
}

func (r *Region) syncing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiters > 0
}

// pushRound pushes every dirty chunk not already on its way, in batches
// sent by PushWorkers at once. A chunk is in one push at a time, so its
// versions reach the cluster in the order they were written.
func (r *Region) pushRound(ctx context.Context) {
	r.mu.Lock()
	if r.mem == nil || r.err != nil {
		r.mu.Unlock()
		return
	}
	var items []pushItem
	for i := range r.ch {
		c := &r.ch[i]
		if c.dirtyFrom == 0 || c.pushing || c.epoch == 0 {
			continue
		}
		c.pushing, c.pushFrom, c.dirtyFrom = true, c.dirtyFrom, 0
		c.sending, c.spans = c.spans, nil
		items = append(items, pushItem{idx: i, data: append([]byte(nil), r.chunkMem(i)...), spans: c.sending, epoch: c.epoch})
	}
	r.mu.Unlock()
	if len(items) == 0 {
		return
	}
	var batches [][]pushItem
	var cur []pushItem
	size, writes := 0, 0
	for _, it := range items {
		n := int(spanBytes(it.spans))
		if len(cur) > 0 && (size+n > maxBatch || writes+len(it.spans) > maxPushWrites || cur[0].epoch != it.epoch) {
			batches = append(batches, cur)
			cur, size, writes = nil, 0, 0
		}
		cur = append(cur, it)
		size += n
		writes += len(it.spans)
	}
	batches = append(batches, cur)
	work := make(chan []pushItem)
	var wg sync.WaitGroup
	for range min(r.opts.PushWorkers, len(batches)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				r.pushBatch(ctx, b)
			}
		}()
	}
	for _, b := range batches {
		work <- b
	}
	close(work)
	wg.Wait()
}

// pushBatch commits one batch under a fence on the capability its
// chunks were written under: of each chunk only the ranges written, one
// write command each; chunks whose content the cluster has already
// travel not at all.
func (r *Region) pushBatch(ctx context.Context, b []pushItem) {
	var cmds []*pb.Command
	var sent int64
	r.mu.Lock()
	known := make([]Hash, len(b))
	for k, it := range b {
		known[k] = r.ch[it.idx].known
	}
	r.mu.Unlock()
	for k := range b {
		b[k].hash = sum(b[k].data)
		if b[k].hash == known[k] {
			continue
		}
		for _, w := range r.rangeWrites(b[k].idx, b[k].data, b[k].spans) {
			cmds = append(cmds, &pb.Command{Op: &pb.Command_Write{Write: w}})
			sent += int64(len(w.Data))
		}
	}
	sentIdx := make(map[int]bool, len(b))
	for _, c := range cmds {
		sentIdx[int(c.GetWrite().Offset/int64(r.cs))] = true
	}
	var err error
	if len(cmds) > 0 {
		cmd := &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{
			Fences: []*pb.CapRef{{Ino: r.ino, Epoch: b[0].epoch}}, Commands: cmds}}}
		_, err = r.c.Do(ctx, cmd)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range b {
		c := &r.ch[it.idx]
		c.pushing = false
		sending := c.sending
		c.sending = nil
		if r.state == stateHandedOff {
			continue // the handoff committed it
		}
		if err != nil {
			// Dirty again from its first uncommitted write.
			if c.dirtyFrom == 0 || c.pushFrom < c.dirtyFrom {
				c.dirtyFrom = c.pushFrom
			}
			c.spans = mergeSpans(sending, c.spans)
			continue
		}
		c.known, c.hasKnown = it.hash, true
		if sentIdx[it.idx] {
			c.ackAt = time.Now()
		}
		// Written again since the copy: dirty() gave the chunk the
		// capability of that write, which may still be the one whose
		// release waits for this chunk; it stays.
		if c.dirtyFrom == 0 && c.present {
			r.byHash[c.known] = it.idx
		}
		if r.opts.Cache != nil && it.hash != (Hash{}) {
			r.opts.Cache.Put(it.hash, it.data)
		}
	}
	if err == nil {
		r.pushed += sent
	} else if r.state != stateHandedOff && client.Errno(err) == syscall.EKEYREVOKED && r.err == nil {
		r.err = fmt.Errorf("%w (%v)", ErrLost, err)
	}
	r.notify()
}

// rangeWrites are the write commands that make the cluster's copy of
// chunk i equal to data: one per written range.
func (r *Region) rangeWrites(i int, data []byte, spans []span) []*pb.WriteCmd {
	ws := make([]*pb.WriteCmd, 0, len(spans))
	for _, s := range spans {
		ws = append(ws, &pb.WriteCmd{Loc: &pb.Loc{Ino: r.ino}, Offset: int64(i)*int64(r.cs) + int64(s.lo),
			Data: data[s.lo:s.hi]})
	}
	return ws
}

// waitPushed returns once no write of generation target or earlier is
// uncommitted, pushing meanwhile.
func (r *Region) waitPushed(ctx context.Context, target uint64) error {
	r.mu.Lock()
	r.waiters++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.waiters--
		r.mu.Unlock()
	}()
	for {
		r.mu.Lock()
		err, pending, wake := r.err, r.pendingUpTo(target), r.wake
		handedOff := r.state == stateHandedOff
		r.mu.Unlock()
		switch {
		case handedOff:
			return nil // the handoff committed every write
		case err != nil:
			return err
		case !pending:
			return nil
		}
		r.kickPush()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-r.ctx.Done():
			// The pusher is gone: push here.
			r.pushRound(ctx)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
}

// pendingUpTo reports whether a write of generation target or earlier is
// uncommitted.
func (r *Region) pendingUpTo(target uint64) bool {
	for _, c := range r.ch {
		if c.dirtyFrom != 0 && c.dirtyFrom <= target || c.pushing && c.pushFrom <= target {
			return true
		}
	}
	return false
}

// scanView finds writes made through Bytes by their hash (unless the
// program names them with MarkDirty). The program writes nothing through
// the view while Sync runs.
func (r *Region) scanView() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.view || r.marked || r.mem == nil {
		return
	}
	bumped := false
	for i := range r.ch {
		c := &r.ch[i]
		if !c.present || c.dirtyFrom != 0 || c.pushing || !c.hasKnown {
			continue
		}
		if sum(r.chunkMem(i)) != c.known {
			if !bumped {
				r.wgen++
				bumped = true
			}
			r.dirty(i, 0, len(r.chunkMem(i)))
		}
	}
}
