package server

import (
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
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
