package client

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// seqTracker hands out the sequence numbers of commands and computes the
// ack each command carries: the lowest sequence number whose reply the
// client still waits for. The state machine may forget the results of
// every command below ack, so a number must stay "in flight" until its
// caller has stopped retrying it.
type seqTracker struct {
	mu       sync.Mutex
	next     uint64 // the next number to hand out; numbering starts at 1
	low      uint64 // lowest number in flight, or next when none is
	inflight map[uint64]struct{}
}

func newSeqTracker() *seqTracker {
	return &seqTracker{next: 1, low: 1, inflight: make(map[uint64]struct{})}
}

func (s *seqTracker) begin() (seq, ack uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq = s.next
	s.next++
	if len(s.inflight) == 0 {
		s.low = seq
	}
	s.inflight[seq] = struct{}{}
	return seq, s.low
}

func (s *seqTracker) end(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, seq)
	if seq != s.low {
		return
	}
	// low only moves up, so this loop costs O(1) per number overall.
	for s.low < s.next {
		if _, ok := s.inflight[s.low]; ok {
			break
		}
		s.low++
	}
}

// session is one session the cluster granted this client.
type session struct {
	id    uint64
	lease time.Duration
}

// handleRef is what a client handle stands for: a handle the state machine
// issued within one session.
type handleRef struct {
	session uint64
	server  uint64
	append  bool // opened with O_APPEND: every write goes to the end
}

// handleTable maps the handles the client hands out to the state
// machine's. Client handles are never reused, so a handle of a session that
// expired can be told apart from any handle of the next session, whatever
// numbers the state machine picks.
type handleTable struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]handleRef
}

func (h *handleTable) add(r handleRef) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[uint64]handleRef)
	}
	h.next++
	h.m[h.next] = r
	return h.next
}

func (h *handleTable) get(handle uint64) (handleRef, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.m[handle]
	return r, ok
}

func (h *handleTable) remove(handle uint64) {
	h.mu.Lock()
	delete(h.m, handle)
	h.mu.Unlock()
}

// openSession asks the cluster for a new session.
func (k *core) openSession(ctx context.Context) (*session, error) {
	cmd := &pb.Command{Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{
		LeaseMs: k.cfg.lease.Milliseconds(),
		Client:  k.cfg.name,
	}}}
	res, _, err := k.send(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.GetErrno() != 0 {
		return nil, fmt.Errorf("open session: %w", syscall.Errno(res.GetErrno()))
	}
	if res.GetSession() == 0 {
		return nil, fmt.Errorf("open session: node granted session 0")
	}
	lease := k.cfg.lease
	if ms := res.GetLeaseMs(); ms > 0 {
		lease = time.Duration(ms) * time.Millisecond
	}
	return &session{id: res.GetSession(), lease: lease}, nil
}

// renew replaces the session old, which the cluster reported expired, by
// a new one. Concurrent callers that saw the same expiry open one session.
func (k *core) renew(ctx context.Context, old uint64) {
	k.sessMu.Lock()
	defer k.sessMu.Unlock()
	if cur := k.sess.Load(); cur == nil || cur.id != old {
		return
	}
	s, err := k.openSession(ctx)
	if err != nil {
		k.cfg.log.Warn("memfs: session expired and a new one could not be opened", "session", old, "err", err)
		return
	}
	k.sess.Store(s)
	k.cfg.log.Warn("memfs: session expired; opened a new one (handles of the old one are gone)",
		"old", old, "new", s.id)
}

// maxRenewals bounds the renewals on their way at once.
const maxRenewals = 4

// keepAlive renews the lease every lease/4 until ctx is done. Renewals do
// not wait for each other: one held up (a starved node, a stalled log
// store) does not delay the next, each gives up after half a lease, when
// the next ones are already on their way, and each goes on a connection
// of its own (transport.renewals). The node renews the session as of the
// moment the renewal reached the leader, however long the entry then took
// to form (pb.Entry.renew_first).
func (k *core) keepAlive(ctx context.Context) {
	defer close(k.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	inflight := make(chan struct{}, maxRenewals)
	for {
		s := k.sess.Load()
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.lease / 4):
		}
		select {
		case inflight <- struct{}{}:
		default:
			continue // enough are on their way already
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-inflight }()
			k.renewLease(ctx, s)
		}()
	}
}

// renewLease sends one KeepAliveCmd for session s, given half a lease.
func (k *core) renewLease(ctx context.Context, s *session) {
	cmd := &pb.Command{Op: &pb.Command_KeepAlive{KeepAlive: &pb.KeepAliveCmd{}}}
	actx, cancel := context.WithTimeout(ctx, s.lease/2)
	defer cancel()
	res, err := k.apply(actx, cmd, 0)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		k.cfg.log.Warn("memfs: session keepalive failed", "session", s.id, "err", err)
	case res.GetErrno() != 0 && res.GetErrno() != uint32(syscall.ESTALE):
		k.cfg.log.Warn("memfs: session keepalive refused", "session", s.id, "errno", syscall.Errno(res.GetErrno()))
	}
}
