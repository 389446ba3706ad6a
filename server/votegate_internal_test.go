package server

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

func TestVoteGateKeepsAnAmnesiacNodeOutOfElections(t *testing.T) {
	addrA, a := raft.NewInmemTransport("")
	addrB, b := raft.NewInmemTransport("")
	a.Connect(addrB, b)
	b.Connect(addrA, a)
	g := newVoteGate(b, "b", true)
	t.Cleanup(func() { g.Close(); a.Close() })

	// Raft on b would read g.Consumer(); the test plays it.
	got := make(chan raft.RPC, 4)
	go func() {
		for rpc := range g.Consumer() {
			got <- rpc
			switch rpc.Command.(type) {
			case *raft.RequestVoteRequest:
				rpc.Respond(&raft.RequestVoteResponse{Term: 7, Granted: true}, nil)
			case *raft.AppendEntriesRequest:
				rpc.Respond(&raft.AppendEntriesResponse{Term: 7, Success: true}, nil)
			}
		}
	}()

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
