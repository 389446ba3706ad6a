package server_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

func TestEphemeralNodeRejoinsAndVotesOnceCaughtUp(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	leader := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(leader.APIAddr()))
	s.mkdir("/before")
	f := follower(c, leader, 0)
	i := c.Index(f)
	c.Kill(i)
	s.mkdir("/while-away")
	n := c.Restart(i)
	require.True(t, n.VoteGated(), "an ephemeral node that rejoins empty starts gated")
	require.Eventually(t, n.VoteGateOpen, 30*time.Second, 20*time.Millisecond)
	require.GreaterOrEqual(t, n.AppliedIndex(), leader.Raft().CommitIndex()-2)
}

// A second node lost while the first catches up must not wedge the
// cluster: the follower that has every entry wins with the gated node's
// vote, and what was committed before stays.
func TestLeaderLostWhileANodeCatchesUp(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	leader := c.WaitLeader(10 * time.Second)
	// Nodes that joined empty start gated too.
	for _, n := range c.Nodes() {
		require.Eventually(t, n.VoteGateOpen, 30*time.Second, 20*time.Millisecond)
	}
	server.HoldVoteGates(t)
	s := openSession(t, c.Client(leader.APIAddr()))
	s.mkdir("/before")
	a, b := c.Index(follower(c, leader, 0)), c.Index(follower(c, leader, 1))
	c.Kill(a)
	s.mkdir("/while-away")
	gated := c.Restart(a)
	require.Eventually(t, gated.VoteFloorKnown, 30*time.Second, 20*time.Millisecond)
	require.False(t, gated.VoteGateOpen())
	st := leader.ClusterStatus(ctxTimeout(t, 10*time.Second))
	require.Len(t, st.Nodes, 3)
	for _, ns := range st.Nodes {
		require.Empty(t, ns.Error)
		require.Equal(t, ns.Id == gated.ID(), ns.CatchingUp, "status of %s", ns.Id)
		require.True(t, ns.Voter)
	}

	c.Kill(c.Index(leader))
	next := c.WaitLeader(30 * time.Second)
	require.Equal(t, b, c.Index(next), "only the node that kept its state may lead")
	require.False(t, gated.VoteGateOpen(), "the gated node voted without opening")
	s = openSession(t, c.Client(next.APIAddr()))
	s.mkdir("/after")
	for _, p := range []string{"/before", "/while-away", "/after"} {
		require.Zero(t, stat(t, c.Client(next.APIAddr()), p, pb.Consistency_LINEARIZABLE).Errno, p)
	}
}
