package faultnet

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Transport wraps a node's raft.Transport (normally raft's TCP
// NetworkTransport) and applies the Net's faults to every RPC this node
// sends: the request may be lost, delayed or later delivered again, and the
// reply may be lost or delayed. Because the faults of both directions are
// applied by the sender, a one-way partition a→b loses a's requests to b and
// b's replies to a, exactly as a network that drops one direction would.
//
// Inbound RPCs are not touched here: they were faulted by their sender's
// Transport.
type Transport struct {
	net   *Net
	self  string
	inner raft.Transport

	done      chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	closed    bool           // guarded by mu
	wg        sync.WaitGroup // duplicate deliveries in flight; Add under mu
}

var (
	_ raft.Transport   = (*Transport)(nil)
	_ raft.WithClose   = (*Transport)(nil)
	_ raft.WithPreVote = (*Transport)(nil)
)

// WrapTransport returns inner with the faults of n applied to messages from
// self (this node's raft server ID).
func WrapTransport(n *Net, self raft.ServerID, inner raft.Transport) *Transport {
	return &Transport{net: n, self: string(self), inner: inner, done: make(chan struct{})}
}

// Inner returns the wrapped transport.
func (t *Transport) Inner() raft.Transport { return t.inner }

// call runs one RPC to `to` through the faults. send performs it; resend,
// if not nil, performs it again for a duplicate delivery.
func (t *Transport) call(to string, send func() error, resend func()) error {
	fwd := t.net.decide(t.self, to)
	if fwd.blocked {
		// Like a connect timeout, but short: Raft backs off on its own.
		sleep(t.net.duration(5*time.Millisecond, 40*time.Millisecond), t.done)
		return ErrLinkDown
	}
	if !sleep(fwd.delay, t.done) {
		return raft.ErrTransportShutdown
	}
	if fwd.drop {
		return ErrDropped
	}
	err := send()
	if fwd.dup && resend != nil {
		t.duplicate(fwd.dupDelay, resend)
	}
	back := t.net.decide(to, t.self)
	switch {
	case back.blocked:
		return ErrLinkDown
	case back.drop:
		return ErrDropped
	}
	if !sleep(back.delay, t.done) {
		return raft.ErrTransportShutdown
	}
	return err
}

// duplicate delivers a request again after d, unless the transport closes
// first.
func (t *Transport) duplicate(d time.Duration, resend func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if sleep(d, t.done) {
			resend()
		}
	}()
}

// Consumer implements raft.Transport.
func (t *Transport) Consumer() <-chan raft.RPC { return t.inner.Consumer() }

// LocalAddr implements raft.Transport.
func (t *Transport) LocalAddr() raft.ServerAddress { return t.inner.LocalAddr() }

// ErrImpostor is returned for an RPC answered by a node other than the one
// it was sent to: another cluster's node listening on a reused address. It
// would let a leader count a stranger's vote or acknowledgement, so it is
// refused and counted (Stats.Impostors), and tests fail on it.
var ErrImpostor = errors.New("faultnet: RPC answered by another node")

// checkResponder refuses a reply whose header names another server.
func (t *Transport) checkResponder(id raft.ServerID, h raft.RPCHeader, err error) error {
	if err == nil && len(h.ID) > 0 && string(h.ID) != string(id) {
		t.net.Stats.Impostors.Add(1)
		t.net.Logf("faultnet: %s's RPC to %s was answered by %s", t.self, id, h.ID)
		return fmt.Errorf("%w: sent to %s, answered by %s", ErrImpostor, id, h.ID)
	}
	return err
}

// AppendEntries implements raft.Transport.
func (t *Transport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	return t.call(string(id),
		func() error {
			return t.checkResponder(id, resp.RPCHeader, t.inner.AppendEntries(id, target, args, resp))
		},
		func() {
			var r raft.AppendEntriesResponse
			_ = t.inner.AppendEntries(id, target, args, &r)
		})
}

// RequestVote implements raft.Transport.
func (t *Transport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return t.call(string(id),
		func() error {
			return t.checkResponder(id, resp.RPCHeader, t.inner.RequestVote(id, target, args, resp))
		},
		func() {
			var r raft.RequestVoteResponse
			_ = t.inner.RequestVote(id, target, args, &r)
		})
}

// RequestPreVote implements raft.WithPreVote when the wrapped transport
// does.
func (t *Transport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	pv, ok := t.inner.(raft.WithPreVote)
	if !ok {
		return raft.ErrUnsupportedProtocol
	}
	return t.call(string(id),
		func() error {
			return t.checkResponder(id, resp.RPCHeader, pv.RequestPreVote(id, target, args, resp))
		},
		func() {
			var r raft.RequestPreVoteResponse
			_ = pv.RequestPreVote(id, target, args, &r)
		})
}

// InstallSnapshot implements raft.Transport. A snapshot is never
// duplicated: its data is a stream that can be read once.
func (t *Transport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	return t.call(string(id), func() error {
		t.net.Stats.Snapshots.Add(1)
		return t.checkResponder(id, resp.RPCHeader, t.inner.InstallSnapshot(id, target, args, resp, data))
	}, nil)
}

// TimeoutNow implements raft.Transport. It is never duplicated: a second
// TimeoutNow would start an election nobody asked for.
func (t *Transport) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return t.call(string(id), func() error {
		return t.checkResponder(id, resp.RPCHeader, t.inner.TimeoutNow(id, target, args, resp))
	}, nil)
}

// EncodePeer implements raft.Transport.
func (t *Transport) EncodePeer(id raft.ServerID, addr raft.ServerAddress) []byte {
	return t.inner.EncodePeer(id, addr)
}

// DecodePeer implements raft.Transport.
func (t *Transport) DecodePeer(b []byte) raft.ServerAddress { return t.inner.DecodePeer(b) }

// SetHeartbeatHandler implements raft.Transport.
func (t *Transport) SetHeartbeatHandler(cb func(rpc raft.RPC)) { t.inner.SetHeartbeatHandler(cb) }

// AppendEntriesPipeline implements raft.Transport. The pipeline is one TCP
// stream, so it is faulted like one: a lost or blocked message breaks it
// (Raft then falls back to single RPCs, which see every fault), and a
// delay holds back everything behind it.
func (t *Transport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	if !t.net.Connected(t.self, string(id)) || !t.net.Connected(string(id), t.self) {
		return nil, ErrLinkDown
	}
	p, err := t.inner.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return &pipeline{t: t, to: string(id), inner: p}, nil
}

type pipeline struct {
	t     *Transport
	to    string
	inner raft.AppendPipeline
}

func (p *pipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	fwd := p.t.net.decide(p.t.self, p.to)
	back := p.t.net.decide(p.to, p.t.self)
	switch {
	case fwd.blocked || back.blocked:
		return nil, ErrLinkDown
	case fwd.drop || back.drop:
		return nil, ErrDropped
	}
	if !sleep(fwd.delay+back.delay, p.t.done) {
		return nil, raft.ErrTransportShutdown
	}
	return p.inner.AppendEntries(args, resp)
}

func (p *pipeline) Consumer() <-chan raft.AppendFuture { return p.inner.Consumer() }
func (p *pipeline) Close() error                       { return p.inner.Close() }

// Close implements raft.WithClose: it stops pending delays and duplicates
// and closes the wrapped transport.
func (t *Transport) Close() error {
	var err error
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		close(t.done)
		t.wg.Wait()
		if c, ok := t.inner.(raft.WithClose); ok {
			err = c.Close()
		}
	})
	return err
}
