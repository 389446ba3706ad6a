package server

import (
	"net"
	"sync"
	"sync/atomic"
)

// limitListener closes, as soon as they are accepted, connections past
// maxTotal open ones or past maxPerHost from one remote host, so that a
// client opening connections without end costs the node a file descriptor
// for an instant rather than memory for good. Connections that stay are
// bounded in time by the handshake timeouts (TLS and gRPC's preface).
type limitListener struct {
	net.Listener
	maxTotal, maxPerHost int
	refused              *atomic.Uint64 // counted for tests and logs

	mu      sync.Mutex
	total   int            // guarded by mu
	perHost map[string]int // guarded by mu
}

func newLimitListener(l net.Listener, maxTotal, maxPerHost int) *limitListener {
	return &limitListener{Listener: l, maxTotal: maxTotal, maxPerHost: maxPerHost,
		refused: new(atomic.Uint64), perHost: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := remoteHost(c)
		l.mu.Lock()
		over := l.total >= l.maxTotal || l.perHost[host] >= l.maxPerHost
		if !over {
			l.total++
			l.perHost[host]++
		}
		l.mu.Unlock()
		if over {
			l.refused.Add(1)
			_ = c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(host) }}, nil
	}
}

func (l *limitListener) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.perHost[host]--; l.perHost[host] <= 0 {
		delete(l.perHost, host)
	}
}

func remoteHost(c net.Conn) string {
	a := c.RemoteAddr()
	if a == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
