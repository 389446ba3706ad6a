package server

import (
	"context"
	"errors"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/memoryfs/memfs/internal/grpcopts"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
)

// forwardedKey marks a request a follower forwarded, so the receiver never
// forwards it again (two nodes that each think the other leads would
// otherwise bounce it between them).
const forwardedKey = "memfs-forwarded"

// peers keeps one gRPC connection per member API address, for forwarding
// to the leader and for status fan-out.
type peers struct {
	dial   func(context.Context, string) (net.Conn, error) // nil: plain TCP
	creds  credentials.TransportCredentials                // TLS between nodes, or insecure
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn // guarded by mu
	closed bool                        // guarded by mu
}

func newPeers(dial func(context.Context, string) (net.Conn, error), src *tlsconf.Source) *peers {
	creds := insecure.NewCredentials()
	if src != nil {
		creds = tlsconf.NewCredentials(src.PeerClientConfig())
	}
	return &peers{dial: dial, creds: creds, conns: map[string]*grpc.ClientConn{}}
}

var errPeersClosed = errors.New("node is shutting down")

func (p *peers) client(addr string) (pb.MemFSClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errPeersClosed
	}
	if c, ok := p.conns[addr]; ok {
		return pb.NewMemFSClient(c), nil
	}
	opts := append(grpcopts.Client(p.creds.Info().SecurityProtocol == "tls"),
		grpc.WithTransportCredentials(p.creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsg)))
	if p.dial != nil {
		opts = append(opts, grpc.WithContextDialer(p.dial))
	}
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	p.conns[addr] = c
	return pb.NewMemFSClient(c), nil
}

func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// isForwarded reports whether the incoming request came from a follower.
func isForwarded(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(forwardedKey)) > 0
}

// forwardContext marks an outgoing request as forwarded.
func forwardContext(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, forwardedKey, "1")
}
