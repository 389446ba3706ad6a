package client

import pb "github.com/memoryfs/memfs/memfspb"

// SetStreamLimit lowers the most data one write command carries, so tests
// can exercise splitting with little data. It returns a function that
// restores the limit.
func SetStreamLimit(n int) (restore func()) {
	old := streamLimit
	streamLimit = n
	return func() { streamLimit = old }
}

// StreamBeganAt makes the capability table believe its change stream was
// opened again and delivered index first as its first event.
func (cp *Caps) StreamBeganAt(first uint64) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.first = first
}

// Observe hands the capability table one change event as if its stream
// had delivered it.
func (cp *Caps) Observe(ev *pb.WatchEvent) { cp.observe(ev) }

// Leader is the node address the client sends its next call to.
func (c *Client) Leader() string { return c.k.t.pick() }

// BelieveLeader makes the client take addr for the leader, as after a
// call that addr answered.
func (c *Client) BelieveLeader(addr string) { c.k.t.served(addr, nil) }
