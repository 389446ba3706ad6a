package server

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// confirmLeadership returns once this node may take itself for the leader
// of term at a moment after the caller's read arrived: at once while it
// holds the read lease, else after a shared VerifyLeader round. The caller
// still waits until it has applied the commit index it read on arrival.
func (n *Node) confirmLeadership(ctx context.Context, term uint64) error {
	left, ok := n.lease.remaining(term, raft.ServerID(n.cfg.ID))
	if !ok {
		return n.verifier.verify(ctx)
	}
	n.lease.served.Add(1)
	if left < n.lease.dur/3 {
		// Heartbeats normally renew the lease long before this; a round
		// sends them at once when they fell behind.
		n.verifier.renew()
	}
	return nil
}

// verifier confirms leadership for linearizable reads, sharing one
// VerifyLeader round among every read that arrived before the round began.
// A round that started before a read arrived proves nothing about it, so
// such a read waits for the next round.
type verifier struct {
	raft *raft.Raft

	mu      sync.Mutex
	running bool         // guarded by mu
	waiting []chan error // reads for the next round; guarded by mu

	roundsRun atomic.Uint64 // VerifyLeader rounds run (tests count them)
	renewing  atomic.Bool   // a renewal round (renew) is under way
}

func (v *verifier) verify(ctx context.Context) error {
	ch := make(chan error, 1)
	v.mu.Lock()
	v.waiting = append(v.waiting, ch)
	if !v.running {
		v.running = true
		go v.rounds()
	}
	v.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// renew runs a round in the background unless one it started is still
// under way: a round makes Raft heartbeat every follower at once, and the
// answers extend the read lease.
func (v *verifier) renew() {
	if !v.renewing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer v.renewing.Store(false)
		_ = v.verify(context.Background()) // a failed round just renews nothing
	}()
}

func (v *verifier) rounds() {
	for {
		v.mu.Lock()
		group := v.waiting
		v.waiting = nil
		if len(group) == 0 {
			v.running = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		v.roundsRun.Add(1)
		err := verifyLeader(v.raft)
		for _, ch := range group {
			ch <- err
		}
	}
}

// verifyLeader runs one VerifyLeader round. Like an Apply future (see
// futureError), a verify future still queued when Raft shuts down is never
// answered, and rounds would then keep the raft.Raft alive forever; the
// verifier has no stop channel, so it polls Raft's state while it waits.
func verifyLeader(r *raft.Raft) error {
	f := r.VerifyLeader()
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			return err
		case <-tick.C:
			if r.State() != raft.Shutdown {
				continue
			}
			select {
			case err := <-errc:
				return err
			default:
				return raft.ErrRaftShutdown
			}
		}
	}
}

// leaderReady tracks whether this leader has applied an entry of its own
// term. Until it has, its commit index may lag entries an earlier leader
// committed, so it cannot serve a linearizable read.
type leaderReady struct {
	mu    sync.Mutex
	term  uint64        // term in which the ready entry applied; guarded by mu
	index uint64        // index of that entry; guarded by mu
	ch    chan struct{} // closed when term/index change; guarded by mu
}

func newLeaderReady() *leaderReady { return &leaderReady{ch: make(chan struct{})} }

func (l *leaderReady) set(term, index uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term < l.term {
		return
	}
	l.term, l.index = term, index
	close(l.ch)
	l.ch = make(chan struct{})
}

// wait returns the ready entry's index once the leader is ready in term.
func (l *leaderReady) wait(ctx context.Context, term uint64) (uint64, error) {
	for {
		l.mu.Lock()
		t, idx, ch := l.term, l.index, l.ch
		l.mu.Unlock()
		if t == term {
			return idx, nil
		}
		if t > term {
			return 0, raft.ErrLeadershipLost
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// readyIn reports whether the leader is ready in term.
func (l *leaderReady) readyIn(term uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term == term
}

// The read lease lets the leader answer linearizable reads without a
// VerifyLeader round each. It rests on a rule of hashicorp/raft v1.8.0
// (raft.go, requestVote and requestPreVote): a node that knows a leader
// refuses to vote for anyone else, unless the request carries the
// LeadershipTransfer flag. A follower forgets its leader only when its
// heartbeat timer fires (after a random 1-2x HeartbeatTimeout) and finds
// that the last successful AppendEntries from the leader (lastContact, set
// once the RPC has succeeded) is at least HeartbeatTimeout old; when it
// becomes a candidate, which has the same cause or a TimeoutNow; when it
// restarts; or when a newer leader's AppendEntries arrives, which needs an
// election first. ElectionTimeout paces candidates only, and a candidate
// still needs the votes; it does not shorten the bound.
//
// So a follower whose answer to an AppendEntries that the leader sent at
// monotonic time S was a success cannot vote for another candidate before
// S + HeartbeatTimeout on its own clock, and no other leader can be elected
// while a majority of voters cannot vote for it (the leader itself never
// votes while it leads). The leader holds the lease until the
// majority-th latest such S plus the lease (readLease.until). Assumptions:
//
//   - clocks are monotonic and their rates differ by at most
//     maxClockRateDrift; nothing about absolute time or synchronised
//     clocks is assumed;
//   - every voter runs with the same HeartbeatTimeout (or a longer one);
//   - a TimeoutNow is read by its target before its sender has lost and
//     regained leadership, or never (see below).
//
// Where hashicorp/raft or its use here would break the rule, this file
// mends it:
//
//   - Leadership transfer: the leader sends TimeoutNow, and the target's
//     flagged vote requests bypass the rule. leaseTransport drops the lease
//     for the rest of the term before the TimeoutNow leaves, whoever called
//     LeadershipTransfer. TimeoutNow carries no term, so a stale one could
//     start a flagged election under a later leader (tikv/raft-rs#234); the
//     receiving side refuses a TimeoutNow that does not come from the
//     leader it knows.
//   - Restart: a restarted follower has forgotten its leader and would vote
//     at once. A node that may have answered a leader before (it has Raft
//     state, or is ephemeral and rejoining) refuses votes for
//     HeartbeatTimeout after it starts.
//   - Heartbeats are handled off Raft's main goroutine, concurrently with
//     vote requests: a follower that has already lost the leader can answer
//     a heartbeat with success while it grants a vote it decided on just
//     before. So an answer backs the lease only if the same follower had
//     answered an earlier AppendEntries of the term that the leader sent
//     less than the window (leaseTiming) before this answer arrived: that
//     follower has known the leader without a break since then. After a
//     gap the lease waits for a second answer. (Not covered: both answers
//     falling inside one vote the follower is still writing to disk.)
//   - VerifyLeader counts the answer of an RPC that was in flight when the
//     round began, so a round's start time is not a safe anchor: the lease
//     takes the send time of each AppendEntries instead, which the
//     transport wrapper sees (heartbeats and single RPCs; pipelined
//     replication is not counted, which only shortens the lease).
//
// The leader checks, for every read, that it still leads in the read's
// term and has not sent a TimeoutNow in it, so the lease ends when the node
// steps down, its term changes or it hands leadership over.
const (
	// maxClockRateDrift bounds how much faster or slower than true time a
	// node's monotonic clock may run: 1%, against quartz's 0.01% and NTP's
	// slewing limit of 0.05%.
	maxClockRateDrift = 0.01
	// leaseFraction of the heartbeat timeout is the lease before the drift
	// margin: half, so that a follower configured with a heartbeat timeout
	// down to about half the leader's still keeps the lease safe.
	leaseFraction = 0.5
)

// leaseTiming returns the lease and the window within which a follower's
// answers count as unbroken contact. Both are measured on the leader's
// clock and must end before the follower's HeartbeatTimeout on its clock:
// d on one clock is at most d(1+rho)/(1-rho) < d(1+3rho) on the other, so
// the margin is 3 rho HeartbeatTimeout.
func leaseTiming(t RaftTuning) (lease, window time.Duration) {
	hb := float64(t.HeartbeatTimeout)
	margin := 3 * maxClockRateDrift * hb
	return time.Duration(leaseFraction*hb - margin), time.Duration(hb - margin)
}

// raftView is what the lease reads from Raft (a fake in tests).
type raftView interface {
	State() raft.RaftState
	CurrentTerm() uint64
	LeaderWithID() (raft.ServerAddress, raft.ServerID)
	latestConfiguration() (raft.Configuration, error)
}

// liveRaft is the raftView of a running raft.Raft.
type liveRaft struct{ *raft.Raft }

func (r liveRaft) latestConfiguration() (raft.Configuration, error) {
	f := r.GetConfiguration() // answered from an atomic copy, not the main loop
	return f.Configuration(), f.Error()
}

type viewRef struct{ v raftView }

// readLease tracks the followers' answers that back the lease, and the
// terms in which it was given up.
type readLease struct {
	enabled   bool          // serve reads under the lease (Config.DisableReadLease unset)
	dur       time.Duration // from the backing send time
	window    time.Duration // unbroken contact: see acked
	holdUntil time.Time     // refuse votes until then (restart)
	now       func() time.Time
	view      atomic.Pointer[viewRef] // set once Raft runs

	served atomic.Uint64 // reads answered under the lease (tests count them)

	mu      sync.Mutex
	peers   map[raft.ServerID]*peerAcks // guarded by mu
	revoked uint64                      // no lease in this term or earlier; guarded by mu
}

// peerAcks is one follower's successful AppendEntries in one term.
type peerAcks struct {
	term   uint64
	sent   time.Time // send time of the latest answered with success
	backed time.Time // send time of the latest that backs the lease
}

// newReadLease starts the lease of a node. hasState says whether the node
// starts on existing Raft state.
func newReadLease(cfg Config, hasState bool) *readLease {
	l := &readLease{enabled: !cfg.DisableReadLease, now: time.Now, peers: map[raft.ServerID]*peerAcks{}}
	l.dur, l.window = leaseTiming(cfg.Raft)
	// A node with state, or an ephemeral one rejoining under its old id,
	// may have backed some leader's lease before it went down; a new
	// cluster's first node and a fresh disk have not.
	if hasState || (cfg.Ephemeral && !cfg.Bootstrap) {
		l.holdUntil = l.now().Add(cfg.Raft.HeartbeatTimeout)
	}
	return l
}

// attach gives the lease the node's Raft once it runs.
func (l *readLease) attach(v raftView) { l.view.Store(&viewRef{v}) }

// remaining returns how long the lease of term still runs when this node
// (self) leads in term; ok is false when it holds none. The clock is read
// first: every check after it holds at that moment.
func (l *readLease) remaining(term uint64, self raft.ServerID) (left time.Duration, ok bool) {
	ref := l.view.Load()
	if !l.enabled || ref == nil {
		return 0, false
	}
	now := l.now()
	if !leadsIn(ref.v, term) {
		return 0, false
	}
	conf, err := ref.v.latestConfiguration()
	if err != nil {
		return 0, false
	}
	left = l.until(term, conf, self).Sub(now)
	return left, left > 0
}

// leadsIn reports whether the node is leader in term. A node leads at
// most once per term, so Leader seen between two reads of the same term
// was Leader in that term.
func leadsIn(v raftView, term uint64) bool {
	before := v.CurrentTerm()
	state := v.State()
	return state == raft.Leader && before == term && v.CurrentTerm() == term
}

// until returns when the lease of term ends (the zero time: it does not
// exist). Voters of the latest configuration count; the leader counts for
// itself, the others by their backing answers.
func (l *readLease) until(term uint64, conf raft.Configuration, self raft.ServerID) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term <= l.revoked {
		return time.Time{}
	}
	var acks []time.Time
	voters, need := 0, 0
	for _, s := range conf.Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if s.ID == self {
			need--
			continue
		}
		if p := l.peers[s.ID]; p != nil && p.term == term && !p.backed.IsZero() {
			acks = append(acks, p.backed)
		}
	}
	need += voters/2 + 1
	switch {
	case voters == 0 || need > len(acks):
		return time.Time{}
	case need <= 0:
		return l.now().Add(l.dur) // a single voter: no one else can be elected
	}
	slices.SortFunc(acks, func(a, b time.Time) int { return b.Compare(a) })
	return acks[need-1].Add(l.dur)
}

// lastSent returns the send time of the latest AppendEntries to id in term
// answered with success so far (zero if none).
func (l *readLease) lastSent(id raft.ServerID, term uint64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.peers[id]; p != nil && p.term == term {
		return p.sent
	}
	return time.Time{}
}

// acked records that id answered an AppendEntries of term, sent at sent,
// with success at done. prev is lastSent from before it was sent: if that
// earlier answer was sent less than window before done, id has known this
// leader without a break, and the answer backs the lease.
func (l *readLease) acked(id raft.ServerID, term uint64, prev, sent, done time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.peers[id]
	if p == nil {
		p = &peerAcks{}
		l.peers[id] = p
	}
	switch {
	case term < p.term:
		return // an RPC of an earlier term answered late
	case term > p.term:
		*p = peerAcks{term: term}
	}
	if sent.After(p.sent) {
		p.sent = sent
	}
	if !prev.IsZero() && done.Sub(prev) < l.window && sent.After(p.backed) {
		p.backed = sent
	}
}

// revoke gives the lease up for the current term and every earlier one.
func (l *readLease) revoke() {
	ref := l.view.Load()
	if ref == nil {
		return // Raft has not run yet: it cannot be transferring
	}
	term := ref.v.CurrentTerm()
	l.mu.Lock()
	l.revoked = max(l.revoked, term)
	l.mu.Unlock()
}

// fromLeader reports whether id is the leader this node knows.
func (l *readLease) fromLeader(id []byte) bool {
	ref := l.view.Load()
	if ref == nil || len(id) == 0 {
		return false
	}
	_, leader := ref.v.LeaderWithID()
	return leader != "" && string(leader) == string(id)
}

// holdingVotes reports whether the node still refuses votes after its start.
func (l *readLease) holdingVotes() bool {
	return !l.holdUntil.IsZero() && l.now().Before(l.holdUntil)
}

var errStrayTimeoutNow = errors.New("TimeoutNow refused: it does not come from the leader this node follows")

// leaseTransport wraps the node's transport (the vote gate) for the lease:
// it times the AppendEntries the node sends and drops the lease before a
// TimeoutNow leaves; on the receiving side it refuses votes while the node
// holds them back after a restart, and TimeoutNow from anyone but the
// known leader. It does this whether or not the node itself serves reads
// under a lease, since it protects the other nodes' leases.
type leaseTransport struct {
	*voteGate
	lease *readLease

	out   chan raft.RPC
	stop  chan struct{}
	start sync.Once
	halt  sync.Once
}

func (l *readLease) transport(g *voteGate) *leaseTransport {
	return &leaseTransport{voteGate: g, lease: l, out: make(chan raft.RPC), stop: make(chan struct{})}
}

// AppendEntries times the RPC and records a success for the lease.
func (t *leaseTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	prev := t.lease.lastSent(id, args.Term)
	sent := t.lease.now()
	err := t.voteGate.AppendEntries(id, target, args, resp)
	if err == nil && resp.Success && resp.Term == args.Term {
		t.lease.acked(id, args.Term, prev, sent, t.lease.now())
	}
	return err
}

// TimeoutNow gives the lease up before the target can start its flagged
// election: from then on the other voters may elect it at once.
func (t *leaseTransport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	t.lease.revoke()
	return t.voteGate.TimeoutNow(id, target, args, resp)
}

// Consumer is what Raft reads incoming RPCs from.
func (t *leaseTransport) Consumer() <-chan raft.RPC {
	t.start.Do(func() { go t.run(t.voteGate.Consumer()) })
	return t.out
}

// run passes RPCs on to Raft until the wrapper closes or the gate halts
// (the node's teardown halts it even when Raft never ran to close us).
func (t *leaseTransport) run(in <-chan raft.RPC) {
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-t.stop:
			return
		case <-t.voteGate.stop:
			return
		}
		if t.refuse(rpc) {
			continue
		}
		select {
		case t.out <- rpc:
		case <-t.stop:
			return
		case <-t.voteGate.stop:
			return
		}
	}
}

// refuse answers the RPCs the lease keeps from Raft.
func (t *leaseTransport) refuse(rpc raft.RPC) bool {
	switch req := rpc.Command.(type) {
	case *raft.RequestVoteRequest, *raft.RequestPreVoteRequest:
		if t.lease.holdingVotes() {
			return t.voteGate.refuse(rpc)
		}
	case *raft.TimeoutNowRequest:
		if !t.lease.fromLeader(req.ID) {
			rpc.Respond(nil, errStrayTimeoutNow)
			return true
		}
	}
	return false
}

// Close stops the wrapper and closes the gate and the transport under it.
func (t *leaseTransport) Close() error {
	t.halt.Do(func() { close(t.stop) })
	return t.voteGate.Close()
}
