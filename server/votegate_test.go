package server_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
