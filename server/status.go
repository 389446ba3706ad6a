package server

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
)

// peerStatusTimeout bounds how long Status waits for each other node.
const peerStatusTimeout = time.Second

// status builds the answer to a Status call. With local only this node is
// described; otherwise every member of the Raft configuration is asked
// for its own view, in parallel.
func (n *Node) status(ctx context.Context, local bool) *pb.StatusResponse {
	st := n.fsm.Stats()
	lid, lapi := n.Leader()
	limit := st.Block.Limit
	if limit == 0 {
		limit = n.cfg.MemoryLimit
	}
	resp := &pb.StatusResponse{
		Leader: lid, LeaderApiAddr: lapi,
		Inodes: st.Inodes, LogicalBytes: st.LogicalBytes,
		PhysicalBytes: st.Block.PhysicalBytes, BlockCount: st.Block.Blocks,
		MemoryLimit: limit, Sessions: st.Sessions, ChunkSize: uint32(st.ChunkSize),
		SharedBytes: st.Block.SharedBytes, RefBytes: st.Block.RefBytes,
		Self: n.selfStatus(),
	}
	if local {
		resp.Nodes = []*pb.NodeStatus{resp.Self}
		return resp
	}
	resp.Nodes = n.memberStatuses(ctx, resp.Self)
	return resp
}

func (n *Node) selfStatus() *pb.NodeStatus {
	voter, _ := n.suffrage(n.cfg.ID)
	st, tr := n.fsm.Stats(), n.Traffic()
	ns := &pb.NodeStatus{
		Id: n.cfg.ID, ApiAddr: n.apiAddr, RaftAddr: n.raftAddr,
		State: n.raft.State().String(), AppliedIndex: n.AppliedIndex(), Voter: voter,
		CommitIndex: n.raft.CommitIndex(), LastLogIndex: n.raft.LastIndex(), Term: n.raft.CurrentTerm(),
		CatchingUp:   n.gate != nil && !n.gate.open.Load(),
		LogicalBytes: st.LogicalBytes, PhysicalBytes: st.Block.PhysicalBytes, SharedBytes: st.Block.SharedBytes,
		LogBytes: tr.LogBytes, NetSentBytes: tr.NetSent, NetReceivedBytes: tr.NetReceived,
		WireDedupBytes: tr.DedupBytes,
	}
	m := ReadProcessMemory()
	ns.RssBytes, ns.AnonBytes, ns.BlockMemoryBytes = m.RSS, m.Anon, m.Blocks
	if n.memory != nil {
		ns.ProcessMemoryLimit, ns.BlockBudget = n.cfg.ProcessMemoryLimit, n.memory.Budget()
	}
	n.sync.fillStatus(ns)
	ns.CommandLatency = latencies(n.metrics.applyLatency, "type")
	ns.ReadLatency = latencies(n.metrics.queryLatency, "consistency")
	return ns
}

func (n *Node) memberStatuses(ctx context.Context, self *pb.NodeStatus) []*pb.NodeStatus {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return []*pb.NodeStatus{self}
	}
	members := n.Members()
	var out []*pb.NodeStatus
	var wg sync.WaitGroup
	for _, s := range f.Configuration().Servers {
		id := string(s.ID)
		if id == n.cfg.ID {
			out = append(out, self)
			continue
		}
		ns := &pb.NodeStatus{Id: id, RaftAddr: string(s.Address), ApiAddr: members[id], Voter: s.Suffrage == raft.Voter}
		out = append(out, ns)
		wg.Go(func() { n.askPeerStatus(ctx, ns) })
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b *pb.NodeStatus) int { return strings.Compare(a.Id, b.Id) })
	return out
}

// askPeerStatus fills ns with the node's own report, or ns.Error.
func (n *Node) askPeerStatus(ctx context.Context, ns *pb.NodeStatus) {
	if ns.ApiAddr == "" {
		ns.Error = "api address not known yet"
		return
	}
	cli, err := n.peers.client(ns.ApiAddr)
	if err != nil {
		ns.Error = err.Error()
		return
	}
	ctx, cancel := context.WithTimeout(ctx, peerStatusTimeout)
	defer cancel()
	r, err := cli.Status(ctx, &pb.StatusRequest{Version: pb.Version, Local: true})
	if err != nil {
		ns.Error = err.Error()
		return
	}
	if s := r.GetSelf(); s != nil {
		// Everything the node says of itself, but who it is and whether it
		// votes as this node's configuration has them.
		id, raftAddr, api, voter := ns.Id, ns.RaftAddr, ns.ApiAddr, ns.Voter
		proto.Reset(ns)
		proto.Merge(ns, s)
		ns.Id, ns.RaftAddr, ns.ApiAddr, ns.Voter, ns.Error = id, raftAddr, api, voter, ""
	}
}

// ClusterStatus is this node's view of the cluster as the Status call
// gives it: the totals, this node, and every other member's own report
// (each asked with a 1 s timeout, in parallel).
func (n *Node) ClusterStatus(ctx context.Context) *pb.StatusResponse { return n.status(ctx, false) }
