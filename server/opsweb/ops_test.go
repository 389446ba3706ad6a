package opsweb

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
)

// lat is a histogram over the buckets 1 ms, 10 ms, 100 ms with the given
// cumulative counts and total.
func lat(name string, count uint64, cum ...uint64) *pb.OpLatency {
	return &pb.OpLatency{Name: name, Count: count, UpperBounds: []float64{0.001, 0.01, 0.1}, CumulativeCounts: cum}
}

func node(id string, cmds, reads []*pb.OpLatency) *pb.NodeStatus {
	return &pb.NodeStatus{Id: id, CommandLatency: cmds, ReadLatency: reads}
}

func status(nodes ...*pb.NodeStatus) *pb.StatusResponse { return &pb.StatusResponse{Nodes: nodes} }

func TestClusterOps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	p99 := func(v float64) *float64 { return &v }
	cases := []struct {
		name     string
		readings []reading
		commands []OpStat
		reads    []OpStat
		perNode  map[string]float64
	}{
		{"one reading: nothing yet", []reading{
			readingOf(at(0), status(node("n1", []*pb.OpLatency{lat("write", 10, 10, 10, 10)}, nil))),
		}, []OpStat{}, []OpStat{}, map[string]float64{}},
		{"the leader's commands and every node's reads", []reading{
			readingOf(at(0), status(
				node("n1", []*pb.OpLatency{lat("write", 100, 100, 100, 100)}, []*pb.OpLatency{lat("linearizable", 5, 5, 5, 5)}),
				node("n2", nil, []*pb.OpLatency{lat("stale", 0, 0, 0, 0)}))),
			readingOf(at(10), status(
				node("n1", []*pb.OpLatency{lat("write", 200, 100, 200, 200)}, []*pb.OpLatency{lat("linearizable", 15, 15, 15, 15)}),
				node("n2", nil, []*pb.OpLatency{lat("stale", 20, 20, 20, 20)}))),
		},
			// 100 writes in 10 s, all between 1 and 10 ms: p99 inside that bucket.
			[]OpStat{{Name: "write", PerSecond: 10, P99: p99(0.001 + 0.009*0.99)}},
			[]OpStat{{Name: "stale", PerSecond: 2, P99: p99(0.001 * 0.99)}, {Name: "linearizable", PerSecond: 1, P99: p99(0.001 * 0.99)}},
			map[string]float64{"n1": 11, "n2": 2}},
		{"leadership moved inside the window: both leaders' commands count", []reading{
			readingOf(at(0), status(node("n1", []*pb.OpLatency{lat("mkdir", 50, 50, 50, 50)}, nil), node("n2", nil, nil))),
			readingOf(at(10), status(node("n1", []*pb.OpLatency{lat("mkdir", 80, 80, 80, 80)}, nil),
				node("n2", []*pb.OpLatency{lat("mkdir", 20, 0, 20, 20)}, nil))),
		}, []OpStat{{Name: "mkdir", PerSecond: 5, P99: p99(0.001 + 0.009*(49.5-30)/20)}}, []OpStat{},
			map[string]float64{"n1": 3, "n2": 2}},
		{"a member that did not answer at first counts from its first answer; a restarted one from 0", []reading{
			readingOf(at(0), status(node("n1", []*pb.OpLatency{lat("write", 500, 500, 500, 500)}, nil),
				&pb.NodeStatus{Id: "n2", Error: "deadline exceeded"})),
			readingOf(at(6), status(node("n1", []*pb.OpLatency{lat("write", 30, 30, 30, 30)}, nil),
				node("n2", nil, []*pb.OpLatency{lat("stale", 10, 10, 10, 10)}))),
			readingOf(at(8), status(node("n1", []*pb.OpLatency{lat("write", 40, 40, 40, 40)}, nil),
				node("n2", nil, []*pb.OpLatency{lat("stale", 14, 14, 14, 14)}))),
		}, []OpStat{{Name: "write", PerSecond: 5, P99: p99(0.001 * 0.99)}},
			[]OpStat{{Name: "stale", PerSecond: 2, P99: p99(0.001 * 0.99)}},
			map[string]float64{"n1": 5, "n2": 2}},
		{"a histogram that does not hold together is left out", []reading{
			readingOf(at(0), status(node("n1", []*pb.OpLatency{lat("write", 0, 0, 0, 0)}, nil))),
			readingOf(at(10), status(node("n1", []*pb.OpLatency{
				lat("write", 10, 5, 3, 10),                             // counts go down
				{Name: "rename", Count: 10, UpperBounds: []float64{1}}, // bounds without counts
				{Name: "unlink", Count: 1, UpperBounds: []float64{math.NaN()}, CumulativeCounts: []uint64{1}},
				lat("mkdir", 20, 20, 20, 20),
			}, nil))),
		}, []OpStat{{Name: "mkdir", PerSecond: 2, P99: p99(0.001 * 0.99)}}, []OpStat{}, map[string]float64{"n1": 2}},
		{"members with other buckets: a rate but no p99", []reading{
			readingOf(at(0), status(node("n1", nil, nil), node("n2", nil, nil))),
			readingOf(at(10), status(node("n1", nil, []*pb.OpLatency{lat("stale", 10, 10, 10, 10)}),
				node("n2", nil, []*pb.OpLatency{{Name: "stale", Count: 10, UpperBounds: []float64{1}, CumulativeCounts: []uint64{10}}}))),
		}, []OpStat{}, []OpStat{{Name: "stale", PerSecond: 2}}, map[string]float64{"n1": 1, "n2": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			commands, reads, perNode := clusterOps(tc.readings)
			requireOps(t, tc.commands, commands)
			requireOps(t, tc.reads, reads)
			require.Equal(t, len(tc.perNode), len(perNode))
			for id, want := range tc.perNode {
				require.InDelta(t, want, perNode[id], 1e-9, id)
			}
		})
	}
}

func requireOps(t *testing.T, want, got []OpStat) {
	t.Helper()
	require.Len(t, got, len(want), "%+v", got)
	for i := range want {
		require.Equal(t, want[i].Name, got[i].Name)
		require.InDelta(t, want[i].PerSecond, got[i].PerSecond, 1e-9, want[i].Name)
		if want[i].P99 == nil {
			require.Nil(t, got[i].P99, want[i].Name)
			continue
		}
		require.NotNil(t, got[i].P99, want[i].Name)
		require.InDelta(t, *want[i].P99, *got[i].P99, 1e-9, want[i].Name)
	}
}

// FuzzPeerLatency feeds a peer's status answer as bytes from the network
// to the page's rates: whatever a member reports, the page neither
// panics nor shows a negative rate or a p99 outside the buckets.
func FuzzPeerLatency(f *testing.F) {
	seed := func(n *pb.NodeStatus) {
		b, err := proto.Marshal(n)
		require.NoError(f, err)
		f.Add(b)
	}
	seed(node("n1", []*pb.OpLatency{lat("write", 10, 2, 5, 10)}, []*pb.OpLatency{lat("linearizable", 3, 3, 3, 3)}))
	seed(node("n2", []*pb.OpLatency{{Name: "x", Count: 1, UpperBounds: []float64{2, 1}, CumulativeCounts: []uint64{1, 1}}}, nil))
	seed(node("n3", []*pb.OpLatency{{Name: "x", Count: 1 << 62, SumSeconds: math.Inf(1), UpperBounds: []float64{1}, CumulativeCounts: []uint64{1 << 63}}}, nil))
	base := node("n1", []*pb.OpLatency{lat("write", 1, 1, 1, 1)}, []*pb.OpLatency{lat("linearizable", 1, 1, 1, 1)})
	f.Fuzz(func(t *testing.T, b []byte) {
		var n pb.NodeStatus
		if proto.Unmarshal(b, &n) != nil {
			return
		}
		n.Id, n.Error = "n1", ""
		t0 := time.Unix(0, 0)
		rs := []reading{readingOf(t0, status(base)), readingOf(t0.Add(time.Second), status(&n))}
		commands, reads, perNode := clusterOps(rs)
		for _, o := range append(commands, reads...) {
			require.False(t, math.IsNaN(o.PerSecond), o.Name)
			require.GreaterOrEqual(t, o.PerSecond, 0.0, o.Name)
			if o.P99 != nil {
				require.False(t, math.IsNaN(*o.P99), o.Name)
			}
		}
		require.LessOrEqual(t, len(perNode), 1)
	})
}
