package replace

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
)

func TestParseReplaceTarget(t *testing.T) {
	cases := []struct {
		in   string
		want Target
		ok   bool
	}{
		{"n4@10.0.0.4:7101,10.0.0.4:7001", Target{"n4", "10.0.0.4:7101", "10.0.0.4:7001"}, true},
		{" n4 @ h:1 , h:2 ", Target{"n4", "h:1", "h:2"}, true},
		{"n4", Target{}, false},
		{"n4@h:1", Target{}, false},
		{"@h:1,h:2", Target{}, false},
		{"n4@,h:2", Target{}, false},
		{"n4@h:1,", Target{}, false},
		{"n4@h:1,h:2,h:3", Target{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTarget(tc.in)
			if !tc.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestCheckQuorum(t *testing.T) {
	up := func(id string) *pb.NodeStatus { return &pb.NodeStatus{Id: id, Voter: true, State: "Follower"} }
	down := func(id string) *pb.NodeStatus { return &pb.NodeStatus{Id: id, Voter: true, Error: "unreachable"} }
	cases := []struct {
		name  string
		nodes []*pb.NodeStatus
		err   string
	}{
		{"all up", []*pb.NodeStatus{up("n1"), up("n2"), up("n3")}, ""},
		{"old down", []*pb.NodeStatus{up("n1"), down("n2"), up("n3")}, ""},
		// 4 voters with n1 and n2 down: 2 of 4 cannot commit the promotion.
		{"old and another down", []*pb.NodeStatus{down("n1"), down("n2"), up("n3")}, "promoting n4 would leave 2 of 4"},
		// Promotion works (3 of 5 voters reachable), but without the old
		// node 2 of 4 are left.
		{"others down, old up", []*pb.NodeStatus{down("n1"), up("n2"), up("n3"), down("n5")}, "removing n2 would leave 2 of 4"},
		{"new already a voter", []*pb.NodeStatus{up("n1"), up("n2"), up("n3"), up("n4")}, ""},
		{"non-voters do not count", []*pb.NodeStatus{up("n1"), up("n2"), {Id: "n9", State: "Follower"}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckQuorum(&pb.StatusResponse{Nodes: tc.nodes}, "n2", "n4")
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}

// TestClusterStatusIsTheLeaders asks a follower and gets the leader's
// view: a follower's may hold a configuration change not yet committed.
func TestClusterStatusIsTheLeaders(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(30 * time.Second)
	var follower string
	for i := range c.Size() {
		if n := c.Node(i); n != nil && n != leader {
			follower = n.APIAddr()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Once the follower knows the leader's address (its first heartbeat).
	var st *pb.StatusResponse
	require.Eventually(t, func() bool {
		var err error
		st, err = ClusterStatus(ctx, Net{}, []string{follower}, 5*time.Second)
		return err == nil && st.GetSelf().GetState() == "Leader"
	}, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, leader.ID(), st.GetSelf().GetId())
	require.Len(t, st.Nodes, 3)
}
