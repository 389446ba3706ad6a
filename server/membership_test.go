package server_test

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// A leader asked to remove itself hands leadership over first: the
// removal is then committed by the new leader, and the old node's Raft
// goes on as a follower instead of shutting down as a removed leader.
func TestRemoveLeaderHandsOverFirst(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	ctx := ctxTimeout(t, 20*time.Second)
	_, err := c.Client(leader.APIAddr()).RemoveNode(ctx, &pb.RemoveNodeRequest{Version: pb.Version, Id: leader.ID()})
	require.NoError(t, err)
	require.NotEqual(t, raft.Shutdown, leader.State(), "removed while leading: raft shut down")
	require.NotEqual(t, raft.Leader, leader.State())

	rest := follower(c, leader, 0)
	st, err := c.Client(rest.APIAddr()).Status(ctx, &pb.StatusRequest{Version: pb.Version})
	require.NoError(t, err)
	var ids []string
	for _, ns := range st.Nodes {
		ids = append(ids, ns.Id)
	}
	require.Len(t, ids, 2)
	require.NotContains(t, ids, leader.ID())
	require.NotEqual(t, leader.ID(), st.Leader)
	c.Kill(c.Index(leader))
	openSession(t, c.Client(rest.APIAddr())).mkdir("/still-writable")
}

// A node being removed never brings itself back. Removal deletes the
// node's API address, then takes it out of the Raft configuration; the
// removed node may never hear of the second step (the leader stops
// replicating to it). A node still in its configuration without an address
// used to read that as "my address is not recorded yet" and ask the leader
// to add it, which re-added it as a voter once the removal had committed
// (seen once in CI, TestNodeReplaceUnderWriteLoad). Here the first step
// alone is applied, so the node stays in the configuration and knows the
// leader: the window that is otherwise a matter of timing stays open.
func TestNodeBeingRemovedDoesNotReAddItself(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	gone := follower(c, leader, 0)
	ctx := ctxTimeout(t, 20*time.Second)
	require.NoError(t, leader.DeleteMember(ctx, gone.ID()))
	c.WaitApplied(leader.AppliedIndex(), 10*time.Second)
	require.NotEmpty(t, gone.MemberMap(), "the node has the member map")
	require.NotContains(t, gone.Members(), gone.ID())

	time.Sleep(2500 * time.Millisecond) // the node checks its address once a second
	require.NotContains(t, leader.Members(), gone.ID(), "the node asked to be recorded again")

	require.NoError(t, server.WaitFuture(ctx, leader.Raft().RemoveServer(raft.ServerID(gone.ID()), 0, 0)))
	time.Sleep(1500 * time.Millisecond)
	_, in := leader.Suffrage(gone.ID())
	require.False(t, in, "%s is in the configuration again", gone.ID())
}
