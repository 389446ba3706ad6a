package server

import (
	"context"
	"errors"
	"slices"
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
// rejoined.
type voteGate struct {
	raft.Transport
	id    raft.ServerID
	gated bool // votes pass only once open
	open  atomic.Bool
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

// refuse answers a vote or pre-vote request with a refusal.
func (g *voteGate) refuse(rpc raft.RPC) bool {
	head := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(g.id),
		Addr: g.EncodePeer(g.id, g.LocalAddr())}
	switch req := rpc.Command.(type) {
	case *raft.RequestVoteRequest:
		rpc.Respond(&raft.RequestVoteResponse{RPCHeader: head, Term: req.Term}, nil)
	case *raft.RequestPreVoteRequest:
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

// openWhenCaughtUp opens the gate once this node has applied the highest
// commit index the members report, asked after the join.
func (n *Node) openWhenCaughtUp(g *voteGate) {
	target := uint64(0)
	for target == 0 {
		target = n.clusterCommitIndex()
		if target == 0 {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-n.ctx.Done():
				return
			}
		}
	}
	if err := n.rfsm.waitApplied(n.ctx, target); err != nil {
		return
	}
	g.open.Store(true)
	n.log.Info("caught up after losing state: voting again", "index", target)
}

// clusterCommitIndex asks the members (the --join addresses and the API
// addresses the replicated member map names) for their commit indexes and
// returns the highest (0 when none answered).
func (n *Node) clusterCommitIndex() uint64 {
	addrs := slices.Clone(n.cfg.Join)
	for id, a := range n.Members() {
		if id != n.cfg.ID && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	var best uint64
	for _, addr := range addrs {
		cli, err := n.peers.client(addr)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
		st, err := cli.Status(ctx, &pb.StatusRequest{Version: pb.Version})
		cancel()
		if err != nil {
			continue
		}
		for _, ns := range st.GetNodes() {
			if ns.GetId() != n.cfg.ID {
				best = max(best, ns.GetCommitIndex())
			}
		}
	}
	return best
}
