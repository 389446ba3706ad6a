package server

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/memoryfs/memfs/internal/tlsconf"
)

// tlsStream is the Raft transport's stream layer over TLS 1.3: it accepts
// only node certificates of the cluster's CA and presents the node's own,
// both read from src at each handshake (so a reload rotates them).
type tlsStream struct {
	inner   raft.StreamLayer
	server  *tls.Config
	client  *tls.Config
	timeout time.Duration // of a server side handshake (Limits.HandshakeTimeout)
	log     *slog.Logger
}

func newTLSStream(inner raft.StreamLayer, src *tlsconf.Source, timeout time.Duration, log *slog.Logger) *tlsStream {
	return &tlsStream{inner: inner, server: src.PeerServerConfig(), client: src.PeerClientConfig(), timeout: timeout, log: log}
}

// Accept returns connections whose handshake runs on their first read or
// write, in the goroutine raft gives each connection, so a slow or hostile
// peer cannot hold up the accept loop.
func (s *tlsStream) Accept() (net.Conn, error) {
	c, err := s.inner.Accept()
	if err != nil {
		return nil, err
	}
	tc, co := tlsconf.Server(c, s.server)
	return &handshakeConn{Conn: co, tls: tc, timeout: s.timeout, log: s.log}, nil
}

func (s *tlsStream) Close() error   { return s.inner.Close() }
func (s *tlsStream) Addr() net.Addr { return s.inner.Addr() }

func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	start := time.Now()
	c, err := s.inner.Dial(address, timeout)
	if err != nil {
		return nil, err
	}
	tc, co := tlsconf.Client(c, s.client)
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout-time.Since(start), time.Second))
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return co, nil
}

// handshakeConn completes the server side handshake under a deadline
// before the first read or write.
type handshakeConn struct {
	net.Conn // over tls, coalescing its writes
	tls      *tls.Conn
	timeout  time.Duration
	log      *slog.Logger
	once     sync.Once
	err      error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		if c.err = c.tls.HandshakeContext(ctx); c.err != nil {
			// Debug: anyone who reaches the port can cause this line.
			c.log.Debug("raft connection refused", "remote", c.RemoteAddr().String(), "err", c.err)
			_ = c.tls.Close()
		}
	})
	return c.err
}

func (c *handshakeConn) Read(p []byte) (int, error) {
	if err := c.handshake(); err != nil {
		// EOF: raft logs anything else as an error, and whoever reaches
		// the port could fill the log with them.
		return 0, io.EOF
	}
	return c.Conn.Read(p)
}

func (c *handshakeConn) Write(p []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}
