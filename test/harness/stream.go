package harness

import (
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's TCP stream layer plus one thing: Close closes every
// connection it accepted or dialled, as the kernel does for a process that
// dies.
//
// raft.NetworkTransport.Close only closes the listener. Its pooled outbound
// connections stay open, and each inbound connection keeps a goroutine
// blocked reading it (with 256 KiB of buffers) until the peer closes it.
// Between crashed nodes nobody ever does: the goroutines reference the
// transport, whose heartbeat handler references the raft.Raft, its FSM with
// every file's data, and its log cache. A soak crashing and restarting
// nodes for an hour kept every incarnation alive that way (about 1 GB a
// minute) until the machine ran out of memory.
type streamLayer struct {
	lis *net.TCPListener

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // guarded by mu
	closed bool                  // guarded by mu
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func listenStream(bind string) (*streamLayer, error) {
	l, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	return &streamLayer{lis: l.(*net.TCPListener), conns: map[net.Conn]struct{}{}}, nil
}

// track records c so Close can close it; it closes c at once when the
// layer is already closed.
func (s *streamLayer) track(c net.Conn) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	t := &trackedConn{Conn: c, s: s}
	s.conns[t] = struct{}{}
	return t, nil
}

func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.lis.Accept()
	if err != nil {
		return nil, err
	}
	return s.track(c)
}

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	return s.track(c)
}

func (s *streamLayer) Addr() net.Addr { return s.lis.Addr() }

// Close closes the listener and every open connection.
func (s *streamLayer) Close() error {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = map[net.Conn]struct{}{}
	s.mu.Unlock()
	for c := range conns {
		_ = c.(*trackedConn).Conn.Close()
	}
	return s.lis.Close()
}

// trackedConn forgets itself when closed, so a long-lived layer does not
// accumulate dead connections.
type trackedConn struct {
	net.Conn
	s    *streamLayer
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}
