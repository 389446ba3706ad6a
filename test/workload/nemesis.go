package workload

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"time"

	"github.com/memoryfs/memfs/test/faultnet"
)

// Target is a cluster the nemesis can hurt: the in-process harness and the
// real-process cluster both are one.
type Target interface {
	// Network is the fault state of every link (node IDs and client names).
	Network() *faultnet.Net
	// NodeIDs returns every node's ID, in index order.
	NodeIDs() []string
	// Leader returns the index of a node that believes it leads, or -1.
	Leader() int
	// Crash kills node i abruptly; Restart brings it back.
	Crash(i int)
	Restart(i int) error
	// Up returns the indexes of the running nodes.
	Up() []int
	// CanLoseAll reports whether every node may be down at once without
	// losing acknowledged data (false for ephemeral storage).
	CanLoseAll() bool
}

// Fault is one kind of trouble.
type Fault string

// The faults the nemesis knows.
const (
	PartitionHalves Fault = "partition"   // random majority / minority split
	IsolateLeader   Fault = "isolate"     // the leader alone in a minority
	Bridge          Fault = "bridge"      // two halves joined by one node
	OneWay          Fault = "oneway"      // a few directed links cut
	LeaderOneWay    Fault = "leader-out"  // the leader's outbound links cut
	Unreliable      Fault = "unreliable"  // loss, delay, reordering, duplicates
	ClientCut       Fault = "client-cut"  // clients cut from some nodes
	ResetConns      Fault = "reset"       // client connections reset
	CrashOne        Fault = "crash"       // one node killed and restarted
	CrashLeader     Fault = "crash-lead"  // the leader killed and restarted
	CrashAll        Fault = "crash-all"   // every node killed, then restarted
	CrashMinority   Fault = "crash-minor" // a minority killed together
	ClockJump       Fault = "clock"       // the leader's clock jumps ahead or back
	FreezeCacher    Fault = "freeze-k"    // a caching reader's links stall (Run.Caching)
	KillCacher      Fault = "kill-k"      // a caching reader dies or closes while holding
)

// freezeMode is which directions of a frozen caching reader's links stall.
type freezeMode int

const (
	freezeBoth freezeMode = iota // nothing in or out: a stopped process
	freezeDeaf                   // replies and change events held, requests pass: renewals reach the cluster, recalls never reach the reader
	freezeMute                   // requests held, replies pass: recalls reach the reader, its releases and renewals do not reach the cluster
)

func (m freezeMode) String() string {
	return [...]string{"both ways", "deaf", "mute"}[m]
}

// ClockSkewer is a Target whose nodes' leader clocks can be skewed.
type ClockSkewer interface {
	SkewClock(i int, d time.Duration)
}

// Nemesis injects faults into a Target at random, one episode at a time.
type Nemesis struct {
	T      Target
	Faults []Fault
	// Script, when set, replaces the random choice of fault: the faults
	// are applied in this order, cycling.
	Script  []Fault
	Clients []string // client endpoint names, for ClientCut
	// Hold is the range of how long one fault lasts, Calm of the pause
	// between faults.
	HoldMin, HoldMax time.Duration
	CalmMin, CalmMax time.Duration
	// Unreliable is the link fault set during Unreliable episodes (and, if
	// Always, for the whole run).
	Lossy  faultnet.Faults
	Always bool
	Logf   func(format string, args ...any)
	// FreezeMin and FreezeMax bound how long a FreezeCacher episode lasts
	// (Hold when 0): longer than the readers' lease for their
	// capabilities to be revoked.
	FreezeMin, FreezeMax time.Duration

	cachers *cacherSet // set by Run when it has caching readers

	mu       sync.Mutex
	episodes []string
}

// DefaultLossy is the link fault set of an unreliable network.
var DefaultLossy = faultnet.Faults{Drop: 0.1, Delay: time.Millisecond, Jitter: 20 * time.Millisecond, Dup: 0.05, Reset: 0.002}

// Episodes lists what the nemesis did, in order.
func (n *Nemesis) Episodes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.episodes...)
}

func (n *Nemesis) note(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	n.mu.Lock()
	n.episodes = append(n.episodes, s)
	n.mu.Unlock()
	if n.Logf != nil {
		n.Logf("nemesis: %s", s)
	}
}

// Run injects faults until ctx ends, then heals everything: the network is
// made whole and reliable and every node is running again. It returns the
// first restart error.
func (n *Nemesis) Run(ctx context.Context) error {
	net := n.T.Network()
	if n.Always {
		net.SetDefault(n.Lossy)
	}
	var err error
	for k := 0; ctx.Err() == nil && len(n.Faults)+len(n.Script) > 0; k++ {
		var f Fault
		var hold, calm time.Duration
		net.Rand(func(r *rand.Rand) {
			if len(n.Script) > 0 {
				f = n.Script[k%len(n.Script)]
			} else {
				f = n.Faults[r.Intn(len(n.Faults))]
			}
			hold = randDur(r, n.HoldMin, n.HoldMax)
			calm = randDur(r, n.CalmMin, n.CalmMax)
		})
		if err = n.episode(ctx, f, hold); err != nil {
			break
		}
		wait(ctx, calm)
	}
	if herr := n.HealAll(); err == nil {
		err = herr
	}
	return err
}

// HealAll ends every fault: links restored, random faults off, every node
// running.
func (n *Nemesis) HealAll() error {
	net := n.T.Network()
	net.Heal()
	net.Reliable()
	return n.restartDown()
}

func (n *Nemesis) restartDown() error {
	up := map[int]bool{}
	for _, i := range n.T.Up() {
		up[i] = true
	}
	for i := range n.T.NodeIDs() {
		if !up[i] {
			if err := n.T.Restart(i); err != nil {
				return fmt.Errorf("restart node %d: %w", i, err)
			}
		}
	}
	return nil
}

func randDur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int63n(int64(hi-lo)))
}

func wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// episode applies f for hold, then undoes it.
func (n *Nemesis) episode(ctx context.Context, f Fault, hold time.Duration) error {
	net := n.T.Network()
	ids := n.T.NodeIDs()
	var pick func(k int) []string
	var perm []int
	net.Rand(func(r *rand.Rand) { perm = r.Perm(len(ids)) })
	pick = func(k int) []string {
		out := make([]string, 0, k)
		for _, i := range perm[:k] {
			out = append(out, ids[i])
		}
		return out
	}
	minority := (len(ids) - 1) / 2
	switch f {
	case PartitionHalves:
		var k int
		net.Rand(func(r *rand.Rand) { k = 1 + r.Intn(minority) })
		a, b := pick(k), rest(ids, pick(k))
		net.Partition(a, b)
		n.note("partition %v | %v for %v", a, b, hold)
	case IsolateLeader:
		l := n.T.Leader()
		if l < 0 {
			return nil
		}
		net.Isolate(ids[l], ids)
		n.note("isolate leader %s for %v", ids[l], hold)
	case Bridge:
		half := len(ids) / 2
		a, bridge, b := pick(half), ids[perm[half]], []string{}
		for _, i := range perm[half+1:] {
			b = append(b, ids[i])
		}
		net.Partition(a, b)
		n.note("bridge %v <%s> %v for %v", a, bridge, b, hold)
	case OneWay, LeaderOneWay:
		var cut []string
		if f == LeaderOneWay {
			l := n.T.Leader()
			if l < 0 {
				return nil
			}
			for _, id := range ids {
				if id != ids[l] {
					net.Block(ids[l], id)
					cut = append(cut, ids[l]+"→"+id)
				}
			}
		} else {
			for k := 0; k < 1+minority; k++ {
				var a, b int
				net.Rand(func(r *rand.Rand) { a, b = r.Intn(len(ids)), r.Intn(len(ids)) })
				if a != b {
					net.Block(ids[a], ids[b])
					cut = append(cut, ids[a]+"→"+ids[b])
				}
			}
		}
		n.note("one-way cuts %s for %v", strings.Join(cut, " "), hold)
	case Unreliable:
		net.SetDefault(n.Lossy)
		n.note("unreliable network (%v) for %v", n.Lossy, hold)
		wait(ctx, hold)
		if n.Always {
			return nil
		}
		net.Reliable()
		return nil
	case ClientCut:
		clients := n.clients()
		if len(clients) == 0 {
			return nil
		}
		nodes := pick(1 + minority)
		for _, c := range clients {
			for _, id := range nodes {
				net.Block(c, id)
				net.Block(id, c)
			}
		}
		n.note("clients cut from %v for %v", nodes, hold)
	case ResetConns:
		for _, c := range n.clients() {
			net.ResetConns(c)
		}
		n.note("client connections reset")
		return nil
	case CrashOne, CrashLeader, CrashMinority, CrashAll:
		return n.crash(ctx, f, perm, hold)
	case FreezeCacher:
		return n.freeze(ctx, ids)
	case KillCacher:
		name, ok := n.pickCacher()
		if !ok {
			return nil
		}
		var graceful bool
		net.Rand(func(r *rand.Rand) { graceful = r.Intn(3) == 0 })
		n.cachers.kill(name, graceful)
		if graceful {
			n.note("caching reader %s closed while holding", name)
		} else {
			n.note("caching reader %s killed while holding", name)
		}
		return nil
	case ClockJump:
		sk, ok := n.T.(ClockSkewer)
		l := n.T.Leader()
		if !ok || l < 0 {
			return nil
		}
		var d time.Duration
		net.Rand(func(r *rand.Rand) { d = randDur(r, -5*time.Second, 20*time.Second) })
		sk.SkewClock(l, d)
		n.note("leader %s clock skewed by %v for %v", ids[l], d, hold)
		wait(ctx, hold)
		sk.SkewClock(l, 0)
		return nil
	default:
		return fmt.Errorf("unknown fault %q", f)
	}
	wait(ctx, hold)
	net.Heal()
	return nil
}

// clients lists the client endpoints: the plain clients and the live
// caching readers.
func (n *Nemesis) clients() []string {
	out := append([]string(nil), n.Clients...)
	if n.cachers != nil {
		out = append(out, n.cachers.names()...)
	}
	return out
}

func (n *Nemesis) pickCacher() (string, bool) {
	if n.cachers == nil {
		return "", false
	}
	names := n.cachers.names()
	if len(names) == 0 {
		return "", false
	}
	var i int
	n.T.Network().Rand(func(r *rand.Rand) { i = r.Intn(len(names)) })
	return names[i], true
}

// freeze stalls one caching reader's links to every node for a while: its
// change stream stops (recalls are not seen), its renewals, releases or
// both do not arrive, and whatever it sent is delivered when the freeze
// ends, as for a process stopped and continued. Its capabilities are
// revoked a lease after a recall, and it must have stopped answering from
// them by then.
func (n *Nemesis) freeze(ctx context.Context, ids []string) error {
	name, ok := n.pickCacher()
	if !ok {
		return nil
	}
	net := n.T.Network()
	var mode freezeMode
	var hold time.Duration
	net.Rand(func(r *rand.Rand) {
		mode = freezeMode(r.Intn(3))
		hold = randDur(r, n.FreezeMin, n.FreezeMax)
		if n.FreezeMax == 0 {
			hold = randDur(r, n.HoldMin, n.HoldMax)
		}
	})
	for _, id := range ids {
		if mode != freezeMute {
			net.Block(id, name)
		}
		if mode != freezeDeaf {
			net.Block(name, id)
		}
	}
	n.cachers.cs.Freezes.Add(1)
	n.note("caching reader %s frozen (%v) for %v", name, mode, hold)
	wait(ctx, hold)
	net.Heal()
	return nil
}

// crash kills nodes, waits hold, and restarts them.
func (n *Nemesis) crash(ctx context.Context, f Fault, perm []int, hold time.Duration) error {
	ids := n.T.NodeIDs()
	var victims []int
	switch f {
	case CrashOne:
		victims = perm[:1]
	case CrashLeader:
		if l := n.T.Leader(); l >= 0 {
			victims = []int{l}
		}
	case CrashMinority:
		victims = perm[:(len(ids)-1)/2]
	case CrashAll:
		if !n.T.CanLoseAll() {
			victims = perm[:1]
		} else {
			victims = perm
		}
	}
	if !n.T.CanLoseAll() {
		// Without durable state only nodes beyond a live majority may go.
		victims = victims[:min(len(victims), max(0, len(n.T.Up())-(len(ids)/2+1)))]
	}
	if len(victims) == 0 {
		return nil
	}
	var names []string
	for _, i := range victims {
		names = append(names, ids[i])
		n.T.Crash(i)
	}
	n.note("crash %v for %v", names, hold)
	wait(ctx, hold)
	return n.restartDown()
}

func rest(all, minus []string) []string {
	skip := map[string]bool{}
	for _, m := range minus {
		skip[m] = true
	}
	var out []string
	for _, a := range all {
		if !skip[a] {
			out = append(out, a)
		}
	}
	return out
}
