package tlsconf

import (
	"context"
	"crypto/tls"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// crypto/tls hands each record it seals (at most 16 KiB of plaintext) to
// the connection under it with a write of its own, so a stream of data
// costs a system call per 16 KiB where plaintext gRPC makes one per
// buffer it flushes. The two connections below put one tls.Conn.Write's
// records back together: a recordConn under the tls.Conn collects them
// while a Coalesced above it has a Write in progress, and the Coalesced
// sends them with one call at the end of that Write.

// flushAt bounds what one Write collects before sending it, so larger
// Writes go out in pieces of about this size. It is above 256 KiB and
// the records' overhead: gRPC's write buffer (internal/grpcopts) and
// raft's transport buffer are that size, and each of their flushes goes
// out with one call. A connection holds a buffer only during a Write.
const flushAt = 512 << 10

var recordBufs = sync.Pool{New: func() any { b := make([]byte, 0, flushAt+2*(16<<10)); return &b }}

// recordConn sits under a tls.Conn. Outside a Coalesced Write it passes
// every write straight through (the handshake, alerts, replies a Read
// sends); inside one it collects them.
type recordConn struct {
	net.Conn
	mu        sync.Mutex
	buffering bool
	buf       *[]byte // from recordBufs while buffering
	err       error   // the first failed write: the TLS stream is broken from there on
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.buffering {
		n, err := c.Conn.Write(p)
		if err != nil {
			c.err = err
		}
		return n, err
	}
	*c.buf = append(*c.buf, p...)
	if len(*c.buf) >= flushAt {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (c *recordConn) begin() {
	c.mu.Lock()
	c.buffering = true
	if c.buf == nil {
		c.buf = recordBufs.Get().(*[]byte)
	}
	c.mu.Unlock()
}

// end sends what was collected and stops collecting.
func (c *recordConn) end() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buffering = false
	err := c.flushLocked()
	if c.buf != nil {
		*c.buf = (*c.buf)[:0]
		recordBufs.Put(c.buf)
		c.buf = nil
	}
	return err
}

func (c *recordConn) flushLocked() error {
	if c.err != nil {
		return c.err
	}
	if c.buf == nil || len(*c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(*c.buf)
	*c.buf = (*c.buf)[:0]
	if err != nil {
		// Part of a record may have gone out: nothing after it can
		// be read, as crypto/tls treats a failed write.
		c.err = err
	}
	return err
}

// Coalesced is a TLS connection (a *tls.Conn, or gRPC's wrapper of one)
// whose Writes reach the network with one system call for all their
// records. Its handshake must be complete before its first Write: a
// handshake inside a collecting Write would wait for an answer to
// messages still held back.
type Coalesced struct {
	net.Conn
	rc *recordConn
	mu sync.Mutex // one Write at a time collects; tls.Conn serializes them anyway
}

func (c *Coalesced) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rc.begin()
	n, err := c.Conn.Write(p)
	if ferr := c.rc.end(); ferr != nil && err == nil {
		// How much reached the peer is unknown; the stream is broken.
		return 0, ferr
	}
	return n, err
}

// Unwrap returns the TLS connection.
func (c *Coalesced) Unwrap() net.Conn { return c.Conn }

// Client is tls.Client whose writes are coalesced (see Coalesced). The
// caller completes the handshake (tls.Conn.HandshakeContext) before
// writing.
func Client(conn net.Conn, cfg *tls.Config) (*tls.Conn, *Coalesced) {
	rc := &recordConn{Conn: conn}
	tc := tls.Client(rc, cfg)
	return tc, &Coalesced{Conn: tc, rc: rc}
}

// Server is tls.Server whose writes are coalesced, as Client.
func Server(conn net.Conn, cfg *tls.Config) (*tls.Conn, *Coalesced) {
	rc := &recordConn{Conn: conn}
	tc := tls.Server(rc, cfg)
	return tc, &Coalesced{Conn: tc, rc: rc}
}

// NewCredentials is credentials.NewTLS whose connections coalesce their
// writes: one system call for each buffer gRPC flushes, as in plaintext.
func NewCredentials(cfg *tls.Config) credentials.TransportCredentials {
	return coalescing{credentials.NewTLS(cfg)}
}

type coalescing struct {
	credentials.TransportCredentials
}

func (c coalescing) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	rc := &recordConn{Conn: raw}
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, rc)
	if err != nil {
		return nil, nil, err
	}
	return &Coalesced{Conn: conn, rc: rc}, info, nil
}

func (c coalescing) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	rc := &recordConn{Conn: raw}
	conn, info, err := c.TransportCredentials.ServerHandshake(rc)
	if err != nil {
		return nil, nil, err
	}
	return &Coalesced{Conn: conn, rc: rc}, info, nil
}

func (c coalescing) Clone() credentials.TransportCredentials {
	return coalescing{c.TransportCredentials.Clone()}
}
