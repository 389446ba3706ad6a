package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// heldLog keeps the payload size of every entry the log store holds, in
// index order, so a node can bound its log in bytes as well as in
// entries. A count alone does not bound memory: 512 trailing entries of
// 1 MiB writes are 512 MiB, in the heap of an ephemeral node (the
// in-memory store) and in the page cache and mapping of a disk one.
//
// Entries already in a disk log when the node starts are not counted
// until they leave; the bound applies to what the node writes itself.
type heldLog struct {
	mu      sync.Mutex
	entries []heldEntry // ascending index; entries[head:] are held
	head    int
	bytes   uint64

	limit uint64        // 0: no bound
	over  chan struct{} // signalled when bytes pass limit
}

type heldEntry struct {
	index uint64
	size  uint64
}

func newHeldLog(limit uint64) *heldLog {
	return &heldLog{limit: limit, over: make(chan struct{}, 1)}
}

func entrySize(l *raft.Log) uint64 { return uint64(len(l.Data) + len(l.Extensions)) }

// stored records entries just written to the store.
func (h *heldLog) stored(logs []*raft.Log) {
	h.mu.Lock()
	for _, l := range logs {
		// A follower overwrites a conflicting suffix after deleting it;
		// drop anything at or past this index that is still counted.
		h.dropFromLocked(l.Index)
		sz := entrySize(l)
		h.entries = append(h.entries, heldEntry{index: l.Index, size: sz})
		h.bytes += sz
	}
	over := h.limit > 0 && h.bytes > h.limit
	h.mu.Unlock()
	if over {
		select {
		case h.over <- struct{}{}:
		default:
		}
	}
}

// deleted records a DeleteRange of the store: a prefix (compaction) or a
// suffix (a follower's conflicting entries), or everything.
func (h *heldLog) deleted(minIdx, maxIdx uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.head < len(h.entries) && h.entries[h.head].index <= maxIdx && h.entries[h.head].index >= minIdx {
		h.bytes -= h.entries[h.head].size
		h.head++
	}
	if n := len(h.entries); n > h.head && h.entries[n-1].index <= maxIdx {
		// A range that reaches the newest entry: a conflicting suffix.
		h.dropFromLocked(minIdx)
	}
	if h.head == len(h.entries) {
		h.entries, h.head = h.entries[:0], 0
	} else if h.head > len(h.entries)/2 && h.head > 1024 {
		h.entries = append(h.entries[:0], h.entries[h.head:]...)
		h.head = 0
	}
}

func (h *heldLog) dropFromLocked(index uint64) {
	for n := len(h.entries); n > h.head && h.entries[n-1].index >= index; n-- {
		h.bytes -= h.entries[n-1].size
		h.entries = h.entries[:n-1]
	}
}

// Bytes is the payload the store holds.
func (h *heldLog) Bytes() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bytes
}

// tailFitting counts the newest entries whose sizes sum to at most max.
func (h *heldLog) tailFitting(limit uint64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var sum, n uint64
	for i := len(h.entries) - 1; i >= h.head; i-- {
		sum += h.entries[i].size
		if sum > limit {
			break
		}
		n++
	}
	return n
}

// Log byte bound figures. A snapshot truncates the log to the newest
// entries that fit in half the bound, so a follower some way
// entries behind still catches up from the log. minTrailing keeps a
// handful whatever their size; logBoundPause keeps a log that stays over
// the bound (entries not yet applied cannot be snapshotted) from
// snapshotting back to back.
const (
	minTrailing   = 8
	logBoundPause = time.Second
)

// boundLogLoop takes a snapshot whenever the log holds more than
// RaftTuning.MaxLogBytes, with TrailingLogs lowered so that the entries
// kept behind it fit in half of that. Raft's own threshold (entries)
// and interval go on as before.
func (n *Node) boundLogLoop() {
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.held.over:
		}
		n.snapshotForBytes(n.ctx)
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(logBoundPause):
		}
	}
}

func (n *Node) snapshotForBytes(ctx context.Context) {
	held := n.held.Bytes()
	if held <= n.held.limit || ctx.Err() != nil {
		return
	}
	keep := min(max(n.held.tailFitting(n.held.limit/2), minTrailing), n.cfg.Raft.TrailingLogs)
	rc := n.raft.ReloadableConfig()
	if rc.TrailingLogs != keep {
		rc.TrailingLogs = keep
		if err := n.raft.ReloadConfig(rc); err != nil {
			n.log.Warn("cannot lower trailing logs", "to", keep, "err", err)
			return
		}
	}
	err := n.raft.Snapshot().Error()
	switch {
	case err == nil:
		n.log.Debug("snapshot for log bytes", "held_before", held, "held_after", n.held.Bytes(), "trailing", keep)
	case errors.Is(err, raft.ErrNothingNewToSnapshot), errors.Is(err, raft.ErrRaftShutdown):
	default:
		n.log.Warn("snapshot for log bytes failed", "held", held, "err", err)
	}
}
