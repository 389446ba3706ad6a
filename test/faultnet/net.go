// Package faultnet injects network faults between MemoryFS nodes and
// between clients and nodes: per-link message loss, delay with jitter,
// reordering, duplication, symmetric and one-way partitions, connection
// resets and blackholes.
//
// A Net holds the fault state of every directed link between endpoints
// named by strings (raft server IDs for nodes, any name for clients). Two
// things consult it: Transport, a raft.Transport wrapper that works on
// whole RPCs (so it can drop, delay, reorder and duplicate messages), and
// Proxy, a TCP proxy that works on byte streams (delay, reset, blackhole),
// used for client connections and between real processes.
//
// Its randomness comes from one seed so that a failing run's fault
// schedule can be replayed. It is test code: nothing outside test/ may
// import it, and it must never be wired into a production binary.
package faultnet

import (
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// ErrDropped is returned for an RPC whose request or reply was lost.
var ErrDropped = errors.New("faultnet: message dropped")

// ErrLinkDown is returned for an RPC over a partitioned link.
var ErrLinkDown = errors.New("faultnet: link partitioned")

// Faults are the random faults of a link, applied to each message (each
// RPC request or reply, or each chunk a proxy forwards).
type Faults struct {
	// Drop is the probability that a message is lost (on a byte stream: that
	// the connection is reset).
	Drop float64
	// Delay is added to every message, plus a uniform random part in
	// [0, Jitter). Messages sent concurrently overtake each other.
	Delay, Jitter time.Duration
	// Dup is the probability that an RPC request is delivered once more,
	// later (stale duplicates). Byte streams never duplicate.
	Dup float64
	// Reset is the probability that a chunk a byte stream forwards resets
	// its connection instead (streams are never silently lossy).
	Reset float64
}

func (f Faults) String() string {
	return fmt.Sprintf("drop=%.3f delay=%v+%v dup=%.3f reset=%.4f", f.Drop, f.Delay, f.Jitter, f.Dup, f.Reset)
}

type link struct{ from, to string }

// Stats count what a Net did.
type Stats struct {
	Messages, Dropped, Blocked, Duplicated, Resets atomic.Int64
	// Snapshots counts InstallSnapshot RPCs that were sent.
	Snapshots atomic.Int64
	// Impostors counts Raft replies from a node other than the addressee.
	Impostors atomic.Int64
}

// Net is the fault state of every link. The zero value is not usable; call
// New.
type Net struct {
	mu      sync.Mutex
	rng     *rand.Rand
	def     Faults
	links   map[link]Faults
	blocked map[link]bool
	changed chan struct{} // closed and replaced whenever blocks change
	flows   map[*flow]struct{}
	logf    func(format string, args ...any)

	Stats Stats
}

// New returns a reliable, fully connected network whose random choices
// follow seed.
func New(seed int64) *Net {
	return &Net{
		rng:     rand.New(rand.NewSource(seed)),
		links:   map[link]Faults{},
		blocked: map[link]bool{},
		changed: make(chan struct{}),
		flows:   map[*flow]struct{}{},
		logf:    func(string, ...any) {},
	}
}

// SetLogf sets where fault changes are logged (t.Logf in tests).
func (n *Net) SetLogf(f func(format string, args ...any)) {
	n.mu.Lock()
	n.logf = f
	n.mu.Unlock()
}

// Logf logs through the function set by SetLogf.
func (n *Net) Logf(format string, args ...any) {
	n.mu.Lock()
	f := n.logf
	n.mu.Unlock()
	f(format, args...)
}

// Rand runs f with the Net's random source (which is not safe for
// concurrent use on its own).
func (n *Net) Rand(f func(r *rand.Rand)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(n.rng)
}

// SetDefault sets the faults of every link that has no faults of its own.
func (n *Net) SetDefault(f Faults) {
	n.mu.Lock()
	n.def = f
	n.mu.Unlock()
	n.Logf("faultnet: all links %v", f)
}

// SetLink sets the faults of the directed link from→to.
func (n *Net) SetLink(from, to string, f Faults) {
	n.mu.Lock()
	n.links[link{from, to}] = f
	n.mu.Unlock()
}

// Reliable removes every random fault (partitions stay).
func (n *Net) Reliable() {
	n.mu.Lock()
	n.def = Faults{}
	n.links = map[link]Faults{}
	n.mu.Unlock()
	n.Logf("faultnet: reliable")
}

// Block cuts the directed link from→to: a one-way partition.
func (n *Net) Block(from, to string) {
	n.mu.Lock()
	n.blocked[link{from, to}] = true
	n.notifyLocked()
	n.mu.Unlock()
}

// Unblock restores the directed link from→to.
func (n *Net) Unblock(from, to string) {
	n.mu.Lock()
	delete(n.blocked, link{from, to})
	n.notifyLocked()
	n.mu.Unlock()
}

// Partition splits the endpoints into groups that cannot reach each other
// (both directions). Endpoints not named keep their links. It replaces any
// earlier partition.
func (n *Net) Partition(groups ...[]string) {
	n.mu.Lock()
	n.blocked = map[link]bool{}
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					n.blocked[link{a, b}] = true
				}
			}
		}
	}
	n.notifyLocked()
	n.mu.Unlock()
	n.Logf("faultnet: partition %v", groups)
}

// Isolate cuts every link to and from id, among the endpoints in all.
func (n *Net) Isolate(id string, all []string) {
	var rest []string
	for _, a := range all {
		if a != id {
			rest = append(rest, a)
		}
	}
	n.Partition([]string{id}, rest)
}

// Heal removes every partition and block (random faults stay).
func (n *Net) Heal() {
	n.mu.Lock()
	n.blocked = map[link]bool{}
	n.notifyLocked()
	n.mu.Unlock()
	n.Logf("faultnet: healed")
}

// Blocks lists the blocked links as "from→to", sorted.
func (n *Net) Blocks() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for l := range n.blocked {
		out = append(out, l.from+"→"+l.to)
	}
	sort.Strings(out)
	return out
}

func (n *Net) notifyLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

// Connected reports whether messages from→to can pass.
func (n *Net) Connected(from, to string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.blocked[link{from, to}]
}

// waitConnected blocks until from→to is open or done is closed; it returns
// whether the link is open.
func (n *Net) waitConnected(from, to string, done <-chan struct{}) bool {
	for {
		n.mu.Lock()
		blocked, ch := n.blocked[link{from, to}], n.changed
		n.mu.Unlock()
		if !blocked {
			return true
		}
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

// verdict is what happens to one message.
type verdict struct {
	blocked, drop, dup, reset bool
	delay, dupDelay           time.Duration
}

// decide draws the fate of one message over from→to.
func (n *Net) decide(from, to string) verdict {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.Stats.Messages.Add(1)
	if n.blocked[link{from, to}] {
		n.Stats.Blocked.Add(1)
		return verdict{blocked: true}
	}
	f, ok := n.links[link{from, to}]
	if !ok {
		f = n.def
	}
	v := verdict{delay: f.Delay}
	if f.Jitter > 0 {
		v.delay += time.Duration(n.rng.Int63n(int64(f.Jitter)))
	}
	if f.Drop > 0 && n.rng.Float64() < f.Drop {
		v.drop = true
		n.Stats.Dropped.Add(1)
	}
	if f.Reset > 0 && n.rng.Float64() < f.Reset {
		v.reset = true
	}
	if f.Dup > 0 && n.rng.Float64() < f.Dup {
		v.dup = true
		// A duplicate arrives well after the original so that it is stale.
		v.dupDelay = v.delay + time.Duration(n.rng.Int63n(int64(50*time.Millisecond)+int64(4*f.Jitter)))
		n.Stats.Duplicated.Add(1)
	}
	return v
}

// duration draws a uniform duration in [lo, hi).
func (n *Net) duration(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return lo + time.Duration(n.rng.Int63n(int64(hi-lo)))
}

// sleep waits d or until done closes; it reports whether d elapsed.
func sleep(d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}
