package server

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	pb "github.com/memoryfs/memfs/memfspb"
)

// voteGate is the node's wrapper around its Raft transport. It does two
// things.
//
// It keeps heartbeats away from a stopped node: hashicorp/raft runs the
// heartbeat fast path on the transport's goroutine, outside the waits of
// Raft.Shutdown, and a heartbeat that passed its shutdown check can still
// write the term to the stable store after the node has closed it (raft
// then panics: "failed to save current term: database not open", seen in
// a soak). stopHeartbeats waits for heartbeats in progress and refuses
// later ones.
//
// And, for a node created gated, it keeps a node that has forgotten its
// Raft state out of elections until it has caught up.
//
// An --ephemeral node that crashes comes back empty under the same id, and
// the cluster still counts it as a voter. Raft's safety rests on votes and
// log acknowledgements never being forgotten: before its crash the node
// may have helped commit entries that now sit on only a minority, and an
// empty hashicorp/raft node grants its vote to any candidate (it has no
// configuration to check against and no log to compare), so a candidate
// lacking committed entries could win with its vote and lose them. While
// closed, the gate answers vote and pre-vote requests with a refusal and
// fails the node's own, so it can neither elect nor be elected; it opens
// once the node has applied everything the cluster had committed when it
// rejoined, or its log reaches that point.
//
// While closed, the gate still lets through a vote request from a
// candidate that must hold everything committed at the rejoin (see
// voteFloor.admits). Without that, a second node lost while the first
// catches up wedges the cluster for good: the node that has every entry
// cannot win an election without the gated node's vote, and the gated
// node cannot catch up without a leader.
type voteGate struct {
	raft.Transport
	id    raft.ServerID
	gated bool // votes pass only once open
	open  atomic.Bool
	floor atomic.Pointer[voteFloor] // nil until the cluster answered
	out   chan raft.RPC
	stop  chan struct{}
	once  sync.Once

	hbMu      sync.RWMutex
	hbStopped bool // guarded by hbMu
}

var errVoteGated = errors.New("node is catching up after losing its state: it does not vote yet")

func newVoteGate(t raft.Transport, id string, gated bool) *voteGate {
	g := &voteGate{Transport: t, id: raft.ServerID(id), gated: gated, out: make(chan raft.RPC), stop: make(chan struct{})}
	g.open.Store(!gated)
	if gated {
		go g.run()
	}
	return g
}

// Consumer is what Raft reads incoming RPCs from.
func (g *voteGate) Consumer() <-chan raft.RPC {
	if !g.gated {
		return g.Transport.Consumer()
	}
	return g.out
}

// SetHeartbeatHandler installs Raft's heartbeat fast path behind the
// stop guard.
func (g *voteGate) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		g.Transport.SetHeartbeatHandler(nil)
		return
	}
	g.Transport.SetHeartbeatHandler(func(rpc raft.RPC) {
		g.hbMu.RLock()
		defer g.hbMu.RUnlock()
		if g.hbStopped {
			rpc.Respond(nil, raft.ErrRaftShutdown)
			return
		}
		cb(rpc)
	})
}

// stopHeartbeats returns once no heartbeat is being handled; later ones
// are refused.
func (g *voteGate) stopHeartbeats() {
	g.hbMu.Lock()
	g.hbStopped = true
	g.hbMu.Unlock()
}

func (g *voteGate) run() {
	in := g.Transport.Consumer()
	for {
		select {
		case rpc := <-in:
			if !g.open.Load() && g.refuse(rpc) {
				continue
			}
			select {
			case g.out <- rpc:
			case <-g.stop:
				return
			}
		case <-g.stop:
			return
		}
	}
}

// voteFloor is what the cluster had when an amnesiac node rejoined: the
// highest commit index its members reported, and a term at least that of
// the leader that committed it (floorOf).
type voteFloor struct{ term, index uint64 }

// admits reports whether a candidate whose log ends at (lastTerm,
// lastIndex), campaigning for term, must hold every entry committed up
// to the floor, so that the amnesiac node may vote for it (Raft itself
// still compares the candidate with the node's own log).
//
// Every entry up to the floor's index was committed by a leader of the
// floor's term or an earlier one. A last entry of the floor's term at or
// past its index holds the prefix of that term's leader's log up to there
// (Raft's log matching), and that leader held every entry committed by
// then or by itself; a last entry of a later term was written by a leader
// elected after those commits, which holds them all (Raft's leader
// completeness). The last entry's term alone would not do: a leader
// elected between an entry's term and the term that committed it may
// lack it. A candidate's term must pass the floor's term: the node may
// have voted in that term before it forgot.
func (f *voteFloor) admits(term, lastTerm, lastIndex uint64) bool {
	return f != nil && term > f.term && f.heldBy(lastTerm, lastIndex)
}

// heldBy reports whether a log ending at (lastTerm, lastIndex) is at or
// past the floor. A floor without a term (a member too old to report
// one) holds by nothing.
func (f *voteFloor) heldBy(lastTerm, lastIndex uint64) bool {
	return f.term > 0 && (lastTerm > f.term || (lastTerm == f.term && lastIndex >= f.index))
}

// refuse answers a vote or pre-vote request with a refusal unless the
// floor admits its candidate.
func (g *voteGate) refuse(rpc raft.RPC) bool {
	head := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(g.id),
		Addr: g.EncodePeer(g.id, g.LocalAddr())}
	floor := g.floor.Load()

	switch req := rpc.Command.(type) {
	case *raft.RequestVoteRequest:
		if floor.admits(req.Term, req.LastLogTerm, req.LastLogIndex) {
			return false
		}
		rpc.Respond(&raft.RequestVoteResponse{RPCHeader: head, Term: req.Term}, nil)
	case *raft.RequestPreVoteRequest:
		if floor.admits(req.Term, req.LastLogTerm, req.LastLogIndex) {
			return false
		}
		rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: head, Term: req.Term}, nil)
	default:
		return false
	}
	return true
}

func (g *voteGate) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if !g.open.Load() {
		return errVoteGated
	}
	return g.Transport.RequestVote(id, target, args, resp)
}

func (g *voteGate) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	pv, ok := g.Transport.(raft.WithPreVote)
	if !ok || !g.open.Load() {
		return errVoteGated
	}
	return pv.RequestPreVote(id, target, args, resp)
}

// halt stops the gate's goroutine.
func (g *voteGate) halt() { g.once.Do(func() { close(g.stop) }) }

// Close stops the gate and closes the transport under it.
func (g *voteGate) Close() error {
	g.halt()
	if c, ok := g.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// openWhenCaughtUp learns the cluster's floor after the join and opens
// the gate once this node has applied the floor's index, or its own log
// has reached the floor (then it holds everything the floor stands for,
// by the argument of voteFloor.admits).
func (n *Node) openWhenCaughtUp(g *voteGate) {
	var floor voteFloor
	for floor.index == 0 {
		if floor = n.clusterFloor(); floor.index == 0 && !n.sleep(200*time.Millisecond) {
			return
		}
	}
	g.floor.Store(&floor)
	for !n.reached(floor) || holdVoteGate.Load() {
		if !n.sleep(20 * time.Millisecond) {
			return
		}
	}
	g.open.Store(true)
	n.log.Info("caught up after losing state: voting again", "term", floor.term, "index", floor.index)
}

// holdVoteGate keeps closed gates closed, for tests of a node that has
// not caught up.
var holdVoteGate atomic.Bool

// sleep waits d and reports false when the node stops first.
func (n *Node) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.ctx.Done():
		return false
	}
}

// reached reports whether this node has applied the floor's index or its
// log ends at or past the floor.
func (n *Node) reached(f voteFloor) bool {
	if n.rfsm.applied.Load() >= f.index {
		return true
	}
	st := n.raft.Stats()
	term, _ := strconv.ParseUint(st["last_log_term"], 10, 64)
	index, _ := strconv.ParseUint(st["last_log_index"], 10, 64)
	return f.heldBy(term, index)
}

// clusterFloor asks the members (the --join addresses and the API
// addresses the replicated member map names) for their reports and makes
// the floor of them (zero when none answered).
func (n *Node) clusterFloor() voteFloor {
	addrs := slices.Clone(n.cfg.Join)
	for id, a := range n.Members() {
		if id != n.cfg.ID && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	var reports []*pb.NodeStatus
	for _, addr := range addrs {
		cli, err := n.peers.client(addr)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
		st, err := cli.Status(ctx, &pb.StatusRequest{Version: pb.Version})
		cancel()
		if err == nil {
			reports = append(reports, st.GetNodes()...)
		}
	}
	return floorOf(reports, n.cfg.ID)
}

// floorOf makes a floor of the other members' reports: the highest commit
// index any reports, with the term of the member that reports it (the
// lowest term among several). That member learned the index from a leader
// of that term or an earlier one, which is what voteFloor.admits needs; a
// higher term another member reached in a failed election would only make
// the floor harder to pass.
func floorOf(reports []*pb.NodeStatus, self string) voteFloor {
	var f voteFloor
	for _, ns := range reports {
		if ns.GetId() == self || ns.GetError() != "" {
			continue
		}
		idx, term := ns.GetCommitIndex(), ns.GetTerm()
		if idx > f.index || (idx == f.index && term < f.term) {
			f = voteFloor{term: term, index: idx}
		}
	}
	return f
}
