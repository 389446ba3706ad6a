package server

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// limitListener closes, as soon as they are accepted, connections past
// maxTotal open ones, past maxPerHost from one remote host, or past rate
// new ones a second from one remote host, so that a client opening
// connections without end costs the node a file descriptor for an instant
// rather than memory for good, and one flooding it with TLS handshakes
// (each a key exchange and a signature for the node to compute) cannot
// take the CPU its other clients need. Connections that stay are bounded
// in time by the handshake timeouts (TLS and gRPC's preface).
type limitListener struct {
	net.Listener
	maxTotal, maxPerHost int
	rate                 float64          // new connections a second from one host, and the burst; 0 or less: any
	refused              *atomic.Uint64   // counted for tests and logs
	now                  func() time.Time // the clock of the rate

	mu      sync.Mutex
	total   int                // guarded by mu
	perHost map[string]int     // guarded by mu
	buckets map[string]*bucket // guarded by mu; hosts that connected in the last second or so
	pruned  time.Time          // guarded by mu; when buckets was last pruned
}

// bucket is one host's token bucket of new connections.
type bucket struct {
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

func newLimitListener(l net.Listener, maxTotal, maxPerHost, ratePerHost int) *limitListener {
	return &limitListener{Listener: l, maxTotal: maxTotal, maxPerHost: maxPerHost, rate: float64(ratePerHost),
		refused: new(atomic.Uint64), now: time.Now, perHost: map[string]int{}, buckets: map[string]*bucket{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := remoteHost(c)
		l.mu.Lock()
		over := l.total >= l.maxTotal || l.perHost[host] >= l.maxPerHost || !l.take(host)
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

// take spends one of host's tokens of new connections; it is false when
// there is none. The caller holds mu.
func (l *limitListener) take(host string) bool {
	if l.rate <= 0 {
		return true
	}
	now := l.now()
	if len(l.buckets) > 1024 && now.Sub(l.pruned) > time.Second {
		// A full bucket is the same as none: drop them, so that many
		// hosts connecting once each leave nothing behind.
		l.pruned = now
		for h, b := range l.buckets {
			if now.Sub(b.at).Seconds()*l.rate+b.tokens >= l.rate {
				delete(l.buckets, h)
			}
		}
	}
	b := l.buckets[host]
	if b == nil {
		b = &bucket{tokens: l.rate, at: now}
		l.buckets[host] = b
	}
	b.tokens = min(l.rate, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
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
