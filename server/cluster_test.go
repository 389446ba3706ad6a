package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

func TestStatusListsEveryNode(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Ask a follower: the answer must name the same leader and every node.
	var follower *server.Node
	for _, n := range c.Nodes() {
		if n != leader {
			follower = n
		}
	}
	require.Eventually(t, func() bool {
		st, err := c.Client(follower.APIAddr()).Status(ctx, &pb.StatusRequest{Version: pb.Version})
		if err != nil || st.Leader != leader.ID() || st.LeaderApiAddr != leader.APIAddr() || len(st.Nodes) != 3 {
			return false
		}
		for _, ns := range st.Nodes {
			if ns.Error != "" || ns.ApiAddr == "" || ns.RaftAddr == "" || !ns.Voter {
				return false
			}
			want := "Follower"
			if ns.Id == leader.ID() {
				want = "Leader"
			}
			if ns.State != want {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
}
