package server

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
)

// gatedPair connects node a to node b, whose transport is wrapped in a
// closed gate. The test plays Raft on b: it grants every vote and
// accepts every append that passes the gate, and hands each on to got.
func gatedPair(t *testing.T) (g *voteGate, a *raft.InmemTransport, addrA, addrB raft.ServerAddress, got <-chan raft.RPC) {
	addrA, a = raft.NewInmemTransport("")
	addrB, b := raft.NewInmemTransport("")
	a.Connect(addrB, b)
	b.Connect(addrA, a)
	g = newVoteGate(b, "b", true)
	t.Cleanup(func() { g.Close(); a.Close() })
	passed := make(chan raft.RPC, 8)
	go func() {
		for rpc := range g.Consumer() {
			passed <- rpc
			switch req := rpc.Command.(type) {
			case *raft.RequestVoteRequest:
				rpc.Respond(&raft.RequestVoteResponse{Term: req.Term, Granted: true}, nil)
			case *raft.RequestPreVoteRequest:
				rpc.Respond(&raft.RequestPreVoteResponse{Term: req.Term, Granted: true}, nil)
			case *raft.AppendEntriesRequest:
				rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, Success: true}, nil)
			}
		}
	}()
	return g, a, addrA, addrB, passed
}

func TestVoteGateKeepsAnAmnesiacNodeOutOfElections(t *testing.T) {
	g, a, addrA, addrB, got := gatedPair(t)

	var vr raft.RequestVoteResponse
	require.NoError(t, a.RequestVote("b", addrB, &raft.RequestVoteRequest{Term: 7}, &vr))
	require.False(t, vr.Granted, "a closed gate refuses votes")
	require.Equal(t, uint64(7), vr.Term)
	var pr raft.RequestPreVoteResponse
	require.NoError(t, a.RequestPreVote("b", addrB, &raft.RequestPreVoteRequest{Term: 7}, &pr))
	require.False(t, pr.Granted)

	var ar raft.AppendEntriesResponse
	require.NoError(t, a.AppendEntries("b", addrB, &raft.AppendEntriesRequest{Term: 7}, &ar), "replication passes")
	require.True(t, ar.Success)
	require.IsType(t, &raft.AppendEntriesRequest{}, (<-got).Command)

	require.ErrorIs(t, g.RequestVote("a", addrA, &raft.RequestVoteRequest{Term: 8}, &vr), errVoteGated,
		"a closed gate fails the node's own campaign")
	require.ErrorIs(t, g.RequestPreVote("a", addrA, &raft.RequestPreVoteRequest{Term: 8}, &pr), errVoteGated)

	g.open.Store(true)
	require.NoError(t, a.RequestVote("b", addrB, &raft.RequestVoteRequest{Term: 7}, &vr))
	require.True(t, vr.Granted, "an open gate lets Raft answer")
	select {
	case rpc := <-got:
		require.IsType(t, &raft.RequestVoteRequest{}, rpc.Command)
	case <-time.After(5 * time.Second):
		t.Fatal("vote request not passed on")
	}
}

func TestHeartbeatsStopBeforeStoresClose(t *testing.T) {
	a, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, nil)
	require.NoError(t, err)
	b, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, nil)
	require.NoError(t, err)
	g := newVoteGate(b, "b", false)
	t.Cleanup(func() { g.Close(); a.Close() })
	require.Equal(t, b.Consumer(), g.Consumer(), "an ungated node reads the transport directly")

	calls := 0
	g.SetHeartbeatHandler(func(rpc raft.RPC) {
		calls++
		rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
	})
	heartbeat := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("a"), Addr: []byte(a.LocalAddr())}, Term: 1}
	var resp raft.AppendEntriesResponse
	require.NoError(t, a.AppendEntries("b", b.LocalAddr(), heartbeat, &resp))
	require.True(t, resp.Success)
	g.stopHeartbeats()
	require.Error(t, a.AppendEntries("b", b.LocalAddr(), heartbeat, &resp), "a stopped node refuses heartbeats")
	require.Equal(t, 1, calls)
}

func TestVoteFloorAdmits(t *testing.T) {
	floor := &voteFloor{term: 5, index: 100}
	cases := []struct {
		name                  string
		floor                 *voteFloor
		term, lastTerm, index uint64
		want                  bool
	}{
		{"no floor yet", nil, 6, 5, 100, false},
		{"floor without a term", &voteFloor{index: 100}, 6, 5, 100, false},
		{"the floor's own term", floor, 5, 5, 100, false},
		{"last entry of the floor's term at its index", floor, 6, 5, 100, true},
		{"last entry of the floor's term past its index", floor, 6, 5, 140, true},
		{"last entry of the floor's term short of its index", floor, 6, 5, 99, false},
		{"last entry of a later term", floor, 7, 6, 3, true},
		{"last entry of an earlier term", floor, 6, 4, 500, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, c.floor.admits(c.term, c.lastTerm, c.index))
		})
	}
}

func TestClosedGatePassesACandidateAboveItsFloor(t *testing.T) {
	g, a, addrA, addrB, _ := gatedPair(t)
	g.floor.Store(&voteFloor{term: 4, index: 50})

	var vr raft.RequestVoteResponse
	require.NoError(t, a.RequestVote("b", addrB, &raft.RequestVoteRequest{Term: 5, LastLogTerm: 4, LastLogIndex: 49}, &vr))
	require.False(t, vr.Granted, "a candidate short of the floor is refused")
	require.NoError(t, a.RequestVote("b", addrB, &raft.RequestVoteRequest{Term: 5, LastLogTerm: 4, LastLogIndex: 50}, &vr))
	require.True(t, vr.Granted, "a candidate at the floor reaches Raft")
	var pr raft.RequestPreVoteResponse
	require.NoError(t, a.RequestPreVote("b", addrB, &raft.RequestPreVoteRequest{Term: 5, LastLogTerm: 4, LastLogIndex: 50}, &pr))
	require.True(t, pr.Granted)
	require.ErrorIs(t, g.RequestVote("a", addrA, &raft.RequestVoteRequest{Term: 6}, &vr), errVoteGated,
		"the gated node still may not campaign")
}

func TestFloorOfReports(t *testing.T) {
	r := func(id string, term, commit uint64, err string) *pb.NodeStatus {
		return &pb.NodeStatus{Id: id, Term: term, CommitIndex: commit, Error: err}
	}
	cases := []struct {
		name    string
		reports []*pb.NodeStatus
		want    voteFloor
	}{
		{"nobody answered", nil, voteFloor{}},
		{"the highest commit index with its reporter's term",
			[]*pb.NodeStatus{r("n1", 7, 90, ""), r("n2", 6, 120, ""), r("n3", 9, 80, "")}, voteFloor{term: 6, index: 120}},
		{"the lowest term among reporters of that index",
			[]*pb.NodeStatus{r("n1", 8, 120, ""), r("n2", 7, 120, "")}, voteFloor{term: 7, index: 120}},
		{"not this node's own report", []*pb.NodeStatus{r("me", 9, 500, ""), r("n2", 7, 120, "")}, voteFloor{term: 7, index: 120}},
		{"not a member that could not be asked", []*pb.NodeStatus{r("n1", 0, 0, "timeout"), r("n2", 7, 120, "")}, voteFloor{term: 7, index: 120}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, floorOf(c.reports, "me"))
		})
	}
}
