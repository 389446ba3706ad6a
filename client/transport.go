package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

// ErrUnavailable is wrapped by the error of a call that ran out of time
// while no node could serve it (no leader, nodes down, network cut). The
// same error also wraps the context's error and the last RPC error.
var ErrUnavailable = errors.New("cluster unavailable")

// Retry pacing: exponential from retryBase to retryMax, with jitter. The
// ceiling is well under a Raft election so a client notices a new leader
// soon after it is elected.
const (
	retryBase = 10 * time.Millisecond
	retryMax  = 400 * time.Millisecond
	// maxHintHops is how many leader hints in a row are followed without
	// pausing; more means the hints are stale and point in a circle.
	maxHintHops = 2
	// streamRate is the slowest data rate an attempt is given time for on
	// top of the attempt timeout.
	streamRate = 4 << 20 // bytes per second
)

// transport owns the connections to the nodes and knows which one is the
// leader. It is safe for concurrent use.
type transport struct {
	cfg *config

	mu    sync.Mutex // guards everything below
	conns map[string]*grpc.ClientConn
	// renewals are the connections session renewals go on, one per node
	// beside conns, dialled when first used: a keepalive never waits
	// behind the client's own traffic (megabytes of writes in one TCP
	// connection's buffers, HTTP/2 flow control), so a busy client does
	// not lose its session to its own load.
	renewals map[string]*grpc.ClientConn
	addrs    []string // every node address known, in the order they are tried
	next     int      // index into addrs of the next node to try without a leader
	leader   string   // API address of the node that served the last write, or ""
	closed   bool
}

func newTransport(cfg *config, addrs []string) (*transport, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no cluster addresses")
	}
	t := &transport{cfg: cfg, conns: make(map[string]*grpc.ClientConn), renewals: make(map[string]*grpc.ClientConn)}
	for _, a := range addrs {
		if a == "" {
			continue
		}
		if _, err := t.connLocked(a); err != nil {
			t.close()
			return nil, err
		}
	}
	if len(t.addrs) == 0 {
		return nil, errors.New("no cluster addresses")
	}
	return t, nil
}

// keepaliveTime is how long a connection with calls in flight may stay
// silent before the client pings the node, and how long it waits for the
// answer. Nodes accept pings this often (their keepalive policy).
const keepaliveTime = 10 * time.Second

// connLocked returns the connection to addr, creating it (and recording
// addr as known) the first time. grpc connects lazily, so this never blocks.
func (t *transport) connLocked(addr string) (*grpc.ClientConn, error) {
	if cc, ok := t.conns[addr]; ok {
		return cc, nil
	}
	cc, err := t.dialLocked(addr)
	if err != nil {
		return nil, err
	}
	t.conns[addr] = cc
	t.addrs = append(t.addrs, addr)
	return cc, nil
}

// renewalConnLocked returns the connection for session renewals to addr,
// made the first time.
func (t *transport) renewalConnLocked(addr string) (*grpc.ClientConn, error) {
	if cc, ok := t.renewals[addr]; ok {
		return cc, nil
	}
	if _, err := t.connLocked(addr); err != nil { // records addr as known
		return nil, err
	}
	cc, err := t.dialLocked(addr)
	if err != nil {
		return nil, err
	}
	t.renewals[addr] = cc
	return cc, nil
}

// dialLocked makes a new connection to addr.
func (t *transport) dialLocked(addr string) (*grpc.ClientConn, error) {
	if t.closed {
		return nil, errors.New("client closed")
	}
	dial := t.cfg.dialer
	authority := addr
	if _, ok := unixPath(addr); ok {
		authority = "localhost"
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, append(t.cfg.credentialOptions(),
		grpc.WithAuthority(authority),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx, addr) }),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
		// Pings find a connection that died without a reset (a node cut
		// off, a NAT that forgot it) while a stream waits on it.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTime}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)),
	)...)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	return cc, nil
}

// pick returns the address to try next: the leader when known, otherwise
// the known addresses in turn.
func (t *transport) pick() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.leader != "" {
		return t.leader
	}
	return t.addrs[t.next%len(t.addrs)]
}

func (t *transport) api(addr string, renewal bool) (pb.MemFSClient, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	get := t.connLocked
	if renewal {
		get = t.renewalConnLocked
	}
	cc, err := get(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewMemFSClient(cc), nil
}

// served records that addr answered a request that only a leader (or a
// node that forwards to it) answers. A node that forwarded names the
// leader (hint): later calls go to the leader directly once the client's
// connection to it is up, one hop instead of two. Until then, and for as
// long as the leader cannot be reached from here, they go to addr.
func (t *transport) served(addr string, hint []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.leader = addr
	if len(hint) == 0 || hint[0] == addr {
		return
	}
	cc, err := t.connLocked(hint[0])
	if err != nil {
		return
	}
	switch cc.GetState() {
	case connectivity.Ready:
		t.leader = hint[0]
	case connectivity.Idle:
		cc.Connect()
	}
}

// failed records that addr could not serve a request; hint is the leader
// address it named, if any. It reports whether the hint names a new node to
// try.
func (t *transport) failed(addr, hint string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if hint != "" && hint != addr {
		if _, err := t.connLocked(hint); err == nil {
			t.leader = hint
			return true
		}
	}
	if t.leader == addr || t.leader == "" {
		t.leader = ""
		if t.addrs[t.next%len(t.addrs)] == addr {
			t.next++
		}
	}
	return false
}

// learn adds the node addresses a status reply names and adopts its leader.
func (t *transport) learn(st *pb.StatusResponse) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range st.GetNodes() {
		if a := n.GetApiAddr(); a != "" {
			_, _ = t.connLocked(a)
		}
	}
	if a := st.GetLeaderApiAddr(); a != "" {
		if _, err := t.connLocked(a); err == nil {
			t.leader = a
		}
	}
}

func (t *transport) known() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.addrs)
}

func (t *transport) close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	var errs []error
	for _, cc := range t.conns {
		errs = append(errs, cc.Close())
	}
	for _, cc := range t.renewals {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// attemptFunc makes one attempt of an RPC against api (the node at addr).
// It returns the response trailer, which may name the leader.
type attemptFunc func(ctx context.Context, api pb.MemFSClient) (metadata.MD, error)

// callOpts tunes one call's retry loop.
type callOpts struct {
	op      string
	bytes   int           // data carried, to give the attempt time for it
	timeout time.Duration // attempt timeout; 0 means the configured one
	leader  bool          // a success means addr leads (writes, linearizable reads)
	renewal bool          // a session renewal: on the connections kept for them
}

// call runs fn against the leader (or the next node) until it succeeds, it
// fails in a way a retry cannot fix, or ctx is done. It returns how many
// attempts it made, so a caller can tell whether an earlier attempt may
// have been applied.
func (t *transport) call(ctx context.Context, o callOpts, fn attemptFunc) (int, error) {
	ctx, cancel := t.retryContext(ctx)
	defer cancel()
	var last error
	hops := 0
	for n := 1; ; n++ {
		addr := t.pick()
		md, err := t.attempt(ctx, addr, o, fn)
		if err == nil {
			if o.leader {
				t.served(addr, md.Get(pb.LeaderTrailer))
			}
			return n, nil
		}
		if ctx.Err() != nil {
			return n, unavailable(n, ctx.Err(), err)
		}
		if !retryable(err) {
			return n, refusal(err)
		}
		last = err
		hint := ""
		if v := md.Get(pb.LeaderTrailer); len(v) > 0 {
			hint = v[0]
		}
		if t.failed(addr, hint) && hops < maxHintHops {
			hops++
			continue
		}
		t.cfg.log.Debug("memfs: retrying", "op", o.op, "addr", addr, "attempt", n, "err", last)
		hops = 0
		select {
		case <-time.After(jitter(n)):
		case <-ctx.Done():
			return n, unavailable(n, ctx.Err(), last)
		}
	}
}

func unavailable(attempts int, cause, last error) error {
	return fmt.Errorf("%w after %d attempts: %w (last error: %w)", ErrUnavailable, attempts, cause, last)
}

func (t *transport) attempt(ctx context.Context, addr string, o callOpts, fn attemptFunc) (metadata.MD, error) {
	api, err := t.api(addr, o.renewal)
	if err != nil {
		return nil, err
	}
	d := o.timeout
	if d == 0 {
		d = t.cfg.attemptTimeout + time.Duration(o.bytes)*time.Second/streamRate
	}
	actx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return fn(actx, api)
}

// retryContext bounds ctx by the retry timeout unless it has a deadline.
func (t *transport) retryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, t.cfg.retryTimeout)
}

// retryable tells whether an RPC error may go away on another attempt,
// possibly at another node. Everything else (a version mismatch, a
// malformed request, a message over the size limit) fails the call.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return true
	}
	return false
}

// refusal gives a refused call the errno a file system answers with
// (EACCES: the caller's role does not allow it; EPERM: the caller is not
// authenticated), keeping the gRPC status for status.Code.
func refusal(err error) error {
	switch status.Code(err) {
	case codes.PermissionDenied:
		return fmt.Errorf("%w: %w", syscall.EACCES, err)
	case codes.Unauthenticated:
		return fmt.Errorf("%w: %w", syscall.EPERM, err)
	}
	return err
}

// jitter returns the pause before attempt n+1: exponential, capped, with
// the upper half randomised so that many clients do not retry in step.
func jitter(n int) time.Duration {
	d := retryMax
	if n < 16 {
		d = min(retryBase<<n, retryMax)
	}
	return d/2 + rand.N(d/2+1)
}
