package server

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
)

// fakeRaft is the raftView of a node the test steers.
type fakeRaft struct {
	mu     sync.Mutex
	state  raft.RaftState
	term   uint64
	leader raft.ServerID
	conf   raft.Configuration
}

func (f *fakeRaft) State() raft.RaftState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

func (f *fakeRaft) CurrentTerm() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.term
}

func (f *fakeRaft) LeaderWithID() (raft.ServerAddress, raft.ServerID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return raft.ServerAddress(f.leader), f.leader
}

func (f *fakeRaft) latestConfiguration() (raft.Configuration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conf.Clone(), nil
}

func (f *fakeRaft) set(state raft.RaftState, term uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.term = state, term
}

func voters(ids ...string) raft.Configuration {
	var c raft.Configuration
	for _, id := range ids {
		c.Servers = append(c.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(id)})
	}
	return c
}

// fakeClock is a monotonic clock the test advances.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1000, 0)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testLease is a lease on a fake clock, led by "a" in term 5 of conf.
func testLease(t *testing.T, conf raft.Configuration) (*readLease, *fakeRaft, *fakeClock) {
	t.Helper()
	l := newReadLease(Config{Raft: DefaultRaftTuning()}, false)
	clk := newFakeClock()
	l.now = clk.now
	v := &fakeRaft{state: raft.Leader, term: 5, leader: "a", conf: conf}
	l.attach(v)
	return l, v, clk
}

// ack plays one AppendEntries to id that took a millisecond.
func ack(l *readLease, clk *fakeClock, id string, term uint64) {
	prev := l.lastSent(raft.ServerID(id), term)
	sent := clk.now()
	clk.advance(time.Millisecond)
	l.acked(raft.ServerID(id), term, prev, sent, clk.now())
}

func TestReadLeaseTimingLeavesTheDriftMargin(t *testing.T) {
	for _, hb := range []time.Duration{50 * time.Millisecond, 400 * time.Millisecond, 5 * time.Second} {
		lease, window := leaseTiming(RaftTuning{HeartbeatTimeout: hb})
		worst := (1 + maxClockRateDrift) / (1 - maxClockRateDrift) // one clock against another
		require.Positive(t, lease)
		require.Less(t, float64(lease)*worst, float64(hb)*leaseFraction, "hb %v", hb)
		require.Less(t, float64(window)*worst, float64(hb), "hb %v", hb)
		require.Less(t, lease, window)
	}
}

func TestReadLeaseNeedsUnbrokenContactWithAMajority(t *testing.T) {
	l, v, clk := testLease(t, voters("a", "b", "c"))
	held := func(term uint64) bool {
		_, ok := l.remaining(term, "a")
		return ok
	}
	require.False(t, held(5), "no answers yet")
	ack(l, clk, "b", 5)
	require.False(t, held(5), "a first answer might race a vote: it does not back the lease")
	clk.advance(50 * time.Millisecond)
	sent := clk.now()
	ack(l, clk, "b", 5)
	left, ok := l.remaining(5, "a")
	require.True(t, ok, "a second answer within the window backs it: b with a is a majority")
	require.Equal(t, l.dur-clk.now().Sub(sent), left)
	require.False(t, held(4), "only in the term of the answers")

	clk.advance(l.dur)
	require.False(t, held(5), "the lease lapses")
	clk.advance(l.window)
	ack(l, clk, "b", 5)
	require.False(t, held(5), "after a gap longer than the window b may have lost the leader")
	ack(l, clk, "b", 5)
	require.True(t, held(5))

	v.set(raft.Follower, 5)
	require.False(t, held(5), "not while a follower")
	v.set(raft.Leader, 6)
	require.False(t, held(5), "not once the term changed")
	require.False(t, held(6), "answers of term 5 do not back term 6")
	ack(l, clk, "b", 6)
	ack(l, clk, "b", 6)
	require.True(t, held(6))
	ack(l, clk, "c", 5)
	ack(l, clk, "c", 5)
	require.True(t, held(6), "a late answer of an earlier term changes nothing")

	l.revoke()
	require.False(t, held(6), "given up for the term (leadership transfer)")
	v.set(raft.Leader, 7)
	ack(l, clk, "b", 7)
	ack(l, clk, "b", 7)
	require.True(t, held(7), "a later term may hold a lease again")
}

func TestReadLeaseEndsAtTheMajorityThAnswer(t *testing.T) {
	conf := voters("a", "b", "c", "d", "e")
	conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Nonvoter, ID: "f", Address: "f"})
	l, _, clk := testLease(t, conf)
	backed := map[string]time.Time{}
	for _, id := range []string{"f", "b", "c", "d"} {
		ack(l, clk, id, 5)
		clk.advance(10 * time.Millisecond)
		backed[id] = clk.now()
		ack(l, clk, id, 5)
	}
	// Five voters: a and two others. The answers from d and c are the two
	// latest; the non-voter f does not count.
	left, ok := l.remaining(5, "a")
	require.True(t, ok)
	require.Equal(t, backed["c"].Add(l.dur).Sub(clk.now()), left)

	left, ok = l.remaining(5, "f")
	require.True(t, ok, "a leader that is not a voter (leaving) needs three others")
	require.Equal(t, backed["b"].Add(l.dur).Sub(clk.now()), left)

	single, _, _ := testLease(t, voters("a"))
	_, ok = single.remaining(5, "a")
	require.True(t, ok, "a single voter needs no one")
}

// inmemPair connects two in-memory transports; cleanup closes them.
func inmemPair(t *testing.T) (addrA raft.ServerAddress, a *raft.InmemTransport, addrB raft.ServerAddress, b *raft.InmemTransport) {
	t.Helper()
	addrA, a = raft.NewInmemTransport("")
	addrB, b = raft.NewInmemTransport("")
	a.Connect(addrB, b)
	b.Connect(addrA, a)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return addrA, a, addrB, b
}

// serveRPCs plays Raft on ch until the test ends: handle answers each RPC.
func serveRPCs(t *testing.T, ch <-chan raft.RPC, handle func(raft.RPC)) {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			select {
			case rpc := <-ch:
				handle(rpc)
			case <-done:
				return
			}
		}
	}()
}

func TestLeaseTransportTimesAppendsAndDropsTheLeaseBeforeTimeoutNow(t *testing.T) {
	_, a, addrB, b := inmemPair(t)
	l := newReadLease(Config{Raft: DefaultRaftTuning()}, false)
	v := &fakeRaft{state: raft.Leader, term: 3, leader: "a", conf: voters("a", "b")}
	l.attach(v)
	tr := l.transport(newVoteGate(a, "a", false))
	t.Cleanup(func() { _ = tr.Close() })

	heldAtTimeoutNow := make(chan bool, 1)
	serveRPCs(t, b.Consumer(), func(rpc raft.RPC) {
		switch rpc.Command.(type) {
		case *raft.AppendEntriesRequest:
			rpc.Respond(&raft.AppendEntriesResponse{Term: v.CurrentTerm(), Success: true}, nil)
		case *raft.TimeoutNowRequest:
			_, ok := l.remaining(3, "a")
			heldAtTimeoutNow <- ok
			rpc.Respond(&raft.TimeoutNowResponse{}, nil)
		}
	})
	appendEntries := func(term uint64) {
		var resp raft.AppendEntriesResponse
		require.NoError(t, tr.AppendEntries("b", addrB, &raft.AppendEntriesRequest{Term: term}, &resp))
		require.True(t, resp.Success)
	}
	appendEntries(3)
	appendEntries(3)
	_, ok := l.remaining(3, "a")
	require.True(t, ok, "two answered AppendEntries back the lease")

	require.NoError(t, tr.TimeoutNow("b", addrB, &raft.TimeoutNowRequest{}, &raft.TimeoutNowResponse{}))
	require.False(t, <-heldAtTimeoutNow, "the lease is gone before the target can start its election")
	appendEntries(3)
	_, ok = l.remaining(3, "a")
	require.False(t, ok, "and stays gone for the term")
}

func TestLeaseTransportHoldsVotesAfterARestartAndRefusesStrayTimeoutNow(t *testing.T) {
	_, a, addrB, b := inmemPair(t)
	l := newReadLease(Config{Raft: DefaultRaftTuning()}, true)
	clk := newFakeClock()
	l.now = clk.now
	l.holdUntil = clk.now().Add(DefaultRaftTuning().HeartbeatTimeout) // as newReadLease, on the fake clock
	v := &fakeRaft{state: raft.Follower, term: 7, leader: "a", conf: voters("a", "b", "c")}
	l.attach(v)
	tr := l.transport(newVoteGate(b, "b", false))
	t.Cleanup(func() { _ = tr.Close() })

	got := make(chan raft.RPC, 4)
	serveRPCs(t, tr.Consumer(), func(rpc raft.RPC) {
		got <- rpc
		switch rpc.Command.(type) {
		case *raft.RequestVoteRequest:
			rpc.Respond(&raft.RequestVoteResponse{Term: 8, Granted: true}, nil)
		case *raft.RequestPreVoteRequest:
			rpc.Respond(&raft.RequestPreVoteResponse{Term: 8, Granted: true}, nil)
		case *raft.TimeoutNowRequest:
			rpc.Respond(&raft.TimeoutNowResponse{}, nil)
		}
	})

	var vr raft.RequestVoteResponse
	require.NoError(t, a.RequestVote("b", addrB, &raft.RequestVoteRequest{Term: 8}, &vr))
	require.False(t, vr.Granted, "a restarted node holds its vote back")
	var pr raft.RequestPreVoteResponse
	require.NoError(t, a.RequestPreVote("b", addrB, &raft.RequestPreVoteRequest{Term: 8}, &pr))
	require.False(t, pr.Granted)
	require.Empty(t, got, "Raft never saw them")

	clk.advance(DefaultRaftTuning().HeartbeatTimeout)
	require.NoError(t, a.RequestVote("b", addrB, &raft.RequestVoteRequest{Term: 8}, &vr))
	require.True(t, vr.Granted, "after the hold Raft answers")
	require.IsType(t, &raft.RequestVoteRequest{}, (<-got).Command)

	stray := &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{ID: []byte("c")}}
	require.ErrorIs(t, a.TimeoutNow("b", addrB, stray, &raft.TimeoutNowResponse{}), errStrayTimeoutNow,
		"only the leader b follows may hand leadership to it")
	fromLeader := &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{ID: []byte("a")}}
	require.NoError(t, a.TimeoutNow("b", addrB, fromLeader, &raft.TimeoutNowResponse{}))
	require.IsType(t, &raft.TimeoutNowRequest{}, (<-got).Command)
}

// slowHeartbeats makes the lease's margins wide enough for a loaded test
// machine: heartbeats every 100-200 ms, a lease of 470 ms.
func slowHeartbeats(_ int, c *Config) {
	c.Raft.HeartbeatTimeout, c.Raft.ElectionTimeout, c.Raft.LeaderLeaseTimeout = time.Second, time.Second, time.Second
}

// waitLease polls until n holds the read lease of its current term.
func waitLease(t *testing.T, n *Node) {
	t.Helper()
	require.Eventually(t, func() bool { return holdsLease(n) }, 10*time.Second, 5*time.Millisecond)
}

func holdsLease(n *Node) bool {
	_, ok := n.lease.remaining(n.raft.CurrentTerm(), raft.ServerID(n.ID()))
	return ok
}

// otherLeader returns a ready leader other than old, or nil.
func otherLeader(c *Cluster, old *Node) *Node {
	for _, n := range c.Nodes() {
		if n != old && n.leaderIsReady() {
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
	c := StartCluster(t, 3, WithNodeConfig(slowHeartbeats))
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := openSession(t, cli)
	s.create("/f")
	waitLease(t, leader)

	rounds, served := leader.verifier.roundsRun.Load(), leader.lease.served.Load()
	const n = 200
	for i := range n {
		want := fmt.Sprintf("%08d", i)
		s.write("/f", 0, []byte(want))
		require.Equal(t, want, readString(t, cli, "/f"), "a read sees the write acknowledged before it")
	}
	require.Equal(t, rounds, leader.verifier.roundsRun.Load(), "no VerifyLeader round")
	require.Equal(t, served+n, leader.lease.served.Load(), "every read answered under the lease")
}

func TestWithoutTheLeaseEveryReadWaitsForARound(t *testing.T) {
	c := StartCluster(t, 3, WithNodeConfig(func(_ int, c *Config) { c.DisableReadLease = true }))
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	s := openSession(t, cli)
	s.create("/f")
	s.write("/f", 0, []byte("data"))

	rounds := leader.verifier.roundsRun.Load()
	const n = 20
	for range n {
		require.Equal(t, "data", readString(t, cli, "/f"))
	}
	require.GreaterOrEqual(t, leader.verifier.roundsRun.Load()-rounds, uint64(n), "one round per sequential read")
	require.Zero(t, leader.lease.served.Load())
	require.False(t, holdsLease(leader))
}

func TestLeaseIsDroppedAtALeadershipTransfer(t *testing.T) {
	c := StartCluster(t, 3)
	old := c.WaitLeader(10 * time.Second)
	s := openSession(t, c.Client(old.APIAddr()))
	s.create("/f")
	s.write("/f", 0, []byte("v1"))
	waitLease(t, old)
	term := old.raft.CurrentTerm()

	require.NoError(t, old.raft.LeadershipTransfer().Error())
	_, ok := old.lease.remaining(term, raft.ServerID(old.ID()))
	require.False(t, ok, "the lease went with the transfer")
	var next *Node
	require.Eventually(t, func() bool {
		next = otherLeader(c, old)
		return next != nil
	}, 10*time.Second, 5*time.Millisecond)

	served := old.lease.served.Load()
	s2 := openSession(t, c.Client(next.APIAddr()))
	s2.write("/f", 0, []byte("v2"))
	require.Equal(t, "v2", readString(t, c.Client(old.APIAddr()), "/f"), "the old leader forwards the read")
	require.Equal(t, served, old.lease.served.Load(), "and answered nothing under its lease")
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
	c := StartCluster(t, size, WithNodeConfig(func(i int, cfg *Config) {
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
	term := old.raft.CurrentTerm()

	cut := c.Index(old)
	for j := range size {
		if j != cut {
			link(cut, j, false)
		}
	}
	// No answers: the lease ends while the node may still think it leads.
	require.Eventually(t, func() bool {
		_, ok := old.lease.remaining(term, raft.ServerID(old.ID()))
		return !ok
	}, 5*time.Second, 5*time.Millisecond)
	served := old.lease.served.Load()

	var next *Node
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
	require.Equal(t, served, old.lease.served.Load(), "nothing answered under the lapsed lease")
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
	c := StartCluster(b, 3, WithLogStore(LogStoreMem), WithNodeConfig(func(_ int, cfg *Config) {
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
	rounds := leader.verifier.roundsRun.Load()
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
	b.ReportMetric(float64(leader.verifier.roundsRun.Load()-rounds)/float64(b.N), "rounds/read")
}
