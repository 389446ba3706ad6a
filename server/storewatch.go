package server

import (
	"sync"

	"github.com/hashicorp/raft"
)

// storeWatch tells the batcher when the leader's log store has written one
// of its entries. hashicorp/raft gives no such signal: an ApplyFuture only
// reports the commit. The leader hands the very []byte passed to Apply to
// its log store (the follower's copies are decoded from the wire and never
// match), so an entry is recognised by the address of its first byte. The
// batcher keeps the slice alive while it is registered, so the address
// cannot be reused in the meantime.
type storeWatch struct {
	mu      sync.Mutex
	pending map[*byte]func() // guarded by mu
}

func newStoreWatch() *storeWatch {
	return &storeWatch{pending: make(map[*byte]func())}
}

// add calls fn once data has been written by the log store. data must not
// be empty.
func (w *storeWatch) add(data []byte, fn func()) {
	w.mu.Lock()
	w.pending[&data[0]] = fn
	w.mu.Unlock()
}

// remove forgets data, whether or not it was written.
func (w *storeWatch) remove(data []byte) {
	w.mu.Lock()
	delete(w.pending, &data[0])
	w.mu.Unlock()
}

// stored is called by the log store after it has written logs. Callbacks
// run outside the lock.
func (w *storeWatch) stored(logs []*raft.Log) {
	var fns []func()
	w.mu.Lock()
	if len(w.pending) > 0 {
		for _, l := range logs {
			if len(l.Data) == 0 {
				continue
			}
			if fn, ok := w.pending[&l.Data[0]]; ok {
				delete(w.pending, &l.Data[0])
				fns = append(fns, fn)
			}
		}
	}
	w.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}
