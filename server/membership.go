package server

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

// leaderLoop watches Raft state. On becoming leader it applies an entry
// recording its own API address; once that entry applies, everything
// earlier leaders committed is applied too and linearizable reads may be
// served (leaderReady).
func (n *Node) leaderLoop() {
	obsCh := make(chan raft.Observation, 16)
	obs := raft.NewObserver(obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.RaftState, raft.LeaderObservation:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(obs)
	defer n.raft.DeregisterObserver(obs)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var readyTerm uint64
	for {
		state := n.raft.State()
		n.metrics.setRaftState(state)
		if state == raft.Leader {
			if term := n.raft.CurrentTerm(); term != readyTerm && n.becomeReady(term) {
				readyTerm = term
			}
		}
		select {
		case <-obsCh:
		case <-tick.C:
		case <-n.ctx.Done():
			return
		}
	}
}

func (n *Node) becomeReady(term uint64) bool {
	f := n.raft.Apply(encodeMeta(metaOp{Op: "set", ID: n.cfg.ID, API: n.apiAddr}), 0)
	if err := waitFuture(n.ctx, f); err != nil {
		n.log.Debug("leader ready entry failed", "term", term, "err", err)
		return false
	}
	if n.raft.CurrentTerm() != term {
		return false
	}
	n.ready.set(term, f.Index())
	n.log.Info("leading", "term", term, "index", f.Index())
	return true
}

// tickLoop appends a TickCmd about once per TickInterval while this node
// leads and sessions exist, so leases expire on log time when no client
// writes.
func (n *Node) tickLoop() {
	t := time.NewTicker(n.cfg.TickInterval)
	defer t.Stop()
	tick := &pb.Command{Op: &pb.Command_Tick{Tick: &pb.TickCmd{}}}
	for {
		select {
		case <-t.C:
		case <-n.ctx.Done():
			return
		}
		if !n.IsLeader() || n.fsm.Stats().Sessions == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, 5*n.cfg.TickInterval)
		if _, _, err := n.batcher.submit(ctx, tick); err != nil {
			n.log.Debug("tick failed", "err", err)
		}
		cancel()
	}
}

// selfAddressLoop makes sure the replicated member map holds this node's
// current API address (it changes when a node restarts on another port).
// A leader records itself in becomeReady; a follower asks the leader.
//
// Only a recorded address that differs is corrected. A member without one
// is being removed: joining records the address before the node enters
// the configuration, and removal deletes it before the node leaves. Asking
// then would re-add a removed node as a voter, since it may never hear of
// the configuration change that removed it.
func (n *Node) selfAddressLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-n.ctx.Done():
			return
		}
		if recorded := n.rfsm.member(n.cfg.ID); n.IsLeader() || recorded == "" || recorded == n.apiAddr {
			continue
		}
		voter, ok := n.suffrage(n.cfg.ID)
		if !ok {
			continue // not a member (yet, or any more)
		}
		ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
		if err := n.askLeaderToAdd(ctx, !voter); err != nil {
			n.log.Debug("update own api address", "err", err)
		}
		cancel()
	}
}

// suffrage reports whether id is in the configuration and votes.
func (n *Node) suffrage(id string) (voter, ok bool) {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false, false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id {
			return s.Suffrage == raft.Voter, true
		}
	}
	return false, false
}

func (n *Node) askLeaderToAdd(ctx context.Context, nonvoter bool) error {
	_, api := n.Leader()
	if api == "" {
		return errNoLeader
	}
	cli, err := n.peers.client(api)
	if err != nil {
		return err
	}
	_, err = cli.Join(ctx, n.joinRequest(nonvoter))
	return err
}

func (n *Node) joinRequest(nonvoter bool) *pb.JoinRequest {
	return &pb.JoinRequest{Version: pb.Version, Id: n.cfg.ID, RaftAddr: n.raftAddr, ApiAddr: n.apiAddr, Nonvoter: nonvoter}
}

// join asks the members in cfg.Join, in turn, to add this node, until one
// succeeds or ctx ends.
func (n *Node) join(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	var last error
	for attempt := 0; ; attempt++ {
		addr := n.cfg.Join[attempt%len(n.cfg.Join)]
		cli, err := n.peers.client(addr)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = cli.Join(actx, n.joinRequest(n.cfg.NonVoter))
			cancel()
		}
		if err == nil {
			n.log.Info("joined the cluster", "via", addr)
			return nil
		}
		last = err
		n.log.Info("join attempt failed; retrying", "via", addr, "err", err, "backoff", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return fmt.Errorf("join via %v: %w (last error: %v)", n.cfg.Join, ctx.Err(), last)
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// addMember admits a node on the leader: it records the API address, then
// adds the node to the Raft configuration unless it is already there with
// the same address and at least the asked suffrage.
func (n *Node) addMember(ctx context.Context, req *pb.JoinRequest) error {
	if req.GetId() == "" || req.GetRaftAddr() == "" || req.GetApiAddr() == "" {
		return badRequest("join needs id, raft_addr and api_addr")
	}
	if n.rfsm.member(req.Id) != req.ApiAddr {
		f := n.raft.Apply(encodeMeta(metaOp{Op: "set", ID: req.Id, API: req.ApiAddr}), 0)
		if err := waitFuture(ctx, f); err != nil {
			return err
		}
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return err
	}
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == req.Id && string(s.Address) == req.RaftAddr &&
			(s.Suffrage == raft.Voter || req.Nonvoter) {
			return nil
		}
	}
	var f raft.IndexFuture
	if req.Nonvoter {
		f = n.raft.AddNonvoter(raft.ServerID(req.Id), raft.ServerAddress(req.RaftAddr), 0, 0)
	} else {
		f = n.raft.AddVoter(raft.ServerID(req.Id), raft.ServerAddress(req.RaftAddr), 0, 0)
	}
	if err := waitFuture(ctx, f); err != nil {
		return err
	}
	n.log.Info("added member", "id", req.Id, "raft_addr", req.RaftAddr, "api_addr", req.ApiAddr, "voter", !req.Nonvoter)
	return nil
}

// removeMember removes a node on the leader: first its address record
// (the leader may be removing itself and stop right after), then its place
// in the Raft configuration.
func (n *Node) removeMember(ctx context.Context, id string) error {
	if id == "" {
		return badRequest("remove needs a node id")
	}
	if _, ok := n.suffrage(id); !ok {
		return status.Errorf(codes.NotFound, "node %q is not a member", id)
	}
	if id == n.cfg.ID && n.otherVoters() > 0 {
		handed, err := n.handOverAndRemoveSelf(ctx)
		if handed {
			return err
		}
		n.log.Warn("leadership transfer before self-removal failed; removing self as leader", "err", err)
	}
	if n.rfsm.member(id) != "" {
		if err := waitFuture(ctx, n.raft.Apply(encodeMeta(metaOp{Op: "del", ID: id}), 0)); err != nil {
			return err
		}
	}
	if err := waitFuture(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, 0)); err != nil {
		return err
	}
	n.log.Info("removed member", "id", id)
	return nil
}

// handOverAndRemoveSelf lets a leader asked to remove itself hand
// leadership to another voter first and have the new leader remove it.
// Removed while leading, it would commit its own removal and shut Raft
// down (ShutdownOnRemove), leaving the cluster without a leader for a
// whole election timeout; a transfer costs one round trip. handed is false
// when no transfer took and nothing was done.
//
// A transfer can succeed and still leave this node leading: the target's
// election is lost (its vote requests dropped) and this node wins the
// next. It then transfers again, a few times.
func (n *Node) handOverAndRemoveSelf(ctx context.Context) (handed bool, err error) {
	const attempts = 3
	for i := 1; i <= attempts; i++ {
		if err := waitFuture(ctx, n.raft.LeadershipTransfer()); err != nil {
			return false, err
		}
		n.log.Info("handed leadership over before removing self", "attempt", i)
		other, err := n.awaitOtherLeader(ctx)
		if err != nil {
			return true, err
		}
		if other {
			cli, err := n.leaderClient(ctx)
			if err != nil {
				return true, err
			}
			_, err = cli.RemoveNode(forwardContext(ctx), &pb.RemoveNodeRequest{Version: pb.Version, Id: n.cfg.ID})
			return true, err
		}
		n.log.Info("leading again after a leadership transfer", "attempt", i)
	}
	return false, fmt.Errorf("still leading after %d leadership transfers", attempts)
}

// awaitOtherLeader waits until another node is known to lead (true) or
// this node leads again (false).
func (n *Node) awaitOtherLeader(ctx context.Context) (bool, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		// The new leader is known once its first heartbeat arrives.
		if id, api := n.Leader(); id != "" && id != n.cfg.ID && api != "" {
			return true, nil
		}
		if n.raft.State() == raft.Leader {
			return false, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false, unavailableErr("node %s handed leadership over but sees no new leader yet: %v", n.cfg.ID, ctx.Err())
		}
	}
}
