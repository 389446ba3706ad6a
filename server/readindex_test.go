package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// slowHeartbeats makes the lease's margins wide enough for a loaded test
// machine: heartbeats every 100-200 ms, a lease of 470 ms.
func slowHeartbeats(_ int, c *server.Config) {
	c.Raft.HeartbeatTimeout, c.Raft.ElectionTimeout, c.Raft.LeaderLeaseTimeout = time.Second, time.Second, time.Second
}

// waitLease polls until n holds the read lease of its current term.
func waitLease(t *testing.T, n *server.Node) {
	t.Helper()
	require.Eventually(t, func() bool { return holdsLease(n) }, 10*time.Second, 5*time.Millisecond)
}

func holdsLease(n *server.Node) bool {
	_, ok := n.LeaseRemaining()
	return ok
}

// otherLeader returns a ready leader other than old, or nil.
func otherLeader(c *servertest.Cluster, old *server.Node) *server.Node {
	for _, n := range c.Nodes() {
		if n != old && n.LeaderReady() {
			return n
		}
	}
	return nil
}

// readQuery is a linearizable read of length bytes at off of path.
func readQuery(path string, off, length int64) *pb.QueryRequest {
	return &pb.QueryRequest{Version: pb.Version, Consistency: pb.Consistency_LINEARIZABLE,
		Query: &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: path}, Offset: off, Length: length}}}}
}

func readString(t *testing.T, cli pb.MemFSClient, path string) string {
	t.Helper()
	res := query(t, cli, readQuery(path, 0, 64).Query, pb.Consistency_LINEARIZABLE)
	require.Zero(t, res.Errno, res.Message)
	return string(res.Data)
}

func TestLinearizableReadsUnderTheLeaseRunNoRounds(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithNodeConfig(slowHeartbeats))
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := openSession(t, cli)
	s.create("/f")
	waitLease(t, leader)

	rounds, served := leader.VerifyRounds(), leader.LeaseServed()
	const n = 200
	for i := range n {
		want := fmt.Sprintf("%08d", i)
		s.write("/f", 0, []byte(want))
		require.Equal(t, want, readString(t, cli, "/f"), "a read sees the write acknowledged before it")
	}
	require.Equal(t, rounds, leader.VerifyRounds(), "no VerifyLeader round")
	require.Equal(t, served+n, leader.LeaseServed(), "every read answered under the lease")
}

func TestWithoutTheLeaseEveryReadWaitsForARound(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithNodeConfig(func(_ int, c *server.Config) { c.DisableReadLease = true }))
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := openSession(t, cli)
	s.create("/f")
	s.write("/f", 0, []byte("data"))

	rounds := leader.VerifyRounds()
	const n = 20
	for range n {
		require.Equal(t, "data", readString(t, cli, "/f"))
	}
	require.GreaterOrEqual(t, leader.VerifyRounds()-rounds, uint64(n), "one round per sequential read")
	require.Zero(t, leader.LeaseServed())
	require.False(t, holdsLease(leader))
}

func TestLeaseIsDroppedAtALeadershipTransfer(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	old := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(old.APIAddr()))
	s.create("/f")
	s.write("/f", 0, []byte("v1"))
	waitLease(t, old)
	term := old.Raft().CurrentTerm()

	require.NoError(t, old.Raft().LeadershipTransfer().Error())
	_, ok := old.LeaseRemainingIn(term)
	require.False(t, ok, "the lease went with the transfer")
	var next *server.Node
	require.Eventually(t, func() bool {
		next = otherLeader(c, old)
		return next != nil
	}, 10*time.Second, 5*time.Millisecond)

	served := old.LeaseServed()
	s2 := openSession(t, c.Client(next.APIAddr()))
	s2.write("/f", 0, []byte("v2"))
	require.Equal(t, "v2", readString(t, c.Client(old.APIAddr()), "/f"), "the old leader forwards the read")
	require.Equal(t, served, old.LeaseServed(), "and answered nothing under its lease")
}

func TestLeaseLapsesOnALeaderCutOffAndItNeverAnswersStale(t *testing.T) {
	const size = 3
	trans := make([]*raft.InmemTransport, size)
	for i := range trans {
		_, trans[i] = raft.NewInmemTransport("")
	}
	link := func(i, j int, up bool) {
		if up {
			trans[i].Connect(trans[j].LocalAddr(), trans[j])
			trans[j].Connect(trans[i].LocalAddr(), trans[i])
			return
		}
		trans[i].Disconnect(trans[j].LocalAddr())
		trans[j].Disconnect(trans[i].LocalAddr())
	}
	for i := range size {
		for j := range i {
			link(i, j, true)
		}
	}
	c := servertest.StartCluster(t, size, servertest.WithNodeConfig(func(i int, cfg *server.Config) {
		slowHeartbeats(i, cfg)
		if i == 0 {
			// The first leader, once cut off, still takes itself for the
			// leader for 2-4 s; the others elect a new one after 1-2 s.
			// Its lease (0.94 s) stays within their heartbeat timeout.
			cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout, cfg.Raft.LeaderLeaseTimeout = 2*time.Second, 2*time.Second, 2*time.Second
		}
		cfg.Transport = trans[i]
		cfg.RaftLogLevel = "off" // the cut makes Raft log every failed RPC
	}))
	old := c.WaitLeader(10 * time.Second)
	require.Same(t, c.Node(0), old, "the node that bootstrapped leads")
	oldCli := c.Client(old.APIAddr())
	s := openSession(t, oldCli)
	s.create("/f")
	s.write("/f", 0, []byte("v1"))
	waitLease(t, old)
	term := old.Raft().CurrentTerm()

	cut := c.Index(old)
	for j := range size {
		if j != cut {
			link(cut, j, false)
		}
	}
	// No answers: the lease ends while the node may still think it leads.
	require.Eventually(t, func() bool {
		_, ok := old.LeaseRemainingIn(term)
		return !ok
	}, 5*time.Second, 5*time.Millisecond)
	served := old.LeaseServed()

	var next *server.Node
	require.Eventually(t, func() bool {
		next = otherLeader(c, old)
		return next != nil
	}, 20*time.Second, 5*time.Millisecond)
	s2 := openSession(t, c.Client(next.APIAddr()))
	s2.write("/f", 0, []byte("v2"))
	// Until it learns of the new leader, the old one may fail reads but
	// never answer one from its stale state.
	tries := 0
	for ; old.IsLeader(); tries++ {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		resp, err := oldCli.Query(ctx, readQuery("/f", 0, 64))
		cancel()
		if err == nil {
			require.Equal(t, "v2", string(resp.Result.Data))
		}
	}
	t.Logf("%d reads tried on the old leader after the new one committed", tries)
	for j := range size {
		if j != cut {
			link(cut, j, true)
		}
	}
	require.Equal(t, "v2", readString(t, oldCli, "/f"))
	require.Equal(t, served, old.LeaseServed(), "nothing answered under the lapsed lease")
}

// BenchmarkLinearizableRead compares 4 KiB linearizable reads at random
// offsets of a 1 MiB file, unary Query to the leader of an in-process
// 3-node cluster, under the read lease and with a VerifyLeader round per
// read (shared by concurrent reads), with 1 and 16 clients:
//
//	go test ./server/ -run '^$' -bench LinearizableRead -benchtime 3s -count 3
func BenchmarkLinearizableRead(b *testing.B) {
	for _, clients := range []int{1, 16} {
		for _, mode := range []string{"lease", "rounds"} {
			b.Run(fmt.Sprintf("%s/x%d", mode, clients), func(b *testing.B) {
				benchReads(b, mode == "rounds", clients)
			})
		}
	}
}

func benchReads(b *testing.B, noLease bool, clients int) {
	const fileSize, readSize = 1 << 20, 4096
	c := servertest.StartCluster(b, 3, servertest.WithLogStore(server.LogStoreMem), servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.DisableReadLease = noLease
	}))
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := openSession(b, cli)
	s.create("/f")
	s.write("/f", 0, pattern(fileSize, 5))
	if !noLease {
		require.Eventually(b, func() bool { return holdsLease(leader) }, 10*time.Second, 5*time.Millisecond)
	}
	rounds := leader.VerifyRounds()
	b.SetBytes(readSize)
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for next.Add(1) <= int64(b.N) {
				off := rng.Int64N(fileSize/readSize) * readSize
				resp, err := cli.Query(context.Background(), readQuery("/f", off, readSize))
				if err != nil || len(resp.Result.Data) != readSize {
					b.Errorf("read at %d: %v", off, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reads/s")
	b.ReportMetric(float64(leader.VerifyRounds()-rounds)/float64(b.N), "rounds/read")
}
