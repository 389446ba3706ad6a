package server

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/proto"
)

// A leader asked to remove itself hands leadership over first: the
// removal is then committed by the new leader, and the old node's Raft
// goes on as a follower instead of shutting down as a removed leader.
func TestRemoveLeaderHandsOverFirst(t *testing.T) {
	c := StartCluster(t, 3)
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
